// Every TypeScript example of the README, docs/ and this package's README
// type-checks against the package as a project imports it (its name and
// exports, the AI SDK), each block a module of its own; the names a block
// uses from the text around it (a client, an id, a model) are declared for it.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { test } from "node:test";
import { fenced, repoRoot } from "./capstan.js";

const run = promisify(execFile);
const clientDir = fileURLToPath(new URL("../../", import.meta.url));

/** What a block may use without declaring it, as the text around it says. */
const context: Record<string, string> = {
  capstan: "declare const capstan: Client;",
  alice: "declare const alice: Client;",
  carol: "declare const carol: Client;",
  id: "declare const id: string;",
  signal: "declare const signal: AbortSignal;",
  model: 'declare const model: import("ai").LanguageModel;',
  progressText: 'import { progressText } from "@capstan-dev/client";',
  connect: 'import { connect } from "@capstan-dev/client";',
  EnvelopeError: 'import type { EnvelopeError } from "@capstan-dev/client";',
  ApprovalRef: 'import type { ApprovalRef } from "@capstan-dev/client";',
};

test("every TypeScript example of the README and docs type-checks", async () => {
  const pages = [join(repoRoot, "README.md"), join(clientDir, "README.md"), ...readdirSync(join(repoRoot, "docs")).filter((f) => f.endsWith(".md")).map((f) => join(repoRoot, "docs", f))];
  const dir = join(clientDir, "dist", "docs-check");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  let n = 0;
  for (const page of pages) {
    for (const block of fenced(page, "ts")) {
      const prelude = Object.entries(context)
        .filter(([name]) => new RegExp(`\\b${name}\\b`).test(block) && !new RegExp(`(const|let)\\s+${name}\\b|import\\s*(type\\s*)?\\{[^}]*\\b${name}\\b[^}]*\\}`).test(block))
        .map(([, decl]) => decl);
      const needsClient = prelude.some((d) => d.includes(": Client;"));
      const head = [needsClient ? 'import type { Client } from "@capstan-dev/client";' : "", ...prelude].join("\n");
      writeFileSync(join(dir, `block${n}.ts`), `// ${page}\n${head}\n${block}\nexport {};\n`);
      n++;
    }
  }
  assert.ok(n >= 8, `only ${n} TypeScript blocks found`);
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { target: "ES2022", lib: ["ES2023", "DOM"], module: "NodeNext", moduleResolution: "NodeNext", types: ["node"], strict: true, noEmit: true, skipLibCheck: true },
      include: ["*.ts"],
    }),
  );
  try {
    await run(join(clientDir, "node_modules", ".bin", "tsc"), ["-p", dir], { cwd: dir, maxBuffer: 16 << 20 });
  } catch (err) {
    const e = err as { stdout?: string };
    assert.fail(`the examples do not type-check:\n${e.stdout ?? String(err)}`);
  }
});
