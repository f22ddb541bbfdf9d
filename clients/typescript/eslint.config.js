// Lint: typescript-eslint's strict, type-checked rules on the sources, the
// tests, the example and the benchmark.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", "eslint.config.js"] },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      "@typescript-eslint/restrict-template-expressions": ["error", { allowNumber: true, allowBoolean: true }],
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      // node:test's describe and test return promises the runner awaits.
      "@typescript-eslint/no-floating-promises": [
        "error",
        { allowForKnownSafeCalls: [{ from: "package", name: ["describe", "test", "it", "suite"], package: "node:test" }] },
      ],
    },
  },
  {
    // Tests guard what the assertions already narrowed, and hooks clean up after a failed setup.
    files: ["test/**/*.ts"],
    rules: { "@typescript-eslint/no-unnecessary-condition": "off" },
  },
);
