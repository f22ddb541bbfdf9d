// Execution ids that name their actor, made and checked as the MCP bridge
// makes and checks its own (mcpbridge/approval.go: executionIDFor, owns): a
// UUIDv7, "-", then a tag of 32 hex digits, the first 16 bytes of
// SHA-256(uuid + NUL + kind:id). The AI SDK tools answer an execution only
// to the actor its id's tag names, without reading anything. The tag needs
// no secret: an actor cannot make another's id carry its own tag, and the id
// is part of the execution's key. The vectors Go's tests check
// (mcpbridge/testdata/actor-tags.json) are this client's too.

import { createHash, timingSafeEqual } from "node:crypto";
import { newExecutionId, type Actor } from "./wire.js";

const uuidLength = 36;
const tagLength = 32;

/** The tag of uuid u for actor; the actor's attributes are no part of it. */
export function actorTag(actor: Actor, u: string): string {
  return createHash("sha256")
    .update(`${u}\0${actor.kind ?? ""}:${actor.id ?? ""}`)
    .digest("hex")
    .slice(0, tagLength);
}

/** A new execution id that names actor. */
export function executionIdFor(actor: Actor): string {
  const u = newExecutionId();
  return `${u}-${actorTag(actor, u)}`;
}

/** Whether id is a uuid tagged for actor. An id without a tag names no actor. */
export function namesActor(actor: Actor, id: string): boolean {
  if (id.length !== uuidLength + 1 + tagLength || id[uuidLength] !== "-") return false;
  const have = Buffer.from(id.slice(uuidLength + 1));
  const want = Buffer.from(actorTag(actor, id.slice(0, uuidLength)));
  return have.length === want.length && timingSafeEqual(have, want);
}
