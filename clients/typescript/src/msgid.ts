// A request's message id (its Nats-Msg-Id, the key of the exec stream's
// duplicate window) names its execution: <principal>.<executionId>, then, on
// a connection that signs with an nkey (a .creds file), a dot and a tag only
// that key can make, so that no other principal can publish the id first and
// have the request dropped as a duplicate (docs/wire.md; Go: broker.MsgIDs).
// The tag is the first 16 hex digits of HMAC-SHA256(k, key), k being SHA-256
// of the connection's ed25519 signature of "capstan message id key v1": every
// connection of one principal, in Go or TypeScript, makes the same ids.

import { createHash, createHmac } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import { key } from "./names.js";

const keyText = "capstan message id key v1";
const tagLength = 16;

export class MsgIds {
  private constructor(private readonly tagKey: Buffer | undefined) {}

  /** From the signature of the key text by the connection's nkey; none: ids without a tag. */
  static fromSignature(sig: Uint8Array | undefined): MsgIds {
    return new MsgIds(sig === undefined || sig.length === 0 ? undefined : createHash("sha256").update(sig).digest());
  }

  /**
   * From the connection's own signer: its authenticator signs the key text
   * as it signs a server's nonce. A connection that does not sign (an open
   * server, a user and password, a token) makes ids without a tag.
   */
  static fromConnection(nc: NatsConnection): MsgIds {
    const auth = (nc as unknown as { options?: { authenticator?: (nonce?: string) => { sig?: unknown } | undefined } }).options?.authenticator;
    const sig = auth?.(keyText)?.sig;
    return MsgIds.fromSignature(typeof sig === "string" && sig !== "" ? Buffer.from(sig, "base64") : undefined);
  }

  /** The message id of principal's request for executionId. */
  request(principal: string, executionId: string): string {
    const k = key(principal, executionId);
    if (this.tagKey === undefined) return k;
    return `${k}.${createHmac("sha256", this.tagKey).update(k).digest("hex").slice(0, tagLength)}`;
  }
}

/** The text a connection signs to derive its tag key. */
export const msgIdKeyText = keyText;
