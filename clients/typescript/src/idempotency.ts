// An execution's idempotency key (docs/wire.md, "Ids"; Go:
// envelope.IdempotencyKey): what a handler is given and what the system
// where its effect lives stores, so that a repeated attempt changes nothing.
// A service written in TypeScript that looks effects up by key derives it
// here, as Go does.

import { createHash } from "node:crypto";
import { key } from "./names.js";

/**
 * The idempotency key of principal's execution executionId: hex of the
 * first 16 bytes of SHA-256("capstan/idempotency/v2/" + principal + "." +
 * executionId). Two principals' executions of one id have two keys; on a
 * server without authentication the principal is "_anon".
 */
export function idempotencyKey(principal: string, executionId: string): string {
  return derived(`capstan/idempotency/v2/${key(principal, executionId)}`);
}

/**
 * The key of an execution begun before key versions (version 1): the
 * execution id's alone, the same for every principal. Such an execution
 * keeps it until it ends (its record names no keyVersion).
 */
export function idempotencyKeyFromId(executionId: string): string {
  return derived(`capstan/idempotency/v1/${executionId}`);
}

/** The key the derivation version gives: 0 (a record that names none) and 1 the id alone, 2 the principal's and the id's. */
export function idempotencyKeyOf(version: number, principal: string, executionId: string): string {
  return version <= 1 ? idempotencyKeyFromId(executionId) : idempotencyKey(principal, executionId);
}

function derived(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex").slice(0, 32);
}
