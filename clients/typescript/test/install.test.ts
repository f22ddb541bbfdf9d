// The package as another project gets it: the one install command of
// docs/typescript.md, run in an empty directory, then the README's
// TypeScript example, as it is written, against a running capstan dev.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { fenced, repoRoot, startDev, type Dev } from "./capstan.js";

const run = promisify(execFile);
const clientDir = fileURLToPath(new URL("../../", import.meta.url));

let dev: Dev;
let project: string;

before(async () => {
  dev = await startDev();
  project = mkdtempSync(join(tmpdir(), "capstan-install-"));
});

after(async () => {
  await dev?.stop();
  if (project !== undefined) rmSync(project, { recursive: true, force: true });
});

test("the documented install command installs the package into an empty project, and the README's example runs", async () => {
  const docs = fenced(join(repoRoot, "docs", "typescript.md"), "sh").join("\n");
  const line = docs.split("\n").find((l) => l.startsWith("npm install --install-links "));
  assert.ok(line !== undefined, "docs/typescript.md has no install command");
  const args = line.replace("/path/to/capstan/clients/typescript", clientDir).split(/\s+/).slice(1);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "a-project", version: "1.0.0", private: true, type: "module" }));
  const install = await run("npm", [...args, "--no-audit", "--no-fund"], { cwd: project, maxBuffer: 16 << 20 });
  assert.doesNotMatch(install.stderr, /EBADENGINE/, `npm warned of an engine:\n${install.stderr}`);
  const installed = join(project, "node_modules", "@capstan-dev", "client");
  for (const f of ["package.json", "README.md", "LICENSE", "dist/src/index.js", "dist/src/index.d.ts", "dist/src/ai.js"]) {
    assert.ok(existsSync(join(installed, f)), `${f} is not in the installed package`);
  }
  // The source maps resolve within the package.
  const map = JSON.parse(readFileSync(join(installed, "dist/src/client.js.map"), "utf8")) as { sources: string[] };
  for (const s of map.sources) assert.ok(existsSync(join(installed, "dist/src", s)), `the source map names ${s}, not in the package`);

  const [example] = fenced(join(repoRoot, "README.md"), "ts");
  assert.ok(example !== undefined, "the README has no TypeScript example");
  writeFileSync(join(project, "example.mjs"), example);
  const out = await run("node", ["example.mjs"], { cwd: project, env: { ...process.env, CAPSTAN_NATS_URL: dev.url }, timeout: 60_000 });
  assert.match(out.stdout, /status: 'completed'/);
  assert.match(out.stdout, /hello: 'world'/);
});
