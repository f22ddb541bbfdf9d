// A recovered outcome (docs/design.md §5): the envelope Go wrote decodes
// with how it was recovered, and a model is told so, as Go's
// Recovered.ForModel says it, beside the output.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { forTheModel } from "../src/ai.js";
import * as wire from "../src/wire.js";
import { vectorsDir } from "./capstan.js";

describe("recovered outcomes", () => {
  test("the envelope Go wrote says how it was recovered", () => {
    const b = readFileSync(join(vectorsDir, "go", "envelope-recovered.msgpack"));
    const env = wire.decodeWith<wire.Envelope>(wire.envelopeSchema, new Uint8Array(b));
    assert.deepEqual(env.recovered, { how: "receipt", attempt: 1 });
    assert.deepEqual(Buffer.from(wire.encodeWith(wire.envelopeSchema, env)), b);
  });

  test("a record's receipt and reconciliation counts decode", () => {
    const b = readFileSync(join(vectorsDir, "go", "record-receipt.msgpack"));
    const rec = wire.decodeWith<wire.ExecutionRecord>(wire.recordSchema, new Uint8Array(b));
    assert.equal(rec.receiptAttempt, 2);
    assert.equal(rec.reattempts, 1);
    const r = readFileSync(join(vectorsDir, "go", "record-reconciling.msgpack"));
    const reconciling = wire.decodeWith<wire.ExecutionRecord>(wire.recordSchema, new Uint8Array(r));
    assert.equal(reconciling.state, "reconciling");
    assert.equal(reconciling.reconciliations, 2);
  });

  test("the model is told how, and not to call again; an outcome not recovered is the output alone", () => {
    const base: wire.Envelope = { v: 1, executionId: "x", capabilityId: "email.send", status: "completed", output: { outboxSeq: 7 }, attempts: 1, durationMs: 1 };
    assert.deepEqual(forTheModel(base), { outboxSeq: 7 });
    assert.equal(wire.recoveredForModel(base), undefined);
    for (const [how, says] of [
      ["receipt", "recovered from the receipt"],
      ["reconciler", "recovered by checking the system where the effect lives"],
    ] as const) {
      const env = { ...base, recovered: { how, attempt: 2 } };
      const note = wire.recoveredForModel(env) ?? "";
      assert.ok(note.includes(says) && note.includes("attempt 2") && note.includes("Do not call it again"), note);
      if (how === "reconciler") {
        // Go's Recovered.ForModel, word for word (its ExampleWithRecovery prints it).
        assert.equal(
          note,
          "The operation took effect (attempt 2). Its worker was lost before reporting the result; this result was recovered by checking the system where the effect lives. Do not call it again to make sure.",
        );
      }
      assert.deepEqual(forTheModel(env), { status: "completed", executionId: "x", output: { outboxSeq: 7 }, recovered: how, note });
    }
  });
});
