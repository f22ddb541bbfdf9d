// The client against a real `capstan dev --auth`, with the principals
// `capstan auth add` made: a producer acts as its principal (its inbox
// prefix, its subjects, its keys), an approver decides, and neither can
// reach what its credentials do not allow.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { credsAuthenticator, type NatsConnection } from "@nats-io/nats-core";
import { connect as natsConnect } from "@nats-io/transport-node";
import { CapabilityError, CapstanError, connect, forModel, newExecutionId, principalFromCreds, type Client } from "../src/index.js";
import { Names } from "../src/names.js";
import { MsgIds } from "../src/msgid.js";
import { encodeRequest } from "../src/wire.js";
import { jetstream } from "@nats-io/jetstream";
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);
import { startDev, type Dev } from "./capstan.js";

const bound = (): AbortSignal => AbortSignal.timeout(60_000); // a failure guard, not a measure

let dev: Dev;
let alice: Client;
let bob: Client;
let carol: Client;

before(async () => {
  dev = await startDev({ auth: true });
  alice = await connect({ servers: dev.url, creds: dev.creds("alice"), actor: { kind: "user", id: "alice" } });
  bob = await connect({ servers: dev.url, creds: readFileSync(dev.creds("bob")), actor: { kind: "user", id: "bob" } });
  carol = await connect({ servers: dev.url, creds: dev.creds("carol") });
});

after(async () => {
  await Promise.all([alice?.close(), bob?.close(), carol?.close()]);
  await dev?.stop();
});

describe("progress", () => {
  test("a producer follows its own execution's progress; another may not subscribe to it", async () => {
    const seen: number[] = [];
    const env = await alice.call("demo.report", { pages: 4, pageMs: 100 }, { signal: bound(), onProgress: (p) => seen.push(p.done ?? 0) });
    assert.equal(env.status, "completed");
    assert.ok(seen.length >= 2, `${seen.length} reports`);
    // bob's credentials refuse a subscription to alice's progress: the
    // server says so on his connection.
    const nc = await natsConnect({ servers: dev.url, authenticator: credsAuthenticator(readFileSync(dev.creds("bob"))), inboxPrefix: new Names().inboxPrefix("bob") });
    try {
      const refused = new Promise<string>((resolve) => {
        nc.subscribe("capstan.progress.alice.>", { callback: (err) => { if (err !== null) resolve(err.message); } });
        setTimeout(() => { resolve("no refusal"); }, 30_000).unref();
      });
      await nc.flush();
      assert.match(await refused, /Permissions Violation for Subscription to "capstan\.progress\.alice\.>"/);
    } finally {
      await nc.close();
    }
  });
});

