// The 2026-07-28 Tasks extension (io.modelcontextprotocol/tasks) as the
// official requester speaks it: @modelcontextprotocol/ext-tasks over the
// official v2 client (@modelcontextprotocol/client), against `capstan mcp`
// serving stateless streamable HTTP. The client negotiates the modern
// protocol with server/discover; task requests go out framed by ext-tasks
// through a raw dispatcher, as its documentation asks of a host.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient, resultFromTaskOutcome } from "@modelcontextprotocol/ext-tasks/client";
import { bin, startDev, freePort, tokensFile, hostToolName, until } from "./capstan.mjs";

const skip = bin === "" ? "CAPSTAN_BIN is not set" : false;
const token = "ext-tasks-node-token-0123456789";
const modern = "2026-07-28";
let dev, bridge, url, client, session;

// rawDispatch posts one framed request and returns its answer, from a JSON
// body or the event stream a streamable HTTP server may answer with.
let nextID = 1;
async function rawDispatch(request, options = {}) {
  const body = { jsonrpc: "2.0", id: nextID++, ...request };
  const res = await fetch(url, {
    method: "POST", signal: options.signal,
    headers: { "Authorization": `Bearer ${token}`, "Content-Type": "application/json",
      "Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": modern, "Mcp-Method": request.method,
      ...(request.method === "tools/call" ? { "Mcp-Name": request.params.name } : {}),
      ...(options.context?.headers ?? {}) },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  let msg;
  if ((res.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    for (const line of text.split("\n")) {
      if (!line.startsWith("data: ")) continue;
      const m = JSON.parse(line.slice(6));
      if (m.id === body.id) msg = m;
    }
  } else if (text.trim() !== "") {
    msg = JSON.parse(text);
  }
  if (!msg) throw new Error(`no answer to ${request.method}: HTTP ${res.status} ${text}`);
  return msg.error ? { kind: "error", error: msg.error } : { kind: "result", result: msg.result };
}

before(async () => {
  if (skip) return;
  dev = await startDev();
  const port = await freePort();
  url = `http://127.0.0.1:${port}/mcp`;
  bridge = spawn(bin, ["mcp", "--http", `127.0.0.1:${port}`, "--tokens", tokensFile([`${token} user:ada`]), "--stateless", "--nats", dev.url],
    { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  await until("capstan mcp to serve", async () => {
    bridge.stderr.on("data", (b) => { out += b; });
    return out.includes("serving streamable HTTP");
  }, { timeout: 30_000 });
  client = new Client({ name: "capstan-ext-tasks-test", version: "1.0.0" }, { versionNegotiation: { mode: { pin: modern } } });
  await client.connect(new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
  session = createTaskSessionFromClient(client, {
    endpointId: "capstan-node-test",
    rawDispatch,
    v2RequestFraming: { protocolVersion: modern, clientInfo: { name: "capstan-ext-tasks-test", version: "1.0.0" }, clientCapabilities: {} },
  });
});

after(async () => {
  await session?.close();
  await client?.close();
  if (bridge) {
    const exited = new Promise((r) => bridge.on("exit", r));
    bridge.kill("SIGTERM");
    await exited;
  }
  await dev?.stop();
});

test("the client negotiated the modern protocol and sees the Tasks extension", { skip }, async () => {
  assert.equal(client.getProtocolEra(), "modern");
  assert.deepEqual(client.getServerCapabilities().extensions?.["io.modelcontextprotocol/tasks"], {});
  const { tools } = await client.listTools();
  for (const t of tools) assert.match(t.name, hostToolName);
});

test("a quick call answers its result at once", { skip }, async () => {
  const execution = await session.callTool("demo_echo", { via: "ext-tasks" });
  assert.equal(execution.kind, "immediate");
  const { outcome } = await execution.settle();
  assert.deepEqual(resultFromTaskOutcome(outcome).structuredContent, { via: "ext-tasks" });
});

test("a call that outlasts a second is a durable task, settled by polling", { skip }, async () => {
  const execution = await session.callTool("email_send", { to: "ada@example.com", subject: "slow", holdMs: 1500 });
  assert.equal(execution.kind, "task");
  const id = execution.handle.taskId;
  assert.match(id, /^[0-9a-f-]{36}-[0-9a-f]{32}$/);
  const { outcome } = await execution.settle();
  assert.equal(outcome.status, "completed", JSON.stringify(outcome, (k, v) => v instanceof Error ? { ...v, message: v.message } : v));
  assert.equal(resultFromTaskOutcome(outcome).isError ?? false, false);
  // Durable: any controller reads it again by its id.
  const view = await session.task(id).snapshot();
  assert.equal(view.status, "completed");
});

test("a task is cancelled", { skip }, async () => {
  const execution = await session.callTool("email_send", { to: "ada@example.com", subject: "held", delayMs: 60000 },
  );
  assert.equal(execution.kind, "task");
  const id = execution.handle.taskId;
  await until("the email to start", async () => (await session.task(id).snapshot()).statusMessage?.startsWith("started"));
  await execution.cancel();
  const { outcome } = await execution.settle();
  assert.equal(outcome.status, "cancelled", JSON.stringify(outcome));
});
