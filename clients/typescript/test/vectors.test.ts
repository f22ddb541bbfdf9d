// The golden vectors of docs/wire.md, shared with the Go codec: every record
// Go wrote decodes to what its description says and encodes again to the
// same bytes; every vector to refuse is refused; and the requests this client
// writes are the ones committed in testdata/ts, which Go's tests read.
// UPDATE_VECTORS=1 writes testdata/ts anew.

import assert from "node:assert/strict";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { parseJSON, stringifyJSON } from "../src/json.js";
import { decodeValue, DecodeError, encodeValue } from "../src/msgpack.js";
import * as wire from "../src/wire.js";
import { repoRoot, vectorsDir } from "./capstan.js";
import { fromSeed } from "@nats-io/nkeys";
import { nkeyAuthenticator } from "@nats-io/nats-core";
import type { NatsConnection } from "@nats-io/nats-core";
import { MsgIds, msgIdKeyText } from "../src/msgid.js";
import { idempotencyKey, idempotencyKeyFromId, idempotencyKeyOf } from "../src/idempotency.js";
import { actorTag, executionIdFor, namesActor } from "../src/owner.js";

interface Vector {
  name: string;
  kind: string;
  file: string;
  about: string;
  value?: unknown;
  canonical?: string;
  refused?: string;
}

const codecs: Record<string, { decode: (b: Uint8Array) => unknown; encode: (v: never) => Uint8Array }> = {
  request: { decode: wire.decodeRequest, encode: wire.encodeRequest },
  envelope: { decode: wire.decodeEnvelope, encode: wire.encodeEnvelope },
  record: { decode: wire.decodeExecutionRecord, encode: wire.encodeRecord },
  descriptor: { decode: wire.decodeDescriptor, encode: wire.encodeDescriptor },
  resources: { decode: wire.decodeResources, encode: wire.encodeResources },
  describeRequest: { decode: wire.decodeDescribeRequest, encode: wire.encodeDescribeRequest },
  describeReply: { decode: wire.decodeDescribeReply, encode: wire.encodeDescribeReply },
  decideRequest: { decode: wire.decodeDecideRequest, encode: wire.encodeDecideRequest },
  decideReply: { decode: wire.decodeDecideReply, encode: wire.encodeDecideReply },
  listRequest: { decode: wire.decodeListRequest, encode: wire.encodeListRequest },
  listReply: { decode: wire.decodeListReply, encode: wire.encodeListReply },
  approval: { decode: wire.decodeApproval, encode: wire.encodeApproval },
  progress: { decode: wire.decodeProgress, encode: wire.encodeProgress },
};

/** Reads a vectors.json, its numbers exact. */
function readDescription(dir: string): { vectors: Vector[] } {
  return parseJSON(readFileSync(join(dir, "vectors.json"), "utf8")) as { vectors: Vector[] };
}

/**
 * A decoded record as the JSON its description holds: values in their JSON
 * form (Uint8Array as base64, bigint exact), then every empty field dropped
 * (msgpack records leave them out; encoding/json writes those without
 * omitempty).
 */
function comparable(v: unknown): unknown {
  return prune(parseJSON(stringifyJSON(v)));
}

function prune(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(prune);
  if (v !== null && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      const p = prune(x);
      if (!isEmpty(p)) out[k] = p;
    }
    return out;
  }
  return v;
}

function isEmpty(v: unknown): boolean {
  if (v === null || v === undefined || v === false || v === 0 || v === "" || v === "0001-01-01T00:00:00Z") return true;
  if (Array.isArray(v)) return v.length === 0;
  return typeof v === "object" && Object.keys(v).length === 0;
}

describe("golden vectors written by Go", () => {
  const dir = join(vectorsDir, "go");
  const desc = readDescription(dir);
  test("there are vectors of every kind", () => {
    const kinds = new Set(desc.vectors.map((v) => v.kind));
    assert.deepEqual([...kinds].sort(), Object.keys(codecs).sort());
    assert.ok(desc.vectors.some((v) => v.refused !== undefined));
  });
  for (const v of desc.vectors) {
    test(`${v.name}: ${v.about}`, () => {
      const codec = codecs[v.kind];
      assert.ok(codec, `kind ${v.kind}`);
      const bytes = readFileSync(join(dir, v.file));
      if (v.refused !== undefined) {
        assert.equal(v.refused, "DECODE");
        assert.throws(() => codec.decode(bytes), wire.DecodeError);
        return;
      }
      const got = codec.decode(bytes);
      assert.deepEqual(comparable(got), prune(v.value));
      const again = codec.encode(got as never);
      const want = readFileSync(join(dir, v.canonical ?? v.file));
      assert.equal(Buffer.from(again).toString("hex"), want.toString("hex"));
    });
  }
});