describe("principals", () => {
  test("each client acts as the principal its credentials name, under its inbox prefix", () => {
    assert.equal(principalFromCreds(readFileSync(dev.creds("alice"))), "alice");
    assert.equal(alice.principal, "alice");
    assert.equal(bob.principal, "bob");
    assert.equal(carol.principal, "carol");
    assert.equal(alice.retentionMs, 25 * 3600_000); // read from the catalog, as a producer may
  });

  test("a call runs as the principal's actor; its record names it", async () => {
    const env = await alice.call("demo.echo", { hi: 1 }, { signal: bound() });
    assert.equal(env.status, "completed");
    assert.deepEqual(env.output, { hi: 1 });
    const s = await alice.status(env.executionId);
    assert.equal(s.record?.actor, "user:alice");
  });

  test("an actor the grant does not give is FORBIDDEN, in the envelope", async () => {
    const env = await alice.call("demo.echo", {}, { actor: { kind: "user", id: "bob" }, signal: bound() });
    assert.equal(env.status, "failed");
    assert.equal(forModel(env)?.code, "FORBIDDEN");
  });

  test("a capability outside the grant is refused by the server: transport, with the permission as cause", async () => {
    const err = (await bob.call("demo.flaky", { failTimes: 0 }, { signal: bound() }).catch((e: unknown) => e)) as CapstanError;
    assert.ok(err instanceof CapstanError, String(err));
    assert.equal(err.code, "TRANSPORT");
    assert.match((err.cause as Error).message, /[Pp]ermission/);
  });

  test("one principal's execution is neither readable nor cancellable by another", async () => {
    const id = await alice.submit("email.send", { to: "a@example.com", subject: "mine", holdMs: 1500 });
    await assert.rejects(bob.status(id), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION"); // bob reads bob's key
    await bob.cancel(id).catch(() => undefined); // recorded, if at all, under bob's own key
    const env = await alice.await(id, { signal: bound() });
    assert.equal(env.status, "completed");
  });

  test("the same id under two principals is two executions", async () => {
    const id = newExecutionId();
    const [a, b] = await Promise.all([
      alice.call("demo.echo", { who: "alice" }, { id, signal: bound() }),
      bob.call("demo.echo", { who: "bob" }, { id, signal: bound() }),
    ]);
    assert.deepEqual(a.output, { who: "alice" });
    assert.deepEqual(b.output, { who: "bob" });
  });
});

describe("quotas", () => {
  // As an operator changes them: capstan auth set, then auth push to the
  // running deployment; no worker restarts.
  const setQueued = async (n: number): Promise<void> => {
    if (dev.secrets === undefined) throw new Error("no secrets");
    await run(dev.bin, ["auth", "set", dev.secrets, "alice", "--quota-queued", String(n)]);
    await run(dev.bin, ["auth", "push", dev.secrets, "--nats", dev.url]);
  };

  test("over its queue quota a producer is refused QUOTA_EXCEEDED at the door, naming the quota and its limit; another is served", async () => {
    await setQueued(2);
    try {
      // Two held calls wait in alice's queue (running, not yet ended).
      const held = [
        await alice.submit("email.send", { to: "q1@example.com", subject: "held", holdMs: 3000 }),
        await alice.submit("email.send", { to: "q2@example.com", subject: "held", holdMs: 3000 }),
      ];
      const q = await alice.queue({ signal: bound() });
      assert.equal(q.principal, "alice");
      assert.equal(q.maxRequests, 2);
      assert.equal(q.requests, 2);

      const err = (await alice.submit("demo.echo", { over: true }).catch((e: unknown) => e)) as CapabilityError;
      assert.ok(err instanceof CapabilityError, String(err));
      assert.equal(err.code, "QUOTA_EXCEEDED");
      assert.equal(err.retryable, true);
      assert.deepEqual(err.details, { quota: "queuedRequests", limit: 2, retryAfterMs: 1000 });

      const env = await alice.call("demo.echo", { over: true }, { signal: bound() });
      assert.equal(env.status, "failed");
      assert.deepEqual(forModel(env), { code: "QUOTA_EXCEEDED", message: env.error?.message, retryable: true,
        details: { quota: "queuedRequests", limit: 2, retryAfterMs: 1000 } });
      await assert.rejects(alice.status(env.executionId), (e: CapstanError) => e.code === "UNKNOWN_EXECUTION"); // never stored

      const mine = await bob.call("demo.echo", { who: "bob" }, { signal: bound() });
      assert.equal(mine.status, "completed");
      for (const id of held) assert.equal((await alice.await(id, { signal: bound() })).status, "completed");
    } finally {
      await setQueued(10_000);
    }
  });
});

describe("approvals with authentication", () => {
  test("alice asks, carol approves, alice resumes once", async () => {
    const env = await alice.call("orders.refund", { orderId: "o-9", amount: 900 }, { signal: bound() });
    assert.equal(env.status, "approval-required");
    const approvalId = env.approval?.id as string;

    // The producer follows its own approvals; it decides none.
    const mine = await alice.approvals.list({ status: "pending" });
    assert.ok(mine.records.some((a) => a.id === approvalId));
    await assert.rejects(alice.approvals.decide(approvalId, { approve: true }), (e: CapstanError) =>
      e.code === "TRANSPORT" && /Permissions Violation for Publish to "capstan.approvals.decide.alice"/.test(e.message),
    );

    // A resume before the decision is refused in an envelope.
    const early = await alice.resume(approvalId, { signal: bound() });
    assert.equal(early.error?.code, "APPROVAL_PENDING");

    const seen = await carol.approvals.list({ status: "pending", capabilityId: "orders.refund" });
    const pending = seen.records.find((a) => a.id === approvalId);
    assert.deepEqual(pending?.input, { amount: 900, orderId: "o-9" });
    const decided = await carol.approvals.decide(approvalId, { approve: true, comment: "checked" });
    assert.equal(decided.status, "approved");
    assert.equal(decided.decision?.approver?.id, "carol");
    await assert.rejects(carol.approvals.decide(approvalId, { approve: false }), (e: CapstanError) =>
      e.code === "REFUSED" && e.conditions.includes("already_decided"),
    );

    // The approver cannot run it.
    await assert.rejects(carol.resume(approvalId, { signal: bound() }), (e: CapstanError) =>
      e.code === "TRANSPORT" && /Permissions Violation for Publish to "capstan.exec.carol._unrouted"/.test(e.message),
    );
    // Bob, who did not ask for it, is told no such approval.
    const stranger = await bob.resume(approvalId, { signal: bound() });
    assert.deepEqual(forModel(stranger), { code: "FORBIDDEN", message: "No such approval.", retryable: false });

    const done = await alice.resume(approvalId, { signal: bound() });
    assert.equal(done.status, "completed");
    assert.deepEqual(done.output, { orderId: "o-9", amount: 900, repeated: false });
    const twice = await alice.resume(approvalId, { signal: bound() });
    assert.equal(twice.error?.code, "APPROVAL_CONSUMED");
  });

  test("a rejected approval ends its resume APPROVAL_REJECTED", async () => {
    const env = await alice.call("orders.refund", { orderId: "o-10", amount: 700 }, { signal: bound() });
    const approvalId = env.approval?.id as string;
    const rejected = await carol.approvals.decide(approvalId, { approve: false, comment: "no" });
    assert.equal(rejected.status, "rejected");
    const r = await alice.resume(approvalId, { signal: bound() });
    assert.equal(r.error?.code, "APPROVAL_REJECTED");
  });
});

describe("request message ids", () => {
  test("the client tags a request's message id as the Go client does: Go's submit, then the same id from TypeScript, is a duplicate", async () => {
    const raw = await natsConnect({
      servers: dev.url,
      authenticator: credsAuthenticator(readFileSync(dev.creds("alice"))),
      inboxPrefix: new Names().inboxPrefix("alice"),
    });
    try {
      const id = newExecutionId();
      const { stdout } = await run(dev.bin, ["submit", "demo.echo", "--nats", dev.url, "--creds", dev.creds("alice"), "--id", id, "--input", "{}"]);
      assert.equal(stdout.trim(), id);
      const msgId = MsgIds.fromConnection(raw).request("alice", id);
      assert.match(msgId, new RegExp(`^alice\\.${id}\\.[0-9a-f]{16}$`));
      const req = { v: 1, executionId: id, capabilityId: "demo.echo", actor: { kind: "user", id: "alice" }, surface: "direct", submittedAt: new Date().toISOString() };
      const ack = await jetstream(raw).publish("capstan.exec.alice.demo.echo", encodeRequest(req), { msgID: msgId });
      assert.equal(ack.duplicate, true);
      const env = await alice.await(id, { signal: bound() });
      assert.equal(env.status, "completed");
    } finally {
      await raw.close();
    }
  });
});

describe("replies aimed at a principal's envelope subject", () => {
  let raw: NatsConnection;
  before(async () => {
    raw = await natsConnect({
      servers: dev.url,
      authenticator: credsAuthenticator(readFileSync(dev.creds("alice"))),
      inboxPrefix: new Names().inboxPrefix("alice"),
    });
  });
  after(async () => {
    await raw?.close();
  });

  test("the answer to a request aimed at the subject of an awaited execution is not taken as its envelope", async () => {
    const done = await alice.call("demo.echo", { mine: "done" }, { signal: bound() });
    const id = await alice.submit("email.send", { to: "a@example.com", subject: "wait", holdMs: 1000 });
    const wait = alice.await(id, { signal: bound() });
    // A direct get of alice's finished envelope, answered on the subject
    // where the server republishes the awaited one's.
    raw.publish(`$JS.API.DIRECT.GET.KV_CAPSTAN_ENVELOPES.$KV.CAPSTAN_ENVELOPES.alice.${done.executionId}`, undefined, {
      reply: `capstan.envelope.alice.${id}`,
    });
    await raw.flush();
    const env = await wait;
    assert.equal(env.executionId, id);
    assert.equal(env.capabilityId, "email.send");
  });
});

describe("pages and quotas", () => {
  test("an approver's inbox is paged: each page's next is where the next one begins", async () => {
    const asked: string[] = [];
    for (const order of ["p-1", "p-2", "p-3"]) {
      const env = await alice.call("orders.refund", { orderId: order, amount: 900 }, { signal: bound() });
      assert.equal(env.status, "approval-required");
      asked.push(env.approval?.id as string);
    }
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let pages = 0; ; pages++) {
      assert.ok(pages < 100, "the listing never ends");
      const page = await carol.approvals.list({ status: "pending", limit: 1, ...(cursor === undefined ? {} : { cursor }) });
      assert.ok(page.records.length <= 1);
      seen.push(...page.records.map((r) => r.id));
      if (page.next === undefined) break;
      cursor = page.next;
    }
    for (const id of asked) assert.equal(seen.filter((s) => s === id).length, 1, `approval ${id} listed once`);
  });

  test("alice's flood of listings is refused beyond her quota with QUOTA_EXCEEDED and its figures; bob is served", async () => {
    const results = await Promise.allSettled(Array.from({ length: 600 }, () => alice.approvals.list({ limit: 1 })));
    const refused = results.filter((r) => r.status === "rejected");
    assert.ok(refused.length > 0, "600 listings at once, none refused");
    for (const r of refused) {
      const e = r.reason as CapabilityError;
      assert.ok(e instanceof CapabilityError, String(e));
      assert.equal(e.code, "QUOTA_EXCEEDED");
      assert.equal(e.details?.quota, "controlPerSecond");
      assert.equal(e.details?.limit, 50);
      assert.ok(typeof e.details?.retryAfterMs === "number" && e.retryable);
      assert.equal(e.forModel().code, "QUOTA_EXCEEDED");
    }
    const bobs = await bob.approvals.list();
    assert.ok(Array.isArray(bobs.records));
  });
});
