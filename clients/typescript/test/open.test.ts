// The client against a real `capstan dev` without authentication: every
// principal is _anon. The dev worker serves the demo catalog but email.send,
// which a `capstan worker` of its own pool serves until the start-deadline
// test stops it (the test after it, of a queued call, starts another).

import assert from "node:assert/strict";
import { execFile, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";
import { headers, type NatsConnection } from "@nats-io/nats-core";
import { connect as natsConnect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { CapabilityError, CapstanError, Client, connect, ExpiredError, UnservedError, forModel, maxStartWithinMs, newExecutionId, progressText, type Envelope, type Progress } from "../src/index.js";
import { encodeDescriptor, encodeEnvelope, encodeProgress } from "../src/wire.js";
import { aiTools } from "../src/ai.js";
import { actorTag, executionIdFor } from "../src/owner.js";
import { generateText, jsonSchema, type ToolSet } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { main } from "../examples/scripted-agent.js";
import { startDev, type Dev } from "./capstan.js";

const demo = ["demo.echo", "demo.flaky", "demo.sleep", "demo.report", "orders.refund"];
const bound = (): AbortSignal => AbortSignal.timeout(60_000); // a failure guard, not a measure

let dev: Dev;
let c: Client;
let mail: ChildProcess;
let raw: NatsConnection;

before(async () => {
  dev = await startDev({ capabilities: demo, flags: ["--envelope-retention", "10h"] });
  mail = await dev.worker("mail", ["email.send"]);
  c = await connect({ servers: dev.url, actor: { kind: "user", id: "ada" } });
  raw = await natsConnect({ servers: dev.url });
  // The mail pool serves once its worker has started.
  for (;;) {
    const env = await c.call("email.send", { to: "ada@example.com", subject: "ready?" }, { signal: bound() });
    if (env.status === "completed") break;
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(async () => {
  await c?.close();
  await raw?.close();
  await dev?.stop();
});

describe("progress", () => {
  test("onProgress gets the handler's reports while call waits, in order, and none after it returned", async () => {
    const seen: Progress[] = [];
    const env = await c.call("demo.report", { pages: 8, pageMs: 100 }, { signal: bound(), onProgress: (p) => seen.push(p) });
    assert.equal(env.status, "completed", JSON.stringify(forModel(env)));
    assert.deepEqual(env.output, { pages: 8 });
    assert.ok(seen.length >= 2, `${seen.length} reports`);
    let done = -1;
    for (const p of seen) {
      assert.equal(p.v, 1);
      assert.equal(p.executionId, env.executionId);
      assert.equal(p.attempt, 1);
      assert.equal(p.total, 8);
      assert.ok((p.done ?? 0) >= done, `went back: ${JSON.stringify(seen)}`);
      done = p.done ?? 0;
      assert.match(p.message ?? "", /^(starting|page \d of 8 rendered)$/);
      assert.ok(!Number.isNaN(new Date(p.at).getTime()));
    }
    assert.match(progressText(seen[seen.length - 1] as Progress), /^\d of 8 \(\d+%\)/);
    const n = seen.length;
    await c.call("demo.report", { pages: 3, pageMs: 50 }, { signal: bound() }); // reports nobody follows
    assert.equal(seen.length, n);
  });

  test("await follows an execution's progress; a forged report is shown as one printable line", async () => {
    const id = await c.submit("demo.report", { pages: 6, pageMs: 100 });
    const seen: Progress[] = [];
    const env = c.await(id, {
      signal: bound(),
      onProgress: (p) => {
        seen.push(p);
        if (seen.length === 1) {
          // Anyone may publish on an open server: the client cleans what it hands over.
          raw.publish(`capstan.progress._anon.${id}`, encodeProgress({ v: 1, executionId: id, attempt: 1, done: 1, total: 6, message: "\u001b]0;pwned\u0007\nred", at: new Date().toISOString() }));
          raw.publish(`capstan.progress._anon.${id}`, encodeProgress({ v: 1, executionId: newExecutionId(), done: 1, message: "another's", at: new Date().toISOString() }));
          raw.publish(`capstan.progress._anon.${id}`, new Uint8Array([0xc1]));
        }
      },
    });
    assert.equal((await env).status, "completed");
    const forged = seen.find((p) => (p.message ?? "").includes("pwned"));
    assert.ok(forged !== undefined, JSON.stringify(seen));
    assert.equal(forged.message, " ]0;pwned  red");
    assert.ok(seen.every((p) => p.executionId === id && p.message !== "another's"));
  });
});

describe("calls", () => {
  test("a call completes with its output; the client acts as _anon", async () => {
    assert.equal(c.principal, "_anon");
    const env = await c.call("demo.echo", { hello: "world" }, { signal: bound() });
    assert.equal(env.status, "completed");
    assert.deepEqual(env.output, { hello: "world" });
    assert.equal(env.attempts, 1);
    assert.equal(env.capabilityId, "demo.echo");
    assert.ok(env.finalizedAt !== undefined && !Number.isNaN(new Date(env.finalizedAt).getTime()));
  });

  test("an input means what encoding/json makes of it: the echo returns numbers as float64, bytes as base64, times as text", async () => {
    const env = await c.call(
      "demo.echo",
      { text: "héllo 世界 😀", big: 9007199254740993n, n: 7, half: 0.5, bytes: new Uint8Array([1, 2, 3]), when: new Date(Date.UTC(2026, 0, 2, 3, 4, 5, 6)), list: [null, true] },
      { signal: bound() },
    );
    assert.equal(env.status, "completed", JSON.stringify(forModel(env)));
    assert.deepEqual(env.output, {
      text: "héllo 世界 😀",
      big: 9007199254740992, // a float64 holds no more
      n: 7,
      half: 0.5,
      bytes: "AQID",
      when: "2026-01-02T03:04:05.006Z",
      list: [null, true],
    });
  });

  test("a retried read completes on its second attempt", async () => {
    const env = await c.call("demo.flaky", { failTimes: 1 }, { signal: bound() });
    assert.equal(env.status, "completed");
    assert.equal(env.attempts, 2);
    assert.deepEqual(env.output, { attempt: 2 });
  });

  test("submit then await: the same envelope, and status shows record and envelope", async () => {
    const id = await c.submit("demo.echo", { n: 1 }, { signal: bound() });
    const env = await c.await(id, { signal: bound() });
    assert.equal(env.executionId, id);
    const again = await c.await(id, { signal: bound() });
    assert.deepEqual(again, env);
    const s = await c.status(id);
    assert.deepEqual(s.envelope, env);
    assert.equal(s.record?.state, "finalized");
    assert.equal(s.record?.status, "completed");
  });

  test("many calls in flight each get their own envelope", async () => {
    const envs = await Promise.all(Array.from({ length: 50 }, (_, i) => c.call("demo.echo", { i }, { signal: bound() })));
    envs.forEach((env, i) => {
      assert.equal(env.status, "completed");
      assert.deepEqual(env.output, { i });
    });
    assert.equal(new Set(envs.map((e) => e.executionId)).size, 50);
  });
});

describe("governed failures are envelopes, never errors", () => {
  test("INPUT_INVALID carries every issue, and the model sees them", async () => {
    const env = await c.call("orders.refund", { orderId: 1, amount: "x" }, { signal: bound() });
    assert.equal(env.status, "failed");
    assert.equal(env.error?.code, "INPUT_INVALID");
    const issues = (env.error?.details as { issues: { path: string }[] }).issues;
    assert.deepEqual(issues.map((i) => i.path).sort(), ["amount", "orderId"]);
    assert.deepEqual(forModel(env)?.details, env.error?.details);
  });

  test("a retryable failure after every attempt: exposed with its message", async () => {
    const env = await c.call("demo.flaky", { failTimes: 5 }, { signal: bound() });
    assert.equal(env.status, "failed");
    assert.equal(env.attempts, 3);
    assert.deepEqual(forModel(env), { code: "EXECUTION_FAILED", message: "Attempt 3 failed on purpose.", retryable: true });
  });

  test("a per-attempt timeout ends cancelled TIMEOUT after the retry", async () => {
    const env = await c.call("demo.sleep", { ms: 3000 }, { signal: bound() });
    assert.equal(env.status, "cancelled");
    assert.equal(env.error?.code, "TIMEOUT");
    assert.equal(env.attempts, 2);
  });

  test("an unknown capability ends CAPABILITY_NOT_FOUND through _unrouted", async () => {
    const env = await c.call("demo.nothing", {}, { signal: bound() });
    assert.equal(env.status, "failed");
    assert.equal(env.error?.code, "CAPABILITY_NOT_FOUND");
    assert.ok((await c.status(env.executionId)).envelope !== undefined); // a worker ended it
  });

  test("an id that can never name a capability is answered without being published", async () => {
    const env = await c.call("orders.*", {});
    assert.equal(env.status, "failed");
    assert.equal(env.error?.code, "CAPABILITY_NOT_FOUND");
    await assert.rejects(c.status(env.executionId), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
    await assert.rejects(c.submit("Bad Id", {}), (e: CapabilityError) => e instanceof CapabilityError && e.code === "CAPABILITY_NOT_FOUND");
  });

  test("inputs without a JSON form and invalid ids are refused before anything is sent", async () => {
    await assert.rejects(c.call("demo.echo", { x: NaN }), (e: CapstanError) => e.code === "INVALID_ARGUMENT");
    await assert.rejects(c.call("demo.echo", {}, { id: "a.b" }), (e: CapstanError) => e.code === "INVALID_ARGUMENT");
    await assert.rejects(c.await("a b"), (e: CapstanError) => e.code === "INVALID_ARGUMENT");
  });
});

/** How many times email.send's handler ran for id: its calls stream holds one message per run. */
async function handlerRuns(id: string): Promise<number> {
  const jsm = await jetstreamManager(raw);
  const consumer = await jetstream(raw).consumers.get("CAPSTAN_DEMO_CALLS", { filter_subjects: ["capstan.demo.calls.email.send"] });
  const pending = (await jsm.streams.info("CAPSTAN_DEMO_CALLS", { subjects_filter: "capstan.demo.calls.email.send" })).state.messages;
  let runs = 0;
  for (let seen = 0; seen < pending; seen++) {
    const m = await consumer.next({ expires: 5000 });
    if (m === null) break;
    if (m.headers?.get("Capstan-Execution-Id") === id) runs++;
  }
  return runs;
}

describe("duplicate ids", () => {
  test("one id submitted three times and called once runs once", async () => {
    const id = newExecutionId();
    const input = { to: "ada@example.com", subject: "once", holdMs: 200 };
    const ids = await Promise.all([c.submit("email.send", input, { id }), c.submit("email.send", input, { id }), c.submit("email.send", input, { id })]);
    assert.deepEqual(ids, [id, id, id]);
    const env = await c.call("email.send", input, { id, signal: bound() });
    assert.equal(env.status, "completed");
    assert.equal(env.attempts, 1);
    assert.deepEqual(await c.await(id, { signal: bound() }), env);
    assert.equal(await handlerRuns(id), 1);
  });
});

describe("cancel and abort", () => {
  test("cancel stops a running call: it ends cancelled", async () => {
    const id = await c.submit("email.send", { to: "ada@example.com", subject: "slow", delayMs: 30_000 });
    const r = await c.cancel(id);
    assert.equal(r.executionId, id);
    assert.notEqual(r.finalized, true);
    const env = await c.await(id, { signal: bound() });
    assert.equal(env.status, "cancelled");
    assert.equal(env.error?.code, "CANCELLED");
  });

  test("cancelling an execution that ended changes nothing: the workers say so", async () => {
    const env = await c.call("demo.echo", { done: true }, { signal: bound() });
    const r = await c.cancel(env.executionId);
    assert.equal(r.finalized, true);
    assert.equal(r.status, "completed");
    assert.deepEqual(await c.await(env.executionId), env);
  });

  test("an aborted wait is not a failure of the execution: it goes on and can be awaited", async () => {
    const ac = new AbortController();
    const call = c.call("demo.sleep", { ms: 700 }, { signal: ac.signal }); // well under its 1 s timeout
    setTimeout(() => { ac.abort(new Error("the user went away")); }, 20);
    const err = (await call.then(
      () => assert.fail("the call should have been aborted"),
      (e: unknown) => e,
    )) as CapstanError;
    assert.equal(err.code, "ABORTED");
    assert.equal((err.cause as Error).message, "the user went away");
    assert.ok(err.executionId !== undefined);
    const env = await c.await(err.executionId, { signal: bound() });
    assert.equal(env.status, "completed");
  });

  test("cancelOnAbort cancels the execution too", async () => {
    const ac = new AbortController();
    const call = c.call("email.send", { to: "ada@example.com", subject: "abort me", delayMs: 30_000 }, { signal: ac.signal, cancelOnAbort: true });
    setTimeout(() => { ac.abort(); }, 300);
    const err = (await call.catch((e: unknown) => e)) as CapstanError;
    assert.equal(err.code, "ABORTED");
    const env = await c.await(err.executionId as string, { signal: bound() });
    assert.equal(env.status, "cancelled");
  });

  test("a closed client ends its waits with CLOSED and submits nothing", async () => {
    const other = await connect({ servers: dev.url });
    const id = newExecutionId(); // never submitted: nothing will answer it
    const wait = other.await(id);
    await new Promise((r) => setTimeout(r, 50));
    await other.close();
    await assert.rejects(wait, (e: CapstanError) => e.code === "CLOSED" && e.executionId === id);
    await assert.rejects(other.call("demo.echo", {}), (e: CapstanError) => e.code === "CLOSED");
  });
});

describe("approvals on an open server", () => {
  test("approval required, decided by someone else, resumed once", async () => {
    const env = await c.call("orders.refund", { orderId: "o-1", amount: 900 }, { signal: bound() });
    assert.equal(env.status, "approval-required");
    const approvalId = env.approval?.id as string;
    assert.deepEqual(env.approval?.types, ["finance"]);

    const [pending] = await c.approvals.list({ status: "pending", capabilityId: "orders.refund" }).then((p) => p.records.filter((r) => r.id === approvalId));
    assert.deepEqual(pending?.input, { amount: 900, orderId: "o-1" });

    await assert.rejects(c.approvals.decide(approvalId, { approve: true, approver: { kind: "user", id: "ada" } }), (e: CapstanError) =>
      e.conditions.includes("self_approval"),
    );
    const approved = await c.approvals.decide(approvalId, { approve: true, approver: { kind: "user", id: "bob" }, comment: "ok" });
    assert.equal(approved.status, "approved");
    assert.equal(approved.decision?.approver?.id, "bob");

    const results = await Promise.all([c.resume(approvalId, { signal: bound() }), c.resume(approvalId, { signal: bound() })]);
    const completed = results.filter((e) => e.status === "completed");
    assert.equal(completed.length, 1);
    assert.deepEqual(completed[0]?.output, { orderId: "o-1", amount: 900, repeated: false });
    const refused = results.find((e) => e.status === "failed");
    assert.equal(refused?.error?.code, "APPROVAL_CONSUMED");
    assert.equal((await c.approvals.get(approvalId)).status, "consumed");
  });

  test("an unknown approval is refused in an envelope", async () => {
    const env = await c.resume(newExecutionId(), { signal: bound() });
    assert.equal(env.status, "failed");
    assert.equal(env.error?.code, "FORBIDDEN");
  });
});

describe("describe", () => {
  test("what the surface may see, with input schemas", async () => {
    const d = await c.describe({ surface: "mcp" });
    const ids = d.capabilities.map((x) => x.id);
    assert.deepEqual(ids, [...ids].sort());
    assert.ok(ids.includes("orders.refund"));
    const refund = d.capabilities.find((x) => x.id === "orders.refund");
    const props = refund?.inputSchema?.properties as Record<string, unknown>;
    assert.deepEqual(Object.keys(props).sort(), ["amount", "orderId"]);
    assert.equal(refund?.sideEffect, "write");
    assert.match(d.digest, /^[0-9a-f]{64}$/);
    assert.ok(d.id.length > 0);
  });

  test("a malformed actor is refused with a CapabilityError", async () => {
    await assert.rejects(c.describe({ actor: { kind: "martian", id: "x" } }), (e: CapabilityError) => e instanceof CapabilityError && e.code === "UNAUTHENTICATED");
  });
});

describe("what a client must refuse", () => {
  // On an open server anyone may publish anything: these forge what the
  // server itself would send, to see which the client takes.
  const forge = (id: string, env: Envelope, subjectHeader?: string): void => {
    const h = headers();
    if (subjectHeader !== undefined) h.set("Nats-Subject", subjectHeader);
    raw.publish(`capstan.envelope._anon.${id}`, encodeEnvelope(env), { headers: h });
  };
  const envelopeOf = (id: string, v = 1): Envelope => ({
    v,
    executionId: id,
    capabilityId: "demo.echo",
    status: "completed",
    output: { forged: true },
    attempts: 1,
    durationMs: 1,
    finalizedAt: new Date().toISOString(),
  });

  test("an envelope is taken only from the republish of the very key awaited, of a known v", async () => {
    const id = newExecutionId();
    const wait = c.await(id, { signal: bound() });
    await new Promise((r) => setTimeout(r, 100));
    forge(id, envelopeOf(id)); // no Nats-Subject: a reply aimed at the subject
    forge(id, envelopeOf(id), `$KV.CAPSTAN_ENVELOPES._anon.${newExecutionId()}`); // another key's
    forge(id, envelopeOf(newExecutionId()), `$KV.CAPSTAN_ENVELOPES._anon.${id}`); // another execution's body
    forge(id, envelopeOf(id, 2), `$KV.CAPSTAN_ENVELOPES._anon.${id}`); // an unknown schema version
    await raw.flush();
    const good = { ...envelopeOf(id), output: { taken: true } };
    setTimeout(() => { forge(id, good, `$KV.CAPSTAN_ENVELOPES._anon.${id}`); }, 200);
    const env = await wait;
    assert.deepEqual(env.output, { taken: true });
  });

  test("a stored envelope of an unknown v is refused with DECODE", async () => {
    const id = newExecutionId();
    const kv = await new Kvm(raw).open("CAPSTAN_ENVELOPES");
    await kv.put(`_anon.${id}`, encodeEnvelope(envelopeOf(id, 2)));
    await assert.rejects(c.status(id), (e: CapstanError) => e.code === "DECODE");
    await assert.rejects(c.await(id, { signal: bound() }), (e: CapstanError) => e.code === "DECODE");
  });
});

describe("an operator's pause", () => {
  test("describe and the AI SDK tools tell the model a paused capability will not run now", async () => {
    const capstan = (...args: string[]) => promisify(execFile)(dev.bin, [...args, "--nats", dev.url]);
    await capstan("pause", "demo.sleep", "--reason", "sleeping too much");
    try {
      const d = await c.describe({ surface: "mcp" });
      const sleep = d.capabilities.find((x) => x.id === "demo.sleep");
      assert.equal(sleep?.paused?.reason, "sleeping too much");
      assert.notEqual(sleep?.paused?.refuse, true);
      assert.equal(d.capabilities.find((x) => x.id === "demo.echo")?.paused, undefined);
      const tools = await aiTools(c, { surface: "mcp" });
      assert.match(tools.demo_sleep?.description ?? "", /^PAUSED by an operator \(sleeping too much\): calls wait until it is lifted\./);
      assert.doesNotMatch(tools.demo_echo?.description ?? "", /PAUSED/);
    } finally {
      await capstan("unpause", "demo.sleep", "--reason", "done");
    }
    const d = await c.describe({ surface: "mcp" });
    assert.equal(d.capabilities.find((x) => x.id === "demo.sleep")?.paused, undefined);
  });
});

/**
 * A fetch that keeps each request's body and answers as the provider would
 * with a short text: the AI SDK's own request building, with no network.
 */
function capturing(answer: unknown): { fetch: typeof fetch; bodies: string[] } {
  const bodies: string[] = [];
  const f: typeof fetch = (_url, init) => {
    bodies.push(typeof init?.body === "string" ? init.body : "");
    return Promise.resolve(new Response(JSON.stringify(answer), { status: 200, headers: { "content-type": "application/json" } }));
  };
  return { fetch: f, bodies };
}

const openAIChatAnswer = {
  id: "chatcmpl-1", object: "chat.completion", created: 0, model: "gpt-4o",
  choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
};
const anthropicAnswer = {
  id: "msg_1", type: "message", role: "assistant", model: "claude-sonnet-4-5", content: [{ type: "text", text: "ok" }],
  stop_reason: "end_turn", stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 },
};

/** Whether v holds a bigint anywhere: JSON.stringify throws on one. */
function holdsBigint(v: unknown): boolean {
  if (typeof v === "bigint") return true;
  if (v === null || typeof v !== "object") return false;
  return Object.values(v).some(holdsBigint);
}

describe("a call without an actor", () => {
  test("is refused at once, before anything is sent", async () => {
    const bare = await connect({ servers: dev.url });
    try {
      await assert.rejects(bare.call("demo.echo", { a: 1 }), (e: CapstanError) => e.code === "INVALID_ARGUMENT" && /needs an actor/.test(e.message));
      await assert.rejects(bare.submit("demo.echo", { a: 1 }), (e: CapstanError) => e.code === "INVALID_ARGUMENT");
      const env = await bare.call("demo.echo", { a: 2 }, { actor: { kind: "user", id: "ada" }, signal: bound() });
      assert.equal(env.status, "completed");
    } finally {
      await bare.close();
    }
  });
});

describe("a capability no live worker serves", () => {
  test("a call is told at once, queued or refused as the caller chose; the AI SDK tool tells the model it is queued", async () => {
    // The catalog lists ghost.echo in pool "ghost", whose entries lapsed and
    // whose workers are all gone (no live _pool.ghost): its pool is down.
    const kv = await new Kvm(raw).open("CAPSTAN_CATALOG");
    const lapsed = new Date(Date.now() - 60_000).toISOString();
    await kv.put("ghost.echo", encodeDescriptor({ v: 1, id: "ghost.echo", pool: "ghost", description: "Echoes, when a worker runs.", sideEffect: "none", expose: ["direct", "mcp"], timeoutMs: 1000, expiresAt: lapsed }));
    try {
      const err = (await c.call("ghost.echo", { a: 1 }, { signal: bound() }).catch((e: unknown) => e)) as UnservedError;
      assert.ok(err instanceof UnservedError, String(err));
      assert.equal(err.code, "UNSERVED");
      assert.equal(err.queued, true);
      assert.equal(err.pool, "ghost");
      assert.match(err.message, /start a worker of pool "ghost"/);
      const id = err.executionId as string;
      assert.equal((await c.execution(id, { probe: true })).state, "queued");
      await c.cancel(id); // withdrawn: it ends cancelled when a worker sees it

      const refused = (await c.call("ghost.echo", { a: 2 }, { signal: bound(), ifUnserved: "refuse" }).catch((e: unknown) => e)) as UnservedError;
      assert.ok(refused instanceof UnservedError && !refused.queued, String(refused));
      assert.equal((await c.execution(refused.executionId as string, { probe: true })).state, "unknown");
      await assert.rejects(c.submit("ghost.echo", {}, { ifUnserved: "refuse" }), (e: CapstanError) => e.code === "UNSERVED");

      const tools = await aiTools(c, { surface: "mcp" });
      const r = (await tools.ghost_echo?.execute({ a: 3 })) as { status: string; executionId: string; next: string };
      assert.equal(r.status, "queued");
      assert.match(r.next, /queued/);
      await c.cancel(r.executionId);
    } finally {
      await kv.delete("ghost.echo");
    }
  });
});

describe("AI SDK tools", () => {
  test("the tools go to model providers as the AI SDK builds their requests: valid JSON, every schema intact", async () => {
    const discovery = await c.describe({ surface: "mcp" });
    const int64 = discovery.capabilities.find((d) => d.id === "orders.refund")?.inputSchema as { properties: { amount: unknown } };
    assert.deepEqual(int64.properties.amount, { type: "integer", format: "int64" }); // no bound beyond 2^53
    for (const wrap of [undefined, jsonSchema] as const) {
      const tools = await aiTools(c, { surface: "mcp", ...(wrap !== undefined ? { jsonSchema: (s: Record<string, unknown>) => wrap(s) } : {}) });
      for (const [name, t] of Object.entries(tools)) {
        const s = (t.inputSchema as { jsonSchema: unknown }).jsonSchema;
        assert.ok(!holdsBigint(s), `${name}: a bigint in its schema`);
      }
      const openai = capturing(openAIChatAnswer);
      const anthropic = capturing(anthropicAnswer);
      for (const model of [
        createOpenAI({ apiKey: "none", fetch: openai.fetch }).chat("gpt-4o"),
        createAnthropic({ apiKey: "none", fetch: anthropic.fetch })("claude-sonnet-4-5"),
      ]) {
        const r = await generateText({ model, tools: tools as unknown as ToolSet, prompt: "Refund order o-1.", maxRetries: 0 });
        assert.equal(r.text, "ok");
      }
      const sent = (t: { jsonSchema: unknown }): unknown => JSON.parse(JSON.stringify(t.jsonSchema));
      assert.equal(openai.bodies.length, 1);
      const ob = JSON.parse(openai.bodies[0] as string) as { tools: { function: { name: string; parameters: unknown } }[] };
      assert.deepEqual(ob.tools.map((t) => t.function.name).sort(), Object.keys(tools).sort());
      for (const t of ob.tools) {
        assert.deepEqual(t.function.parameters, sent(tools[t.function.name]?.inputSchema as { jsonSchema: unknown }), t.function.name);
      }
      assert.equal(anthropic.bodies.length, 1);
      const ab = JSON.parse(anthropic.bodies[0] as string) as { tools: { name: string; input_schema: unknown }[] };
      assert.deepEqual(ab.tools.map((t) => t.name).sort(), Object.keys(tools).sort());
      for (const t of ab.tools) {
        assert.deepEqual(t.input_schema, sent(tools[t.name]?.inputSchema as { jsonSchema: unknown }), t.name);
      }
    }
  });

  test("the capabilities become tools in the SDK's shape; execute is a governed call", async () => {
    const tools = await aiTools(c, { surface: "mcp" });
    assert.ok("demo_echo" in tools && "orders_refund" in tools && "capstan_resume" in tools && "capstan_status" in tools);
    // The SDK's isSchema: Symbol.for("vercel.ai.schema"), jsonSchema and validate.
    const schema = tools.orders_refund?.inputSchema as unknown as Record<string | symbol, unknown>;
    assert.equal(schema[Symbol.for("vercel.ai.schema")], true);
    assert.ok("validate" in schema);
    assert.deepEqual(Object.keys((schema.jsonSchema as { properties: object }).properties).sort(), ["amount", "orderId"]);
    assert.match(tools.orders_refund?.description ?? "", /approval/);

    assert.deepEqual(await tools.demo_echo?.execute({ a: 1 }), { a: 1 });
  });

  test("a failure shows the model only forModel(); an approval what to do next", async () => {
    const tools = await aiTools(c, { surface: "mcp" });
    const failed = (await tools.demo_flaky?.execute({ failTimes: 5 })) as { status: string; error: unknown };
    assert.equal(failed.status, "failed");
    assert.deepEqual(failed.error, { code: "EXECUTION_FAILED", message: "Attempt 3 failed on purpose.", retryable: true });
    const approval = (await tools.orders_refund?.execute({ orderId: "o-7", amount: 901 })) as { status: string; approvalId: string; next: string };
    assert.equal(approval.status, "approval-required");
    assert.match(approval.next, /You cannot approve it yourself/);
    const early = (await tools.capstan_resume?.execute({ approvalId: approval.approvalId })) as { error: { code: string } };
    assert.equal(early.error.code, "APPROVAL_PENDING");
  });

  test("an input larger than the server takes in one message: the model is told nothing ran, not that it may run", async () => {
    const tools = await aiTools(c, { surface: "mcp" });
    const r = (await tools.demo_echo?.execute({ data: "x".repeat(2 << 20) })) as { executionId?: string; error?: { code: string; message: string; retryable: boolean } };
    assert.equal(r.executionId, undefined, `the model is sent to read an execution that cannot exist: ${JSON.stringify(r.error)}`);
    assert.equal(r.error?.code, "INPUT_INVALID");
    assert.equal(r.error.retryable, false);
    assert.match(r.error.message, /too large/);
  });

  test("a call whose client closed before its answer: the model is sent to read it, not told to call again", async () => {
    const c2 = await connect({ servers: dev.url, actor: { kind: "user", id: "ada" } });
    const tools = await aiTools(c2, { surface: "mcp" });
    const pending = tools.demo_sleep?.execute({ ms: 800 }) as Promise<{ executionId?: string; error?: { code: string; message: string; retryable: boolean } }>;
    await new Promise((r) => setTimeout(r, 300));
    await c2.close();
    const r = await pending;
    assert.ok(r.executionId !== undefined, JSON.stringify(r));
    assert.match(r.error?.message ?? "", /before calling again/);
    assert.equal(r.error?.retryable, false, "it may run: calling again could run it twice");
  });

  test("a call that outlives the tool's wait goes on, and the model is told how to read it", async () => {
    const tools = await aiTools(c, { surface: "mcp", callTimeoutMs: 50 });
    const r = (await tools.demo_sleep?.execute({ ms: 500 })) as { status: string; executionId: string };
    assert.equal(r.status, "running");
    const tools2 = await aiTools(c, { surface: "mcp" });
    for (;;) {
      const s = (await tools2.capstan_status?.execute({ executionId: r.executionId })) as { status?: string; sleptMs?: number };
      if (s.status !== "running") {
        assert.deepEqual(s, { sleptMs: 500 });
        break;
      }
      await new Promise((res) => setTimeout(res, 50));
    }
  });

  test("capstan_status answers one actor only its own executions: another actor of the principal gets NOT_FOUND, as for none", async () => {
    const ada = { kind: "user", id: "ada" };
    const bob = { kind: "user", id: "bob" };
    const adas = await aiTools(c, { surface: "mcp", callTimeoutMs: 50 }); // the client's actor
    const cb = await connect({ servers: dev.url, actor: bob });
    try {
      const bobs = [await aiTools(cb, { surface: "mcp" }), await aiTools(c, { surface: "mcp", call: { actor: bob } })];
      const statusOf = async (tools: Record<string, { execute: (i: unknown) => Promise<unknown> }>, executionId: string): Promise<unknown> => {
        const t = tools.capstan_status;
        assert.ok(t !== undefined);
        return t.execute({ executionId });
      };
      const none = { error: { code: "NOT_FOUND", message: "No such execution, or its result is no longer kept.", retryable: false } };

      // Ada's call, still running when her tool returns, then completed.
      const slept = (await adas.demo_sleep?.execute({ ms: 300 })) as { status: string; executionId: string };
      assert.equal(slept.status, "running");
      const id = slept.executionId;
      const u = id.slice(0, 36);
      assert.equal(id, `${u}-${actorTag(ada, u)}`, "the tools' id names their actor as the MCP bridge's ids do");
      for (;;) {
        const s = (await statusOf(adas, id)) as { status?: string };
        if (s.status !== "running") {
          assert.deepEqual(s, { sleptMs: 300 });
          break;
        }
        await new Promise((res) => setTimeout(res, 50));
      }
      // An approval-required one: its approval is ada's to tell of.
      const asked = (await adas.orders_refund?.execute({ orderId: "o-owner", amount: 950 })) as { status: string; executionId: string; approvalId: string };
      assert.equal(asked.status, "approval-required");
      assert.equal(((await statusOf(adas, asked.executionId)) as { approvalId?: string }).approvalId, asked.approvalId);
      // Ada's own, started with an id that names no actor, outside the tools.
      const untagged = await c.submit("demo.echo", { secret: "untagged" });
      assert.equal((await c.await(untagged, { signal: bound() })).status, "completed");

      for (const b of bobs) {
        // An id of bob's that was never used: what "none" looks like to him.
        assert.deepEqual(await statusOf(b, executionIdFor(bob)), none);
        for (const hostile of [
          id, // ada's
          asked.executionId, // ada's, waiting for an approval
          `${u}-${actorTag(bob, u)}`, // ada's uuid under bob's tag: another id, never used
          `${u}-${actorTag(ada, u).slice(0, 31)}`, // a tag of the wrong length
          `${id}0`,
          `${u}-${actorTag(ada, u).toUpperCase()}`,
          u, // no tag
          untagged,
          "../../x",
          "",
          "x".repeat(300),
        ]) {
          const r = await statusOf(b, hostile);
          assert.deepEqual(r, none, `bob's capstan_status of ${hostile}: ${JSON.stringify(r)}`);
        }
      }
      // Ada's tools answer only ids they tag for her: not her untagged one, nor a forged tag.
      for (const hostile of [untagged, u, `${u}-${actorTag(ada, u).slice(0, 31)}`, `${u}-${actorTag(ada, u).toUpperCase()}`]) {
        assert.deepEqual(await statusOf(adas, hostile), none, hostile);
      }
      assert.deepEqual(await statusOf(adas, id), { sleptMs: 300 });
    } finally {
      await cb.close();
    }
  });

  test("capstan_resume runs one actor only its own approvals: another actor of the principal is told no such approval, and nothing runs", async () => {
    const bob = { kind: "user", id: "bob" };
    const adas = await aiTools(c, { surface: "mcp" });
    const bobs = await aiTools(c, { surface: "mcp", call: { actor: bob } });
    const asked = (await adas.orders_refund?.execute({ orderId: "o-resume", amount: 920 })) as { status: string; approvalId: string };
    assert.equal(asked.status, "approval-required");
    await c.approvals.decide(asked.approvalId, { approve: true, approver: { kind: "user", id: "carol" } });

    const none = { status: "failed", error: { code: "FORBIDDEN", message: "No such approval.", retryable: false } };
    const stolen = await bobs.capstan_resume?.execute({ approvalId: asked.approvalId });
    assert.equal((await c.approvals.get(asked.approvalId)).status, "approved", `bob's resume used ada's approval: ${JSON.stringify(stolen)}`);
    assert.deepEqual(stolen, none);
    assert.deepEqual(await bobs.capstan_resume?.execute({ approvalId: newExecutionId() }), none);
    assert.deepEqual(await adas.capstan_resume?.execute({ approvalId: asked.approvalId }), { orderId: "o-resume", amount: 920, repeated: false });
  });

  test("tools listed for an actor call as that actor", async () => {
    const bob = { kind: "user", id: "bob" };
    const bobs = await aiTools(c, { surface: "mcp", actor: bob }); // the client's actor is ada
    const asked = (await bobs.orders_refund?.execute({ orderId: "o-listed", amount: 930 })) as { status: string; executionId: string; approvalId: string };
    assert.equal(asked.status, "approval-required");
    assert.deepEqual((await c.approvals.get(asked.approvalId)).actor, bob);
    const u = asked.executionId.slice(0, 36);
    assert.equal(asked.executionId, `${u}-${actorTag(bob, u)}`);
    assert.equal(((await bobs.capstan_status?.execute({ executionId: asked.executionId })) as { approvalId?: string }).approvalId, asked.approvalId);
  });

  test("the model's abort cancels the execution", async () => {
    const tools = await aiTools(c, { surface: "mcp" });
    const ac = new AbortController();
    const run = tools.email_send?.execute({ to: "x@example.com", subject: "abort", delayMs: 30_000 }, { abortSignal: ac.signal });
    setTimeout(() => { ac.abort(); }, 300);
    const err = (await run?.catch((e: unknown) => e)) as CapstanError;
    assert.equal(err.code, "ABORTED");
    const env = await c.await(err.executionId as string, { signal: bound() });
    assert.equal(env.status, "cancelled");
  });

  test("the example's scripted loop runs: echo, a failure, an approval, one resume", async () => {
    const lines: string[] = [];
    const results = await main(dev.url, (l) => lines.push(l));
    assert.deepEqual(results[0], { question: "Is capstan up?" });
    assert.equal((results[2] as { status: string }).status, "approval-required");
    assert.deepEqual(results[3], { orderId: "o-42", amount: 900, repeated: false });
    assert.equal(lines.length, 1 + 4 + 1);
  });
});

describe("expiry and start deadlines", () => {
  test("the client reads the envelope retention and caps start windows below it", () => {
    assert.equal(c.retentionMs, 10 * 3600_000);
    assert.equal(c.maxStartWithinMs, 9 * 3600_000);
    assert.equal(maxStartWithinMs(25 * 3600_000), 24 * 3600_000);
    assert.equal(maxStartWithinMs(5 * 3600_000), 4.5 * 3600_000);
  });

  test("an execution older than the retention, with nothing left of it, is EXPIRED", async () => {
    // A UUIDv7 made two days ago.
    const ms = Date.now() - 2 * 24 * 3600_000;
    const hex = ms.toString(16).padStart(12, "0");
    const id = `${hex.slice(0, 8)}-${hex.slice(8)}-7abc-8def-0123456789ab`;
    const err = (await c.await(id).catch((e: unknown) => e)) as ExpiredError;
    assert.ok(err instanceof ExpiredError, String(err));
    assert.equal(err.code, "EXPIRED");
    assert.equal(err.unknown, true);
    assert.equal(err.madeAt.getTime(), ms);
    await assert.rejects(c.status(id), (e: CapstanError) => e.code === "EXPIRED");
  });

  test("an id nothing is stored of fails at once with UNKNOWN_EXECUTION, as the CLI's await does; a cancel of it records nothing", async () => {
    const hex = (Date.now() - 60_000).toString(16).padStart(12, "0");
    for (const id of ["not-a-uuid", `${hex.slice(0, 8)}-${hex.slice(8)}-7abc-8def-0123456789ab`]) { // a UUIDv7 of a minute ago
      await assert.rejects(c.await(id, { signal: bound() }), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
      await assert.rejects(c.status(id), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
      await assert.rejects(c.cancel(id), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
      await assert.rejects(c.status(id), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION"); // nothing recorded
    }
    // An id made a moment ago may name a request on its way: asked again once two seconds old.
    await assert.rejects(c.await(newExecutionId(), { signal: bound() }), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
  });

  test("a cancel of an execution that ended says so, with its outcome", async () => {
    const env = await c.call("demo.echo", { n: 1 }, { signal: bound() });
    const r = await c.cancel(env.executionId);
    assert.equal(r.finalized, true);
    assert.equal(r.status, "completed");
  });

  test("a request no worker starts by its start deadline ends NOT_STARTED", async () => {
    mail.kill("SIGTERM");
    await new Promise((r) => mail.once("exit", r));
    const env = await c.call("email.send", { to: "ada@example.com", subject: "nobody serves me" }, { startWithinMs: 500, signal: bound() });
    assert.equal(env.status, "failed");
    assert.deepEqual(forModel(env), {
      code: "NOT_STARTED",
      message: "No worker started the operation before its start deadline; it never ran.",
      retryable: false,
    });
    assert.equal(env.attempts, 0);
  });

  test("a call no worker has taken yet is queued, not unknown: the status tool says so, then reads its result", async () => {
    // The mail pool has no worker since the test above: email.send waits in its stream.
    const id = await c.submit("email.send", { to: "ada@example.com", subject: "queued" }, { id: executionIdFor({ kind: "user", id: "ada" }) });
    const tools = await aiTools(c, { surface: "mcp" });
    const status = tools.capstan_status;
    assert.ok(status !== undefined);
    assert.deepEqual(await status.execute({ executionId: id }), {
      status: "running",
      executionId: id,
      state: "queued",
      next: "Queued: no worker has taken it yet. Call capstan_status again later.",
    });
    // status itself knows nothing of it yet; the workers do.
    await assert.rejects(c.status(id), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION");
    const v = await c.execution(id, { probe: true });
    assert.deepEqual([v.executionId, v.state, v.principal], [id, "queued", "_anon"]);
    // An id nothing is stored of is not found, by the tool and by the workers.
    const none = executionIdFor({ kind: "user", id: "ada" });
    assert.deepEqual(await status.execute({ executionId: none }), {
      error: { code: "NOT_FOUND", message: "No such execution, or its result is no longer kept.", retryable: false },
    });
    assert.equal((await c.execution(none, { probe: true })).state, "unknown");
    await assert.rejects(c.execution(none), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION" && e.conditions.includes("unknown"));

    mail = await dev.worker("mail", ["email.send"]);
    const env = await c.await(id, { signal: bound() });
    assert.equal(env.status, "completed", JSON.stringify(forModel(env)));
    assert.deepEqual(await status.execute({ executionId: id }), env.output);
    const ended = await c.execution(id);
    assert.equal(ended.state, "ended");
    assert.equal(ended.envelope?.status, "completed");
    assert.equal(ended.record?.state, "finalized");
  });
});
