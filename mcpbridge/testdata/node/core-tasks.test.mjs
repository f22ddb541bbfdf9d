// The official TypeScript SDK's client (@modelcontextprotocol/sdk, protocol
// 2025-11-25) against `capstan mcp` over stdio, started from the
// configuration `capstan mcp --print-config` prints: every tool name is one
// the model APIs take, and client.experimental.tasks gets durable tasks.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { bin, startDev, capstan, hostToolName, until } from "./capstan.mjs";

const skip = bin === "" ? "CAPSTAN_BIN is not set" : false;
let dev, client;

before(async () => {
  if (skip) return;
  dev = await startDev();
  const printed = await capstan(dev.url, "mcp", "--print-config", "--actor", "user:alice", "--nats", dev.url);
  assert.equal(printed.code, 0, printed.stderr);
  const config = JSON.parse(printed.stdout).mcpServers.capstan;
  assert.ok(config.command.startsWith("/") || /^[A-Za-z]:\\/.test(config.command), `command ${config.command} is not absolute`);
  client = new Client({ name: "capstan-node-test", version: "1.0.0" });
  await client.connect(new StdioClientTransport({ command: config.command, args: config.args, stderr: "ignore" }));
});

after(async () => {
  await client?.close();
  await dev?.stop();
});

test("every tool name is one the model APIs take; the capability id stays visible", { skip }, async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const n of names) assert.match(n, hostToolName);
  for (const want of ["demo_echo", "orders_refund", "capstan_resume", "capstan_status"]) assert.ok(names.includes(want), `${want} in ${names}`);
  const refund = tools.find((t) => t.name === "orders_refund");
  assert.match(refund.description, /capstan capability orders\.refund/);
  assert.equal(refund._meta["capstan/capability"].id, "orders.refund");
  assert.equal(refund.execution?.taskSupport, "optional");
  const res = await client.callTool({ name: "demo_echo", arguments: { via: "node" } });
  assert.deepEqual(res.structuredContent, { via: "node" });
});

test("the server declares the 2025-11-25 tasks capability", { skip }, async () => {
  const caps = client.getServerCapabilities();
  assert.ok(caps.tasks?.requests?.tools?.call, JSON.stringify(caps));
  assert.ok(caps.tasks.list && caps.tasks.cancel);
});

async function drain(stream) {
  const seen = [];
  for await (const m of stream) seen.push(m);
  return seen;
}

test("callToolStream: a durable task, polled to its result, listed, read again", { skip }, async () => {
  const seen = await drain(client.experimental.tasks.callToolStream({ name: "demo_sleep", arguments: { ms: 400 } }));
  assert.equal(seen[0].type, "taskCreated", JSON.stringify(seen[0]));
  const id = seen[0].task.taskId;
  const last = seen.at(-1);
  assert.equal(last.type, "result", JSON.stringify(last));
  assert.deepEqual(last.result.structuredContent, { sleptMs: 400 });
  const task = await client.experimental.tasks.getTask(id);
  assert.equal(task.status, "completed");
  const again = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema);
  assert.deepEqual(again.structuredContent, { sleptMs: 400 });
  const { tasks } = await client.experimental.tasks.listTasks();
  assert.ok(tasks.some((t) => t.taskId === id && t.status === "completed"), JSON.stringify(tasks));
});

test("a failing call is a failed task whose result says why", { skip }, async () => {
  const seen = await drain(client.experimental.tasks.callToolStream({ name: "demo_flaky", arguments: { failTimes: 5 } }));
  const id = seen[0].task.taskId;
  assert.equal(seen.at(-1).type, "error");
  const task = await client.experimental.tasks.getTask(id);
  assert.equal(task.status, "failed");
  const res = await client.experimental.tasks.getTaskResult(id, CallToolResultSchema);
  assert.equal(res.isError, true);
  assert.match(res.content[0].text, /EXECUTION_FAILED/);
});

test("cancelTask stops a running execution; a second cancel is refused", { skip }, async () => {
  const stream = client.experimental.tasks.callToolStream({ name: "email_send",
    arguments: { to: "ada@example.com", subject: "held", delayMs: 60000 } });
  const first = await stream.next();
  assert.equal(first.value.type, "taskCreated");
  const id = first.value.task.taskId;
  await until("the email to start", async () => (await client.experimental.tasks.getTask(id)).statusMessage?.startsWith("started"));
  const cancelled = await client.experimental.tasks.cancelTask(id);
  assert.equal(cancelled.status, "cancelled");
  await assert.rejects(client.experimental.tasks.cancelTask(id), /already ended/);
  const rest = [];
  for await (const m of stream) rest.push(m);
  assert.equal(rest.at(-1).type, "error");
});

test("a call that needs someone else's approval runs once it is approved", { skip }, async () => {
  const stream = client.experimental.tasks.callToolStream({ name: "orders_refund", arguments: { orderId: "o-node", amount: 900 } });
  const first = await stream.next();
  const id = first.value.task.taskId;
  const waiting = await until("the approval", async () => {
    const t = await client.experimental.tasks.getTask(id);
    return t.statusMessage?.startsWith("waiting for approval") ? t : null;
  });
  assert.equal(waiting.status, "working");
  const approvalId = waiting.statusMessage.split(" ")[3];
  const approved = await capstan(dev.url, "approvals", "approve", approvalId, "--approver", "user:bob", "-o", "json");
  assert.equal(approved.code, 0, approved.stderr);
  const rest = [];
  for await (const m of stream) rest.push(m);
  const last = rest.at(-1);
  assert.equal(last.type, "result", JSON.stringify(last));
  assert.equal(last.result.structuredContent.orderId, "o-node");
});
