// A real capstan for the tests: the Go command built from this repository,
// `capstan dev` started on a free loopback port (open, or with --auth and
// principals made by `capstan auth init` and `auth add`), stopped with
// SIGTERM when the tests end.

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The repository's root, from dist/test. */
export const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

/** The golden vectors shared with Go (internal/wirevectors/testdata). */
export const vectorsDir = fileURLToPath(new URL("../../../../internal/wirevectors/testdata/", import.meta.url));

/** Builds the capstan command into dir (Go's build cache makes a second build quick). */
export async function buildCapstan(dir: string): Promise<string> {
  const bin = join(dir, "capstan");
  await run("go", ["build", "-o", bin, "./cmd/capstan"], { cwd: repoRoot, env: process.env, maxBuffer: 16 << 20 });
  return bin;
}

export interface Dev {
  url: string;
  bin: string;
  dir: string;
  /** With --auth: the credentials directory. */
  secrets?: string;
  creds(name: string): string;
  /** Starts a `capstan worker` against this server, serving the named capabilities in its own pool. */
  worker(pool: string, capabilities: string[]): Promise<ChildProcess>;
  stop(): Promise<void>;
}

export interface DevOptions {
  auth?: boolean;
  /** Limits the dev worker to these capabilities (default the whole demo catalog). */
  capabilities?: string[];
  /** Extra flags for `capstan dev`. */
  flags?: string[];
}

/** The producer and approver principals a server with --auth knows. */
export const principals = {
  /** May call the demo catalog as user:alice. */
  alice: ["--role", "producer", "--actor", "user:alice", "--capabilities", "demo.*,orders.refund,email.send"],
  /** May call demo.echo only, as user:bob. */
  bob: ["--role", "producer", "--actor", "user:bob", "--capabilities", "demo.echo"],
  /** Decides finance approvals as user:carol. */
  carol: ["--role", "approver", "--actor", "user:carol", "--types", "finance"],
};

/** Starts `capstan dev` on a free loopback port and waits until it serves. */
export async function startDev(o: DevOptions = {}): Promise<Dev> {
  const dir = mkdtempSync(join(tmpdir(), "capstan-ts-"));
  try {
    return await start(dir, o);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

async function start(dir: string, o: DevOptions): Promise<Dev> {
  const bin = await buildCapstan(dir);
  const args = ["dev", "--listen", "127.0.0.1:0", "--store", join(dir, "store"), "--console", "off", "--sweep-every", "200ms"];
  let secrets: string | undefined;
  if (o.auth === true) {
    secrets = join(dir, "secrets");
    await run(bin, ["auth", "init", secrets]);
    for (const [name, flags] of Object.entries(principals)) await run(bin, ["auth", "add", secrets, name, ...flags]);
    args.push("--auth", secrets);
  }
  if (o.capabilities !== undefined) args.push("--capabilities", o.capabilities.join(","));
  args.push(...(o.flags ?? []));
  const p = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  const workers: ChildProcess[] = [];
  let log = "";
  p.stderr.on("data", (b: Buffer) => (log += b.toString()));
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => { reject(new Error(`capstan dev did not start within 120 s:\n${out}\n${log}`)); }, 120_000);
    p.stdout.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /capstan dev listening on (nats:\/\/[^\s]+)/.exec(out);
      if (m?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    p.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`capstan dev exited (${String(code)}):\n${out}\n${log}`));
    });
  });
  const stopped = new Promise<void>((resolve) => p.on("exit", () => { resolve(); }));
  return {
    url,
    bin,
    dir,
    secrets,
    creds: (name) => {
      if (secrets === undefined) throw new Error("an open server has no credentials");
      return join(secrets, `${name}.creds`);
    },
    worker(pool, capabilities) {
      const wargs = ["worker", "--nats", url, "--pool", pool, "--capabilities", capabilities.join(","), "--sweep-every", "-1s"];
      if (secrets !== undefined) wargs.push("--creds", join(secrets, "worker.creds"));
      const w = spawn(bin, wargs, { stdio: ["ignore", "ignore", "pipe"] });
      workers.push(w);
      let wlog = "";
      w.stderr.on("data", (b: Buffer) => (wlog += b.toString()));
      w.on("exit", (code) => {
        if (code !== 0 && code !== null) process.stderr.write(`capstan worker exited ${code}:\n${wlog}\n`);
      });
      return Promise.resolve(w);
    },
    async stop() {
      for (const w of workers) if (w.exitCode === null) w.kill("SIGTERM");
      p.kill("SIGTERM");
      const killer = setTimeout(() => p.kill("SIGKILL"), 20_000);
      await stopped;
      clearTimeout(killer);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The fenced blocks of a page whose info string is lang. */
export function fenced(page: string, lang: string): string[] {
  const out: string[] = [];
  const re = new RegExp("^```" + lang + "\\n([\\s\\S]*?)^```$", "gm");
  for (const m of readFileSync(page, "utf8").matchAll(re)) out.push(m[1] ?? "");
  return out;
}
