// A call's error is transport trouble only: every governed outcome
// (completed, failed, cancelled, approval-required) is an envelope. The codes
// below name the Go client's sentinel errors one for one (docs/wire.md,
// "Client errors").

import type { EnvelopeError, ErrorCode, ModelError } from "./wire.js";
import { forModel } from "./wire.js";

/**
 * Why a client call failed without an envelope:
 *
 * - `DECODE`: a record that does not decode, or of a schema version this
 *   client does not know (Go: envelope.ErrDecode).
 * - `TRANSPORT`: NATS or JetStream did not take or answer the request; the
 *   cause says why. A submit that failed so may still have been stored:
 *   submitting again under the same id runs it at most once.
 * - `NO_WORKERS`: no worker answered a request only workers serve (Go:
 *   executor.ErrNoWorkers).
 * - `CLOSED`: the client was closed (Go: executor.ErrClosed); the execution
 *   may still run, and another client can await its id.
 * - `ABORTED`: the caller's AbortSignal ended the wait (Go: the context's
 *   error); the execution goes on unless it was cancelled.
 * - `EXPIRED`: the execution's envelope is no longer kept (Go:
 *   executor.ErrExpired); see ExpiredError.
 * - `UNKNOWN_EXECUTION`: neither a record nor an envelope exists for the id
 *   (Go: executor.ErrNoSuchExecution).
 * - `INVALID_ARGUMENT`: an id, option or input that can never be valid (an
 *   input larger than the server takes in one message among them); nothing
 *   was sent.
 * - `REFUSED`: the workers refused a cancel, a decision or a listing; for
 *   approvals, `conditions` names why with the wire's condition names.
 * - `UNSERVED`: no live worker serves the capability called (Go:
 *   executor.ErrUnserved); see UnservedError.
 */
export type ClientErrorCode =
  | "DECODE"
  | "TRANSPORT"
  | "NO_WORKERS"
  | "CLOSED"
  | "ABORTED"
  | "EXPIRED"
  | "UNKNOWN_EXECUTION"
  | "INVALID_ARGUMENT"
  | "REFUSED"
  | "UNSERVED";

export interface CapstanErrorOptions extends ErrorOptions {
  executionId?: string;
  conditions?: string[];
}

/** Transport trouble: the request may or may not have reached capstan. */
export class CapstanError extends Error {
  override name = "CapstanError";
  readonly code: ClientErrorCode;
  /** The execution concerned, when there is one: await it again, or read its status. */
  readonly executionId: string | undefined;
  /**
   * For REFUSED approvals: the wire's condition names (not_found, pending,
   * rejected, cancelled, expired, consumed, already_decided, self_approval,
   * input_mismatch, invalid, forbidden, audit_unavailable).
   */
  readonly conditions: string[];

  constructor(code: ClientErrorCode, message: string, options: CapstanErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.executionId = options.executionId;
    this.conditions = options.conditions ?? [];
  }
}

/**
 * An execution whose envelope is no longer kept: it will never be answered.
 * Decided only for a UUIDv7 id (what the client makes), whose time says how
 * old the execution is, as the Go client decides it.
 */
export class ExpiredError extends CapstanError {
  override name = "ExpiredError";
  /** When the id was made. */
  readonly madeAt: Date;
  /** How long envelopes are kept, in milliseconds. */
  readonly retentionMs: number;
  /** The state its record still says; undefined when no record is left (the execution is then also unknown). */
  readonly state: string | undefined;
  /** A finalized record's status and code. */
  readonly status: string | undefined;
  readonly errorCode: string | undefined;

  constructor(executionId: string, madeAt: Date, retentionMs: number, record?: { state: string; status?: string; lastError?: string }) {
    let msg = `capstan: execution ${executionId} expired: its id was made ${madeAt.toISOString()}, and envelopes are kept ${retentionMs / 1000} s`;
    if (record?.status !== undefined) msg += `; its record says ${record.status}${record.lastError !== undefined ? " " + record.lastError : ""}`;
    else if (record !== undefined) msg += `; its record says ${record.state}, and the trail (capstan audit) holds its outcome`;
    super("EXPIRED", msg, { executionId });
    this.madeAt = madeAt;
    this.retentionMs = retentionMs;
    this.state = record?.state;
    this.status = record?.state === "finalized" ? record.status : undefined;
    this.errorCode = record?.state === "finalized" ? record.lastError : undefined;
  }

  /** No record is left either: the execution is unknown as well (Go: errors.Is(err, ErrNoSuchExecution)). */
  get unknown(): boolean {
    return this.state === undefined;
  }
}

/**
 * A call to a capability no live worker serves, told at once instead of
 * after a wait for a worker that is not there (Go: *executor.UnservedError):
 * its pool is down (no worker renewed the pool's catalog entry within the
 * catalog TTL), or no pool lists it and no worker runs at all. With
 * ifUnserved "queue" (the default) the request is stored and waits for a
 * worker until its start deadline: executionId names it (await it, or cancel
 * it); with "refuse" nothing was stored.
 */
export class UnservedError extends CapstanError {
  override name = "UnservedError";
  readonly capabilityId: string;
  /** The pool the catalog lists it in; undefined when none does (and no worker runs). */
  readonly pool: string | undefined;
  /** The request is stored and waits for a worker. */
  readonly queued: boolean;

  constructor(capabilityId: string, o: { pool?: string | undefined; lapsedAt?: string | undefined; queued: boolean; executionId: string }) {
    let msg =
      o.pool === undefined
        ? `capstan: no worker serves ${capabilityId}, and no worker is running: start one whose registry has it (capstan dev or capstan worker serve the demo catalog)`
        : `capstan: no live worker serves ${capabilityId}: its pool "${o.pool}" has none${o.lapsedAt !== undefined ? ` (its liveness lapsed at ${o.lapsedAt})` : ""}: start a worker of pool "${o.pool}" (capstan worker --pool ${o.pool} serves the demo catalog)`;
    msg += o.queued
      ? `; the request is queued as execution ${o.executionId} until its start deadline, when it ends NOT_STARTED unless a worker starts it`
      : "; nothing was submitted";
    super("UNSERVED", msg, { executionId: o.executionId });
    this.capabilityId = capabilityId;
    this.pool = o.pool;
    this.queued = o.queued;
  }
}

/**
 * A governed refusal returned as an error where no envelope exists: an id
 * that can never name a capability given to submit, or a describe the
 * workers refused. Go: *envelope.CapabilityError.
 */
export class CapabilityError extends Error implements EnvelopeError {
  override name = "CapabilityError";
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly exposeToModel: boolean;
  readonly details: Record<string, unknown> | undefined;
  readonly stage: string | undefined;

  constructor(e: EnvelopeError, options?: ErrorOptions) {
    super(`${e.code}: ${e.message}`, options);
    this.message = e.message;
    this.code = e.code;
    this.retryable = e.retryable;
    this.exposeToModel = e.exposeToModel;
    this.details = e.details;
    this.stage = e.stage;
  }

  /** What a model may see of it. */
  forModel(): ModelError {
    return forModel({ error: this }) as ModelError;
  }
}