describe("values", () => {
  test("a decoded value holds its exact integers, binary and times", () => {
    const env = wire.decodeEnvelope(readFileSync(join(vectorsDir, "go", "envelope-completed-values.msgpack")));
    const out = env.output as Record<string, unknown>;
    assert.equal(out.maxUint64, 18446744073709551615n);
    assert.equal(out.minInt64, -9223372036854775808n);
    assert.equal(out.beyondSafe, 9007199254740993n);
    assert.equal(out.safe, 9007199254740991);
    assert.equal(out.whole, 3);
    assert.equal(out.single, 0.25);
    assert.deepEqual(out.bytes, new Uint8Array([0, 1, 0xfe, 0xff]));
    assert.equal(out.when, "2026-03-14T15:09:26.535897932Z");
    assert.equal(out.text, "héllo, 世界 😀");
  });

  test("values nest up to 10,000 levels, as Go's decoder allows, and no deeper", () => {
    const nested = (depth: number): Uint8Array => {
      const b = new Uint8Array(depth + 1).fill(0x91, 0, depth);
      b[depth] = 0x01;
      return b;
    };
    let v = decodeValue(nested(10000));
    for (let i = 0; i < 10000; i++) v = (v as unknown[])[0];
    assert.equal(v, 1);
    assert.throws(() => decodeValue(nested(10001)), DecodeError);
    assert.throws(() => decodeValue(new Uint8Array([0xdd, 0xff, 0xff, 0xff, 0xff])), DecodeError); // a crafted length
  });

  test("a changed value is encoded from the value, not from the bytes it came in", () => {
    const env = wire.decodeEnvelope(readFileSync(join(vectorsDir, "go", "envelope-completed.msgpack")));
    env.output = { changed: true };
    assert.deepEqual(wire.decodeEnvelope(wire.encodeEnvelope(env)).output, { changed: true });
  });

  test("values are encoded as Go encodes them: compact integers, float64, keys sorted by UTF-8 bytes", () => {
    const hex = (v: unknown): string => Buffer.from(encodeValue(v)).toString("hex");
    assert.equal(hex(1), "01");
    assert.equal(hex(-1), "ff");
    assert.equal(hex(-33), "d0df");
    assert.equal(hex(200), "ccc8");
    assert.equal(hex(70000), "ce00011170");
    assert.equal(hex(2 ** 40), "cf0000010000000000");
    assert.equal(hex(5n), "05"); // a bigint in the fewest bytes too
    assert.equal(hex(18446744073709551615n), "cfffffffffffffffff");
    assert.equal(hex(1.5), "cb3ff8000000000000");
    assert.equal(hex({ "😀": 1, "～": 2, b: 3, "10": 4, "9": 5 }), "85a23130" + "04" + "a13905" + "a16203" + "a3efbd9e02" + "a4f09f988001");
    // 2026-03-14T15:09:26.5Z: 500,000,000 ns << 34 | 1773500966 s, in 8 bytes; whole seconds in 4.
    assert.equal(hex(new Date(Date.UTC(2026, 2, 14, 15, 9, 26, 500))), "d7ff" + ((500_000_000n << 34n) | 1773500966n).toString(16).padStart(16, "0"));
    assert.equal(hex(new Date(Date.UTC(2026, 2, 14, 15, 9, 26))), "d6ff" + (1773500966).toString(16).padStart(8, "0"));
    assert.equal(hex({ a: undefined, b: [undefined] }), "81a16291c0");
    for (const bad of [NaN, Infinity, () => 1, Symbol("x"), 2n ** 64n, new Date(NaN)]) {
      assert.throws(() => encodeValue([bad]), TypeError);
    }
    assert.equal(hex({ f: () => 1 }), "80"); // a function property is left out, as JSON.stringify leaves it
  });
});

