// Runs a real capstan for the tests: `capstan dev` on free loopback ports
// with a temporary store, and what a host needs to reach it. The binary is
// $CAPSTAN_BIN (.ci/run builds it); the tests skip without it.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

export const bin = process.env.CAPSTAN_BIN ?? "";

export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on("error", reject);
  });
}

// startDev starts `capstan dev` and resolves once it serves; stop() ends it.
export async function startDev(extra = []) {
  const port = await freePort();
  const store = mkdtempSync(join(tmpdir(), "capstan-node-"));
  const url = `nats://127.0.0.1:${port}`;
  const child = spawn(bin, ["dev", "--store", store, "--listen", `127.0.0.1:${port}`, "--console", "off", "--grace", "2s", ...extra],
    { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const ready = new Promise((resolve, reject) => {
    const onData = (b) => {
      out += b.toString();
      if (out.includes("capstan dev listening")) resolve();
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code) => reject(new Error(`capstan dev exited ${code}:\n${out}`)));
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  await ready;
  clearTimeout(timer);
  return {
    url,
    output: () => out,
    async stop() {
      child.removeAllListeners("exit");
      const exited = new Promise((r) => child.on("exit", r));
      child.kill("SIGTERM");
      await exited;
      rmSync(store, { recursive: true, force: true });
    },
  };
}

// capstan runs one command and resolves with its output and exit code.
export async function capstan(url, ...args) {
  try {
    const { stdout, stderr } = await promisify(execFile)(bin, args, { env: { ...process.env, CAPSTAN_NATS_URL: url } });
    return { stdout, stderr, code: 0 };
  } catch (e) {
    return { stdout: e.stdout ?? "", stderr: e.stderr ?? "", code: e.code ?? 1 };
  }
}

// tokensFile writes a bearer tokens file for `capstan mcp --http`.
export function tokensFile(lines) {
  const dir = mkdtempSync(join(tmpdir(), "capstan-tokens-"));
  const path = join(dir, "tokens");
  writeFileSync(path, lines.join("\n") + "\n", { mode: 0o600 });
  return path;
}

// The names the Anthropic and OpenAI tool APIs take.
export const hostToolName = /^[a-zA-Z0-9_-]{1,64}$/;

export async function until(what, fn, { timeout = 30_000, every = 50 } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}
