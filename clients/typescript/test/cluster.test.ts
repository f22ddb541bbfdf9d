// The client on a cluster where a replica behind its stream's leader answers
// direct gets: a node whose reads of the executions bucket, then of the
// envelopes bucket, are answered about half the time by a copy that holds
// none of the writes. The cluster is Go's test cluster, run as a helper
// process (executor's TestHelperProcess_ReplicaBehind): it prints the node
// and the executions, running, then ended.
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface, type Interface } from "node:readline";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { connect, newExecutionId, type Client } from "../src/index.js";
import { repoRoot } from "./capstan.js";

const run = promisify(execFile);
const bound = (): AbortSignal => AbortSignal.timeout(60_000); // a failure guard, not a measure

interface Phase {
  phase: string;
  url: string;
  ids: string[];
}

let dir: string;
let helper: ChildProcess;
let lines: Interface;
let output = "";

/** The helper's next JSON line. */
function next(): Promise<Phase> {
  return new Promise((resolve, reject) => {
    const onLine = (l: string): void => {
      if (!l.startsWith("{")) return;
      lines.off("line", onLine);
      resolve(JSON.parse(l) as Phase);
    };
    lines.on("line", onLine);
    helper.once("exit", (code) => { reject(new Error(`the cluster's helper exited (${String(code)}):\n${output}`)); });
  });
}

async function client(url: string): Promise<Client> {
  return connect({ servers: url, actor: { kind: "user", id: "ada" } });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "capstan-ts-cluster-"));
  const bin = join(dir, "executor.test");
  await run("go", ["test", "-c", "-o", bin, "./executor"], { cwd: repoRoot, env: process.env, maxBuffer: 16 << 20 });
  helper = spawn(bin, ["-test.run", "^TestHelperProcess_ReplicaBehind$", "-test.timeout", "6m"], {
    env: { ...process.env, CAPSTAN_HELPER_PROCESS: "replica-behind" },
    stdio: ["pipe", "pipe", "pipe"],
  });
  helper.stderr?.on("data", (b: Buffer) => { output += b.toString(); });
  if (helper.stdout === null) throw new Error("the cluster's helper has no standard output");
  lines = createInterface({ input: helper.stdout });
  lines.on("line", (l) => { output += l + "\n"; });
});

after(async () => {
  helper?.stdin?.end();
  if (helper !== undefined && helper.exitCode === null) await new Promise((r) => helper.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
});

test("a replica behind never makes an accepted execution unknown: status asks the workers, await reads the envelope they read", async () => {
  const running = await next();
  assert.equal(running.phase, "running");
  const c = await client(running.url);
  try {
    for (let round = 0; round < 4; round++) {
      for (const id of running.ids) {
        const s = await c.status(id, { signal: bound() });
        assert.ok(s.record !== undefined, `status of ${id}, running: no record`);
        assert.equal(s.envelope, undefined);
      }
    }
    await assert.rejects(c.status(newExecutionId(), { signal: bound() }), (e: { code?: string }) => e.code === "UNKNOWN_EXECUTION");
  } finally {
    await c.close();
  }

  helper.stdin?.write("next\n");
  const ended = await next();
  assert.equal(ended.phase, "ended");
  const d = await client(ended.url);
  try {
    for (const id of ended.ids) {
      // Stored before this client's waiter existed, on no subscription it
      // will see: a read that missed must not leave await waiting for ever.
      const env = await d.await(id, { signal: bound() });
      assert.equal(env.status, "completed");
      const s = await d.status(id, { signal: bound() });
      assert.ok(s.record !== undefined || s.envelope !== undefined, `status of ${id}, ended: neither`);
    }
  } finally {
    await d.close();
  }
});