/** The requests this client writes, for Go's TestVectors_TypeScript. */
function tsVectors(): { v: Vector; value: object; encode: (v: never) => Uint8Array }[] {
  const t = "2026-03-14T15:09:26.535897932Z";
  const id = "0195f3c2-7a1e-7b4d-8c2f-3e5a6b7c8d9e";
  const approvalId = "0195f3c2-7b00-7e22-a1b2-c3d4e5f60718";
  const req = (about: string, name: string, r: wire.Request) => ({
    v: { name, kind: "request", file: `${name}.msgpack`, about },
    value: r,
    encode: wire.encodeRequest,
  });
  return [
    req("a call as the client makes it", "ts-request-call", {
      v: 1,
      executionId: id,
      capabilityId: "orders.refund",
      input: { orderId: "o-42", amount: 900, ratio: 0.5, note: "vérifié ✓ 😀", tags: ["a", "b"], nested: { z: [true, false, null] } },
      actor: { kind: "user", id: "alice", attrs: { "😀": "emoji", "～": "tilde", tenant: "acme" } },
      surface: "direct",
      correlationId: "conv-7",
      submittedAt: t,
      deadline: "2026-03-14T15:10:26.535897932Z",
      startBy: "2026-03-15T15:09:26.535897932Z",
      traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }),
    req("an input of every kind of value the client sends", "ts-request-values", {
      v: 1,
      executionId: id,
      capabilityId: "demo.echo",
      input: {
        maxUint64: 18446744073709551615n,
        minInt64: -9223372036854775808n,
        beyondSafe: 9007199254740993n,
        safe: 9007199254740991,
        small: 7,
        negative: -33,
        half: 1.5,
        bytes: new Uint8Array([0, 1, 0xfe, 0xff]),
        when: new Date(Date.UTC(2026, 2, 14, 15, 9, 26, 535)),
        nothing: null,
        list: [1, "two", 3.5, null, [], {}],
        "10": "an integer-like key sorts as text",
      },
      submittedAt: "2026-03-14T15:09:26Z",
    }),
    req("a resume naming only its approval", "ts-request-resume", {
      v: 1,
      executionId: id,
      capabilityId: "",
      submittedAt: t,
      startBy: "2026-03-15T15:09:26.535897932Z",
      approvalId,
    }),
    req("times before 1970 and after 2514 (12-byte timestamps)", "ts-request-times", {
      v: 1,
      executionId: id,
      capabilityId: "demo.echo",
      submittedAt: "1969-07-20T20:17:40Z",
      deadline: "2600-01-02T03:04:05.000000006Z",
    }),
    {
      v: { name: "ts-describe-request", kind: "describeRequest", file: "ts-describe-request.msgpack", about: "a describe" },
      value: { v: 1, surface: "mcp", actor: { kind: "user", id: "ada" }, scope: { prefix: "orders.", tags: ["money"] } },
      encode: wire.encodeDescribeRequest,
    },
    {
      v: { name: "ts-decide-request", kind: "decideRequest", file: "ts-decide-request.msgpack", about: "an approver's decision" },
      value: { v: 1, approvalId, approve: true, comment: "vérifié ✓" },
      encode: wire.encodeDecideRequest,
    },
    {
      v: { name: "ts-list-request", kind: "listRequest", file: "ts-list-request.msgpack", about: "the pending approvals" },
      value: { v: 1, status: "pending" },
      encode: wire.encodeListRequest,
    },
  ];
}

describe("requests this client writes, read by Go", () => {
  const dir = join(vectorsDir, "ts");
  const vectors = tsVectors();
  if (process.env.UPDATE_VECTORS === "1") {
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    const desc = {
      about:
        "Records as the TypeScript client writes them (clients/typescript, UPDATE_VECTORS=1 npm test). Go's TestVectors_TypeScript decodes each, compares it with value and encodes it again to the same bytes.",
      vectors: vectors.map(({ v, value, encode }) => {
        const bytes = encode(value as never);
        writeFileSync(join(dir, v.file), bytes);
        const decoded = codecs[v.kind]?.decode(bytes);
        return { ...v, value: parseJSON(stringifyJSON(decoded)), canonical: v.file };
      }),
    };
    writeFileSync(join(dir, "vectors.json"), stringifyJSON(desc, 2) + "\n");
  }
  for (const { v, value, encode } of vectors) {
    test(`${v.name}: the client writes the committed bytes`, () => {
      const have = readFileSync(join(dir, v.file));
      assert.equal(Buffer.from(encode(value as never)).toString("hex"), have.toString("hex"));
      const decoded = codecs[v.kind]?.decode(have);
      assert.equal(Buffer.from(encode(decoded as never)).toString("hex"), have.toString("hex"));
    });
  }
});

describe("request message ids", () => {
  const vectors = parseJSON(readFileSync(join(vectorsDir, "go", "msgids.json"), "utf8")) as {
    seed: string;
    principal: string;
    executionId: string;
    msgId: string;
    unsigned: string;
  }[];
  test("a connection that signs makes Go's tagged ids; one that does not, the key alone", () => {
    assert.ok(vectors.length > 0);
    for (const v of vectors) {
      const seed = new TextEncoder().encode(v.seed);
      const bySignature = MsgIds.fromSignature(fromSeed(seed).sign(new TextEncoder().encode(msgIdKeyText)));
      assert.equal(bySignature.request(v.principal, v.executionId), v.msgId);
      // As a connection's authenticator signs a server's nonce.
      const nc = { options: { authenticator: nkeyAuthenticator(seed) } } as unknown as NatsConnection;
      assert.equal(MsgIds.fromConnection(nc).request(v.principal, v.executionId), v.msgId);
      const open = { options: { authenticator: () => ({}) } } as unknown as NatsConnection;
      assert.equal(MsgIds.fromConnection(open).request(v.principal, v.executionId), v.unsigned);
    }
  });
});

describe("idempotency keys", () => {
  const vectors = parseJSON(readFileSync(join(vectorsDir, "go", "idempotency-keys.json"), "utf8")) as {
    principal: string;
    executionId: string;
    key: string;
    keyV1: string;
  }[];
  test("the client derives Go's keys: the principal's and the id's together, and the id-alone key of earlier executions", () => {
    assert.ok(vectors.length > 0);
    for (const v of vectors) {
      assert.equal(idempotencyKey(v.principal, v.executionId), v.key);
      assert.equal(idempotencyKeyOf(2, v.principal, v.executionId), v.key);
      assert.equal(idempotencyKeyFromId(v.executionId), v.keyV1);
      for (const old of [0, 1]) assert.equal(idempotencyKeyOf(old, v.principal, v.executionId), v.keyV1);
    }
    const [a, b] = [idempotencyKey("alice", "refund-42"), idempotencyKey("bob", "refund-42")];
    assert.notEqual(a, b, "two principals' executions of one id share a key");
  });
});

describe("actor tags", () => {
  // Written by the MCP bridge's tests (mcpbridge: TestActorTag_Vectors) from its actorTag.
  const vectors = parseJSON(readFileSync(join(repoRoot, "mcpbridge", "testdata", "actor-tags.json"), "utf8")) as {
    uuid: string;
    actor: wire.Actor;
    tag: string;
    executionId: string;
  }[];

  test("the AI SDK tools tag an execution id for its actor as the MCP bridge does", () => {
    assert.ok(vectors.length > 0);
    for (const v of vectors) {
      assert.equal(actorTag(v.actor, v.uuid), v.tag, JSON.stringify(v.actor));
      assert.ok(namesActor(v.actor, v.executionId));
      assert.equal(namesActor({ kind: v.actor.kind ?? "", id: `${v.actor.id ?? ""}x` }, v.executionId), false);
    }
    const ada = { kind: "user", id: "ada" };
    const id = executionIdFor(ada);
    assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}-[0-9a-f]{32}$/);
    assert.equal(wire.invalidExecutionId(id), undefined);
    assert.ok(namesActor(ada, id));
    assert.equal(namesActor({ kind: "user", id: "bob" }, id), false);
    for (const forged of [id.slice(0, 36), id.slice(0, -1), `${id}0`, id.toUpperCase(), `${id.slice(0, 36)}_${id.slice(37)}`]) {
      assert.equal(namesActor(ada, forged), false, forged);
    }
  });
});
