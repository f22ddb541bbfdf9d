// The records of capstan's wire contract (docs/wire.md), their types and
// their msgpack codec. Each record is a schema listing its fields in the
// order of the Go type's declaration; the writer leaves every empty field out
// (Go's encoder writes records with omitempty on every field) and the reader
// ignores fields it does not know. Values carried inside records (an input,
// an output, details, a schema) are kept as the bytes they came in, so that a
// record decoded and encoded again is the same bytes.

import { parseJSON } from "./json.js";
import { compareUTF8, decodeValue, DecodeError, Reader, utf8Bytes, writeValue, Writer, checkWellFormed } from "./msgpack.js";
import { formatTimestamp, isZeroTimestamp, parseTimestamp } from "./time.js";

export { DecodeError } from "./msgpack.js";

/** The schema version every record carries in v. */
export const version = 1;

/** Who an execution runs for. */
export interface Actor {
  id?: string;
  kind?: string;
  attrs?: Record<string, string>;
}

/** An execution request, published to capstan.exec.<principal>.<capabilityId>. */
export interface Request {
  v: number;
  executionId: string;
  /** Empty only in a resume naming just its approval. */
  capabilityId: string;
  input?: unknown;
  actor?: Actor;
  surface?: string;
  correlationId?: string;
  /** RFC 3339. */
  submittedAt: string;
  deadline?: string;
  startBy?: string;
  approvalId?: string;
  traceparent?: string;
}

/** An envelope's outcome. */
export type Status = "completed" | "failed" | "cancelled" | "approval-required";

/** The stable error codes of governed outcomes (docs/design.md §9). */
export type ErrorCode =
  | "CAPABILITY_NOT_FOUND"
  | "INPUT_INVALID"
  | "UNAUTHENTICATED"
  | "FORBIDDEN"
  | "POLICY_DENIED"
  | "POLICY_FAILED"
  | "APPROVAL_PENDING"
  | "APPROVAL_REJECTED"
  | "APPROVAL_EXPIRED"
  | "APPROVAL_CONSUMED"
  | "APPROVAL_INPUT_MISMATCH"
  | "APPROVAL_SELF_APPROVAL"
  | "APPROVAL_UNSERIALIZABLE_INPUT"
  | "EXECUTION_FAILED"
  | "OUTPUT_INVALID"
  | "TIMEOUT"
  | "CANCELLED"
  | "OUTCOME_UNKNOWN"
  | "AUDIT_UNAVAILABLE"
  | "INTERNAL_ERROR"
  | "NOT_STARTED"
  | "RATE_LIMITED"
  | "QUOTA_EXCEEDED"
  // Codes are added, never repurposed: a newer worker may send one this
  // client does not list.
  | (string & {});

/** A governed failure, as the envelope carries it. */
export interface EnvelopeError {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  exposeToModel: boolean;
  details?: Record<string, unknown>;
  stage?: string;
}

/** The approval an execution waits for. */
export interface ApprovalRef {
  id: string;
  reasons?: string[];
  types?: string[];
  expiresAt?: string;
}

/** The one result of an execution. */
export interface Envelope {
  v: number;
  executionId: string;
  capabilityId: string;
  status: Status;
  output?: unknown;
  error?: EnvelopeError;
  attempts: number;
  approval?: ApprovalRef;
  durationMs: number;
  finalizedBy?: string;
  finalizedAt?: string;
  /** Set when the outcome was recovered from a lost attempt (docs/design.md §5). */
  recovered?: Recovered;
}

/**
 * How a completed outcome was recovered, and of which attempt: its handler
 * did not return it (its worker was lost, or the attempt was stopped after
 * its effect), but the effect is known to have happened.
 */
export interface Recovered {
  /** "receipt": from the receipt the attempt recorded; "reconciler": what the capability's reconciler found. */
  how: "receipt" | "reconciler" | (string & {});
  attempt?: number;
}

/** An execution record's state (docs/design.md §5). */
export type State = "pending" | "claimed" | "running" | "backoff" | "reconciling" | "finalized" | (string & {});

/** An execution's record in the executions bucket. */
/**
 * What a handler reported of an attempt's work (Go's envelope.Progress):
 * done of total (total absent: not known) and a short message. Best effort,
 * never proof: only the envelope says how an execution ended.
 */
export interface Progress {
  v: number;
  executionId: string;
  /** The attempt that reported it: a retry's progress starts again. */
  attempt?: number;
  done?: number;
  total?: number;
  /** One printable line, at most 256 bytes. */
  message?: string;
  /** When the handler reported it (the worker's clock), RFC 3339. */
  at: string;
}

/** A progress report for a person: "37 of 120 (30%): rendering", "37: rendering", or the message alone. */
export function progressText(p: Progress): string {
  const done = p.done ?? 0, total = p.total ?? 0;
  let s = "";
  if (total > 0) s = `${done} of ${total} (${Math.floor(Math.min(Math.max(done / total, 0), 1) * 100)}%)`;
  else if (done > 0) s = String(done);
  const m = p.message ?? "";
  if (s === "") return m;
  return m === "" ? s : `${s}: ${m}`;
}

/** The longest progress message, in bytes. */
export const maxProgressMessage = 256;

/**
 * A progress message as one printable line of at most maxProgressMessage
 * UTF-8 bytes, as Go's envelope.CleanProgress makes it: what is not a
 * letter, mark, number, punctuation, symbol or the ASCII space (control
 * characters, a terminal's escape sequences, format characters) becomes a
 * space; a longer one is cut at a character boundary.
 */
export function cleanProgressMessage(s: string): string {
  let out = "", bytes = 0;
  for (let ch of s) {
    if (!/^[\p{L}\p{M}\p{N}\p{P}\p{S} ]$/u.test(ch)) ch = " ";
    const n = utf8Bytes(ch).length;
    if (bytes + n > maxProgressMessage) break;
    out += ch;
    bytes += n;
  }
  return out;
}

export interface ExecutionRecord {
  v: number;
  executionId: string;
  capabilityId: string;
  state: State;
  attempt: number;
  worker?: string;
  claim?: string;
  leaseUntil?: string;
  startedAt?: string;
  lastError?: ErrorCode;
  cancelRequested?: boolean;
  cancelRequestedAt?: string;
  approvalId?: string;
  actor?: string;
  surface?: string;
  inputHash?: string;
  status?: Status;
  cause?: string;
  createdAt?: string;
  updatedAt?: string;
  /** The evidence attempt receiptAttempt recorded of its effect (Go's Call.Receipt). */
  receipt?: unknown;
  receiptAttempt?: number;
  receiptAt?: string;
  /** Reconciliations started for the attempt (those lost with their workers are bounded). */
  reconciliations?: number;
  /** Attempts started because a reconciler proved the one before took no effect. */
  reattempts?: number;
  /** The running attempt's last progress report, as of the lease's last renewal. */
  progress?: Progress;
  /**
   * The idempotency key's derivation every attempt of the execution is
   * given (idempotencyKeyOf); none: an execution begun before key
   * versions, which keeps the key of its id alone.
   */
  keyVersion?: number;
}

/** A capability as the catalog and describe show it. */
export interface Descriptor {
  v: number;
  id: string;
  pool: string;
  description: string;
  sideEffect: "none" | "read" | "write" | "destructive" | "external" | (string & {});
  risk?: "low" | "medium" | "high" | "critical" | (string & {});
  tags?: string[];
  expose?: string[];
  idempotent?: boolean;
  timeoutMs: number;
  retryMaxAttempts?: number;
  requiresApproval?: boolean;
  /** A read that runs without a claim: a run lost with its worker runs again (docs/guarantees.md). */
  unclaimed?: boolean;
  /** The JSON Schema of the capability's input. */
  inputSchema?: Record<string, unknown>;
  /** The capability's limits (docs/design.md §17). */
  limits?: LimitInfo[];
  /** Set in a description when an operator paused the capability for the caller (docs/design.md §18). */
  paused?: PauseInfo;
  expiresAt?: string;
}

/** An operator's pause of a capability, as describe tells its caller. */
export interface PauseInfo {
  /** Calls end PAUSED at once; otherwise they wait in their queue until it is lifted. */
  refuse?: boolean;
  /** The operator's reason. */
  reason: string;
  /** When it was paused. */
  since?: string;
}

/** One limit a capability declares, as describe shows it. */
export interface LimitInfo {
  kind: "concurrency" | "rate" | "budget" | (string & {});
  per?: "capability" | "actor" | "principal" | (string & {});
  name?: string;
  max: number;
  intervalMs?: number;
  atLimit: "wait" | "refuse" | "approval" | (string & {});
  /** The limit in words, e.g. "10 per 1m per actor". */
  text: string;
  /** The most of a concurrency limit's slots one principal may hold at once. */
  principalMax?: number;
}

/** The catalog's _resources entry. */
export interface Resources {
  v: number;
  envelopeRetentionMs: number;
}

export interface Scope {
  prefix?: string;
  tags?: string[];
}

export interface DescribeRequest {
  v: number;
  surface?: string;
  actor?: Actor;
  scope?: Scope;
  /** Ask for the principal's queue instead of the catalog (Discovery.queue), nothing audited. */
  queue?: boolean;
}

/** What a principal's queue holds and may hold (docs/design.md §3, §12 "Quotas"). Go: broker.QueueUsage. */
export interface QueueUsage {
  principal: string;
  /** The queue's stream. */
  stream: string;
  /** Requests it holds, not yet ended, and their bytes. */
  requests: number;
  bytes: number;
  /** What it may hold: a submit beyond is refused QUOTA_EXCEEDED; -1: no bound. */
  maxRequests: number;
  maxBytes: number;
}

/** What a surface and an actor may see of the catalog. */
export interface Discovery {
  v: number;
  /** Names this discovery on the audit trail. */
  id: string;
  surface?: string;
  /** Sorted by id. */
  capabilities: Descriptor[];
  /** Hex SHA-256 of the listed ids, sorted, one per line. */
  digest: string;
  worker?: string;
  /** The principal's queue, for a request that asked for it (no capabilities then). */
  queue?: QueueUsage;
}

export interface DescribeReply extends Discovery {
  error?: EnvelopeError;
}

export type ApprovalStatus = "pending" | "approved" | "rejected" | "expired" | "cancelled" | "consumed" | (string & {});

export interface Decision {
  status: ApprovalStatus;
  approver?: Actor;
  comment?: string;
  decidedAt?: string;
  selfApproval?: string;
}

/** One approval (docs/design.md §7). */
export interface Approval {
  v: number;
  id: string;
  capabilityId: string;
  surface?: string;
  actor?: Actor;
  /** The validated input, parsed from its canonical JSON (integers beyond 2^53 as bigint). */
  input?: unknown;
  /** Hex SHA-256 of the input's canonical JSON. */
  inputHash: string;
  /** What an approver is shown when the capability redacts the input. */
  display?: unknown;
  reasons?: string[];
  types?: string[];
  risk?: string;
  sideEffect?: string;
  requestedAt?: string;
  expiresAt?: string;
  status: ApprovalStatus;
  decision?: Decision;
  requestedBy: string;
  consumedBy?: string;
  consumedAt?: string;
  /**
   * The execution record under which it was consumed (its creation time):
   * only a takeover holding that record may use the approval again.
   */
  consumedUnder?: string;
  principal?: string;
  correlationId?: string;
}

export interface DecideRequest {
  v: number;
  approvalId: string;
  approve?: boolean;
  comment?: string;
  /** Read on an open server only, where no principal is authenticated. */
  approver?: Actor;
  selfApproval?: string;
}

export interface DecideReply {
  v: number;
  record?: Approval;
  error?: string;
  conditions?: string[];
  auditUnavailable?: boolean;
  /** A refusal's facts: for quota_exceeded, the quota, its limit and retryAfterMs. */
  details?: Record<string, unknown>;
}

/** Asks for a page of approvals, or one by id (Go: approvals.ListRequest). */
export interface ListRequest {
  v: number;
  id?: string;
  status?: ApprovalStatus;
  capabilityId?: string;
  actor?: Actor;
  /** The page's size: default 50, at most 500. */
  limit?: number;
  /** A page's next: where the next page begins. */
  cursor?: string;
  /** Only approvals no longer pending; not with status. */
  decided?: boolean;
  /** Each requester's approvals newest first. */
  newest?: boolean;
}

/** One page of approvals: each requester's oldest first, the requesters taking turns. */
export interface ListReply {
  v: number;
  records: Approval[];
  error?: string;
  conditions?: string[];
  /** The cursor of the next page; absent when nothing more matches. */
  next?: string;
  /** Records sent without their input and display: alone, too large for a reply. */
  trimmed?: string[];
  /** A refusal's facts: for quota_exceeded, the quota, its limit and retryAfterMs. */
  details?: Record<string, unknown>;
}

/** Asks the workers for one execution (capstan.executions.get.P; Go: executor.ExecutionRequest). */
export interface ExecutionRequest {
  v: number;
  executionId: string;
  /** Whose execution it is: honoured for an admin (and on an open server); a producer's own by default. */
  owner?: string;
  /** Only where the execution is (state): no record, envelope, trail or approvals. */
  probe?: boolean;
}

/**
 * Where an execution is, as the workers see it: its request stored and no
 * worker has taken it yet (queued), its record in flight, its envelope
 * written (ended), nothing stored of it (unknown), or they could not tell
 * (uncertain: it may be queued).
 */
export type ExecutionState = "queued" | "in-flight" | "ended" | "unknown" | "uncertain" | (string & {});

/** One execution as the principal may see it (Go: executor.ExecutionView; this client does not decode the trail). */
export interface ExecutionView {
  v: number;
  executionId: string;
  /** Whose execution it is. */
  principal?: string;
  state: ExecutionState;
  record?: ExecutionRecord;
  envelope?: Envelope;
  /** The approvals it asked for or consumed, as the principal may see them. */
  approvals?: Approval[];
  /** Why the principal may see it: all, own, approvals. */
  scope?: string;
  /** What the view leaves out because the reply would exceed the payload: trail, approvals.input, output. */
  omitted?: string[];
  /** A refusal, and its conditions (forbidden, unknown, not_found, invalid, quota_exceeded). */
  error?: string;
  conditions?: string[];
  /** A refusal's facts: for quota_exceeded, the quota, its limit and retryAfterMs. */
  details?: Record<string, unknown>;
}

// ---- schemas ----

type Kind =
  | { t: "int" | "float" | "str" | "bool" | "time" | "strs" | "attrs" }
  /** A value embedded as is (Go's envelope.Raw): kept as its bytes, shown decoded. */
  | { t: "raw" }
  /** A generic map (Go's map[string]any): kept as its bytes, shown decoded. */
  | { t: "any" }
  /** JSON text carried as binary (Go's json.RawMessage): kept, shown parsed. */
  | { t: "json" }
  /** A nested record: ptr, a pointer in Go (absent when nil, {} when empty); else a value, absent when all its fields are. */
  | { t: "rec"; s: Schema; ptr: boolean }
  | { t: "recs"; s: Schema; ptr: boolean };

/** A field: its name, its kind and, for fields the type requires, the value of an absent one. */
type Field = readonly [name: string, kind: Kind, absent?: unknown];
type Schema = readonly Field[];

const int = { t: "int" } as const;
/** A float64, written as the 9 bytes of one whatever its value, as Go's msgenc.Fields.Float. */
const float = { t: "float" } as const;
const str = { t: "str" } as const;
const bool = { t: "bool" } as const;
const time = { t: "time" } as const;
const strs = { t: "strs" } as const;
const attrs = { t: "attrs" } as const;
const raw = { t: "raw" } as const;
const anyv = { t: "any" } as const;
const json = { t: "json" } as const;

const actorSchema: Schema = [
  ["id", str],
  ["kind", str],
  ["attrs", attrs],
];
const actor = { t: "rec", s: actorSchema, ptr: false } as const;

export const requestSchema: Schema = [
  ["v", int, 0],
  ["executionId", str, ""],
  ["capabilityId", str, ""],
  ["input", raw],
  ["actor", actor],
  ["surface", str],
  ["correlationId", str],
  ["submittedAt", time, ""],
  ["deadline", time],
  ["startBy", time],
  ["approvalId", str],
  ["traceparent", str],
];

const errorSchema: Schema = [
  ["code", str, ""],
  ["message", str, ""],
  ["retryable", bool, false],
  ["exposeToModel", bool, false],
  ["details", anyv],
  ["stage", str],
];

const approvalRefSchema: Schema = [
  ["id", str, ""],
  ["reasons", strs],
  ["types", strs],
  ["expiresAt", time],
];

const recoveredSchema: Schema = [
  ["how", str, ""],
  ["attempt", int],
];

export const envelopeSchema: Schema = [
  ["v", int, 0],
  ["executionId", str, ""],
  ["capabilityId", str, ""],
  ["status", str, ""],
  ["output", raw],
  ["error", { t: "rec", s: errorSchema, ptr: true }],
  ["attempts", int, 0],
  ["approval", { t: "rec", s: approvalRefSchema, ptr: true }],
  ["durationMs", int, 0],
  ["finalizedBy", str],
  ["finalizedAt", time],
  ["recovered", { t: "rec", s: recoveredSchema, ptr: true }],
];

/** A handler's progress report, as workers publish it on the progress subject and keep it in the record. */
function progressSchemaFields(): Schema {
  return [
    ["v", int, 0],
    ["executionId", str, ""],
    ["attempt", int],
    ["done", float],
    ["total", float],
    ["message", str],
    ["at", time, ""],
  ];
}
export const progressSchema: Schema = progressSchemaFields();

export const recordSchema: Schema = [
  ["v", int, 0],
  ["executionId", str, ""],
  ["capabilityId", str, ""],
  ["state", str, ""],
  ["attempt", int, 0],
  ["worker", str],
  ["claim", str],
  ["leaseUntil", time],
  ["startedAt", time],
  ["lastError", str],
  ["cancelRequested", bool],
  ["cancelRequestedAt", time],
  ["approvalId", str],
  ["actor", str],
  ["surface", str],
  ["inputHash", str],
  ["status", str],
  ["cause", str],
  ["createdAt", time],
  ["updatedAt", time],
  ["receipt", raw],
  ["receiptAttempt", int],
  ["receiptAt", time],
  ["reconciliations", int],
  ["reattempts", int],
  ["progress", { t: "rec", s: progressSchemaFields(), ptr: true }],
  ["keyVersion", int],
];

const limitInfoSchema: Schema = [
  ["kind", str, ""],
  ["per", str],
  ["name", str],
  ["max", int, 0],
  ["intervalMs", int],
  ["atLimit", str, ""],
  ["text", str, ""],
  ["principalMax", int],
];

export const pauseInfoSchema: Schema = [
  ["refuse", bool],
  ["reason", str, ""],
  ["since", time],
];

export const descriptorSchema: Schema = [
  ["v", int, 0],
  ["id", str, ""],
  ["pool", str, ""],
  ["description", str, ""],
  ["sideEffect", str, ""],
  ["risk", str],
  ["tags", strs],
  ["expose", strs],
  ["idempotent", bool],
  ["timeoutMs", int, 0],
  ["retryMaxAttempts", int],
  ["requiresApproval", bool],
  ["unclaimed", bool],
  ["inputSchema", anyv],
  ["limits", { t: "recs", s: limitInfoSchema, ptr: false }],
  ["paused", { t: "rec", s: pauseInfoSchema, ptr: true }],
  ["expiresAt", time],
];

export const resourcesSchema: Schema = [
  ["v", int, 0],
  ["envelopeRetentionMs", int, 0],
];

export const describeRequestSchema: Schema = [
  ["v", int, 0],
  ["surface", str],
  ["actor", actor],
  [
    "scope",
    {
      t: "rec",
      s: [
        ["prefix", str],
        ["tags", strs],
      ],
      ptr: false,
    },
  ],
  ["queue", bool],
];

const queueUsageSchema: Schema = [
  ["principal", str, ""],
  ["stream", str, ""],
  ["requests", int, 0],
  ["bytes", int, 0],
  ["maxRequests", int, 0],
  ["maxBytes", int, 0],
];

export const describeReplySchema: Schema = [
  ["v", int, 0],
  ["id", str, ""],
  ["surface", str],
  ["capabilities", { t: "recs", s: descriptorSchema, ptr: false }, []],
  ["digest", str, ""],
  ["worker", str],
  ["queue", { t: "rec", s: queueUsageSchema, ptr: true }],
  ["error", { t: "rec", s: errorSchema, ptr: true }],
];

const decisionSchema: Schema = [
  ["status", str, ""],
  ["approver", actor],
  ["comment", str],
  ["decidedAt", time],
  ["selfApproval", str],
];

export const approvalSchema: Schema = [
  ["v", int, 0],
  ["id", str, ""],
  ["capabilityId", str, ""],
  ["surface", str],
  ["actor", actor],
  ["input", json],
  ["inputHash", str, ""],
  ["display", json],
  ["reasons", strs],
  ["types", strs],
  ["risk", str],
  ["sideEffect", str],
  ["requestedAt", time],
  ["expiresAt", time],
  ["status", str, ""],
  ["decision", { t: "rec", s: decisionSchema, ptr: true }],
  ["requestedBy", str, ""],
  ["consumedBy", str],
  ["consumedAt", time],
  ["consumedUnder", time],
  ["principal", str],
  ["correlationId", str],
];

export const decideRequestSchema: Schema = [
  ["v", int, 0],
  ["approvalId", str, ""],
  ["approve", bool],
  ["comment", str],
  ["approver", actor],
  ["selfApproval", str],
];

export const decideReplySchema: Schema = [
  ["v", int, 0],
  ["record", { t: "rec", s: approvalSchema, ptr: true }],
  ["error", str],
  ["conditions", strs],
  ["auditUnavailable", bool],
  ["details", anyv],
];

export const listRequestSchema: Schema = [
  ["v", int, 0],
  ["id", str],
  ["status", str],
  ["capabilityId", str],
  ["actor", actor],
  ["limit", int],
  ["cursor", str],
  ["decided", bool],
  ["newest", bool],
];

export const listReplySchema: Schema = [
  ["v", int, 0],
  ["records", { t: "recs", s: approvalSchema, ptr: true }, []],
  ["error", str],
  ["conditions", strs],
  ["next", str],
  ["trimmed", strs],
  ["details", anyv],
];

export const executionRequestSchema: Schema = [
  ["v", int, 0],
  ["executionId", str, ""],
  ["owner", str],
  ["probe", bool],
];

export const executionViewSchema: Schema = [
  ["v", int, 0],
  ["executionId", str, ""],
  ["principal", str],
  ["state", str, ""],
  ["record", { t: "rec", s: recordSchema, ptr: true }],
  ["envelope", { t: "rec", s: envelopeSchema, ptr: true }],
  ["approvals", { t: "recs", s: approvalSchema, ptr: true }],
  ["scope", str],
  ["omitted", strs],
  ["error", str],
  ["conditions", strs],
  ["details", anyv],
];

// ---- the codec ----

/**
 * The bytes a decoded value field came in, kept on the record (not
 * enumerable: JSON, spreads and equality do not see it) so that encoding the
 * record again writes them unchanged while the field still holds the value
 * read from them.
 */
const kept = Symbol("capstan.wire.kept");

interface Kept {
  [kept]?: Map<string, { value: unknown; bytes: Uint8Array }>;
}

function keep(o: Record<string, unknown>, field: string, value: unknown, bytes: Uint8Array): void {
  const k = o as Kept;
  if (k[kept] === undefined) Object.defineProperty(o, kept, { value: new Map(), enumerable: false });
  k[kept]?.set(field, { value, bytes });
}

function keptBytes(o: Record<string, unknown>, field: string): Uint8Array | undefined {
  const e = (o as Kept)[kept]?.get(field);
  return e !== undefined && e.value === o[field] ? e.bytes : undefined;
}

const fieldMaps = new WeakMap<Schema, Map<string, Kind>>();

function fieldsOf(s: Schema): Map<string, Kind> {
  let m = fieldMaps.get(s);
  if (m === undefined) {
    m = new Map(s.map((f) => [f[0], f[1]]));
    fieldMaps.set(s, m);
  }
  return m;
}

function decodeRecord(r: Reader, s: Schema): Record<string, unknown> | null {
  const n = r.mapLen();
  if (n === null) return null;
  const o: Record<string, unknown> = {};
  const fields = fieldsOf(s);
  for (let i = 0; i < n; i++) {
    const key = r.string();
    const kind = fields.get(key);
    if (kind === undefined) {
      r.skip(); // a field this reader does not know
      continue;
    }
    Reflect.deleteProperty(o, key); // a repeated key: the last one counts, as in Go
    const v = decodeField(r, kind, o, key);
    if (v !== undefined) o[key] = v;
  }
  return withAbsent(o, s);
}

// withAbsent gives the fields a type requires their value when absent.
function withAbsent(o: Record<string, unknown>, s: Schema): Record<string, unknown> {
  for (const [name, , absent] of s) {
    if (absent !== undefined && o[name] === undefined) o[name] = Array.isArray(absent) ? [] : absent;
  }
  return o;
}

function decodeField(r: Reader, k: Kind, o: Record<string, unknown>, key: string): unknown {
  switch (k.t) {
    case "int":
      return r.int() || undefined;
    case "float": {
      const f = r.float();
      if (!Number.isFinite(f) || f < 0) throw new DecodeError(`field ${key}: ${f} is not a finite value of at least 0`);
      return f || undefined;
    }
    case "str": {
      const v = r.string();
      return v === "" ? undefined : v;
    }
    case "bool":
      return r.bool() || undefined;
    case "time": {
      const t = r.time();
      return t === null || isZeroTimestamp(t) ? undefined : formatTimestamp(t);
    }
    case "strs": {
      const n = r.arrayLen();
      if (n === null || n === 0) return undefined;
      const out: string[] = [];
      for (let i = 0; i < n; i++) out.push(r.string());
      return out;
    }
    case "attrs": {
      const n = r.mapLen();
      if (n === null || n === 0) return undefined;
      const out: Record<string, string> = {};
      for (let i = 0; i < n; i++) {
        const name = r.string();
        Object.defineProperty(out, name, { value: r.string(), enumerable: true, writable: true, configurable: true });
      }
      return out;
    }
    case "raw":
    case "any": {
      if (r.isNil()) {
        r.nil();
        return undefined;
      }
      const bytes = r.skip().slice();
      const v = decodeValue(bytes);
      if (k.t === "any" && v !== null && typeof v === "object" && Object.keys(v).length === 0) return undefined; // empty: absent, as Go leaves it out
      keep(o, key, v, bytes);
      return v;
    }
    case "json": {
      const bytes = r.binary();
      if (bytes.length === 0) return undefined;
      let v: unknown;
      try {
        v = parseJSON(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
      } catch (err) {
        throw new DecodeError(`field ${key} holds no JSON`, { cause: err });
      }
      keep(o, key, v, bytes);
      return v;
    }
    case "rec": {
      const v = decodeRecord(r, k.s);
      if (v === null) return undefined;
      return !k.ptr && Object.keys(v).length === 0 ? undefined : v;
    }
    case "recs": {
      const n = r.arrayLen();
      if (n === null || n === 0) return undefined;
      const out: unknown[] = [];
      for (let i = 0; i < n; i++) {
        const e = decodeRecord(r, k.s);
        // nil in a slice of structs reads as an empty struct in Go.
        out.push(e ?? (k.ptr ? null : withAbsent({}, k.s)));
      }
      return out;
    }
  }
}

function empty(v: unknown): boolean {
  return v === undefined || v === null || v === "" || v === 0 || v === false || (Array.isArray(v) && v.length === 0);
}

function writeRecord(w: Writer, o: Record<string, unknown>, s: Schema): void {
  const body = new Writer();
  let n = 0;
  for (const [name, kind] of s) {
    if (writeField(body, kind, o, name)) n++;
  }
  w.mapHeader(n);
  w.raw(body.bytes());
}

/** Writes the field's key and value unless the field is empty; reports whether it wrote it. */
function writeField(w: Writer, k: Kind, o: Record<string, unknown>, name: string): boolean {
  const v = o[name];
  if (v === undefined || v === null) return false;
  const key = (): void => { w.str(name); };
  switch (k.t) {
    case "int":
      if (typeof v !== "number" && typeof v !== "bigint") throw new TypeError(`${name}: want an integer`);
      if (empty(v) || v === 0n) return false;
      if (typeof v === "number" && !Number.isSafeInteger(v)) throw new TypeError(`${name}: want an integer`);
      key();
      w.int(v);
      return true;
    case "float":
      if (typeof v !== "number") throw new TypeError(`${name}: want a number`);
      if (v === 0) return false;
      key();
      w.float64(v);
      return true;
    case "str":
      if (typeof v !== "string") throw new TypeError(`${name}: want a string`);
      if (v === "") return false;
      key();
      w.str(v);
      return true;
    case "bool":
      if (v !== true) return false;
      key();
      w.bool(true);
      return true;
    case "time": {
      if (v === "") return false;
      const t = parseTimestamp(v instanceof Date ? v.toISOString() : (v as string));
      if (isZeroTimestamp(t)) return false;
      key();
      w.time(t);
      return true;
    }
    case "strs": {
      if (!Array.isArray(v) || v.length === 0) return false;
      key();
      w.arrayHeader(v.length);
      for (const x of v) w.str(String(x));
      return true;
    }
    case "attrs": {
      const entries = Object.entries(v as Record<string, unknown>).sort(([a], [b]) => compareUTF8(a, b));
      if (entries.length === 0) return false;
      key();
      w.mapHeader(entries.length);
      for (const [a, x] of entries) {
        if (typeof x !== "string") throw new TypeError(`${name}.${a}: want a string`);
        w.str(a);
        w.str(x);
      }
      return true;
    }
    case "raw":
    case "any": {
      const b = keptBytes(o, name);
      if (b !== undefined) {
        key();
        w.raw(b);
        return true;
      }
      if (k.t === "any" && typeof v === "object" && Object.keys(v).length === 0) return false;
      key();
      writeValue(w, v, 1, name);
      return true;
    }
    case "json": {
      const b = keptBytes(o, name) ?? utf8Bytes(JSON.stringify(v));
      key();
      w.bin(b);
      return true;
    }
    case "rec": {
      const inner = new Writer();
      writeRecord(inner, v as Record<string, unknown>, k.s);
      const b = inner.bytes();
      if (!k.ptr && b.length === 1 && b[0] === 0x80) return false;
      key();
      w.raw(b);
      return true;
    }
    case "recs": {
      if (!Array.isArray(v) || v.length === 0) return false;
      key();
      w.arrayHeader(v.length);
      for (const x of v) {
        if (x === null || x === undefined) w.nil();
        else writeRecord(w, x as Record<string, unknown>, k.s);
      }
      return true;
    }
  }
}

/** Encodes a record of schema s. */
export function encodeWith(s: Schema, o: object): Uint8Array {
  const w = new Writer();
  writeRecord(w, o as Record<string, unknown>, s);
  return w.bytes();
}

/**
 * Decodes a record of schema s: bytes that are not one well-formed msgpack
 * map, a field of the wrong type, and a record whose v is not 1 are refused
 * with DecodeError.
 */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- the schema says what T is
export function decodeWith<T>(s: Schema, b: Uint8Array): T {
  // A Buffer's slices are Buffers, which JSON renders as objects: values
  // hold plain Uint8Arrays.
  if (Buffer.isBuffer(b)) b = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  try {
    checkWellFormed(b);
    const r = new Reader(b);
    const o = decodeRecord(r, s);
    if (o === null) throw new DecodeError("the record is nil");
    if (r.pos !== b.length) throw new DecodeError("bytes after the record");
    if (o.v !== version) throw new DecodeError(`schema version ${String(o.v)}, want ${version}`);
    return o as T;
  } catch (err) {
    if (err instanceof DecodeError) throw err;
    throw new DecodeError(err instanceof Error ? err.message : String(err), { cause: err });
  }
}

// ---- records by name ----

export const encodeRequest = (r: Request): Uint8Array => encodeWith(requestSchema, r);
export const encodeEnvelope = (e: Envelope): Uint8Array => encodeWith(envelopeSchema, e);
export const encodeRecord = (e: ExecutionRecord): Uint8Array => encodeWith(recordSchema, e);
export const encodeDescriptor = (d: Descriptor): Uint8Array => encodeWith(descriptorSchema, d);
export const encodeResources = (d: Resources): Uint8Array => encodeWith(resourcesSchema, d);
export const encodeDescribeRequest = (d: DescribeRequest): Uint8Array => encodeWith(describeRequestSchema, d);
export const encodeDescribeReply = (d: DescribeReply): Uint8Array => encodeWith(describeReplySchema, d);
export const encodeDecideRequest = (d: DecideRequest): Uint8Array => encodeWith(decideRequestSchema, d);
export const encodeDecideReply = (d: DecideReply): Uint8Array => encodeWith(decideReplySchema, d);
export const encodeListRequest = (d: ListRequest): Uint8Array => encodeWith(listRequestSchema, d);
export const encodeListReply = (d: ListReply): Uint8Array => encodeWith(listReplySchema, d);
export const encodeApproval = (d: Approval): Uint8Array => encodeWith(approvalSchema, d);

/** Decodes a request as a worker does: also refused without a valid execution id, or with neither a capability nor an approval. */
export function decodeRequest(b: Uint8Array): Request {
  const r = decodeWith<Request>(requestSchema, b);
  const bad = invalidExecutionId(r.executionId);
  if (bad !== undefined) throw new DecodeError(bad);
  if (r.capabilityId === "" && (r.approvalId ?? "") === "") throw new DecodeError("capabilityId is empty");
  return r;
}
export const decodeEnvelope = (b: Uint8Array): Envelope => decodeWith<Envelope>(envelopeSchema, b);
/** Decodes a progress report as clients do: also refused without a valid execution id. */
export function decodeProgress(b: Uint8Array): Progress {
  const p = decodeWith<Progress>(progressSchema, b);
  const bad = invalidExecutionId(p.executionId);
  if (bad !== undefined) throw new DecodeError(bad);
  return p;
}
export const encodeProgress = (p: Progress): Uint8Array => encodeWith(progressSchema, p);
export const decodeExecutionRecord = (b: Uint8Array): ExecutionRecord => decodeWith<ExecutionRecord>(recordSchema, b);
export const decodeDescriptor = (b: Uint8Array): Descriptor => decodeWith<Descriptor>(descriptorSchema, b);
export const decodeResources = (b: Uint8Array): Resources => decodeWith<Resources>(resourcesSchema, b);
export const decodeDescribeRequest = (b: Uint8Array): DescribeRequest => decodeWith<DescribeRequest>(describeRequestSchema, b);
export const decodeDescribeReply = (b: Uint8Array): DescribeReply => decodeWith<DescribeReply>(describeReplySchema, b);
export const decodeDecideRequest = (b: Uint8Array): DecideRequest => decodeWith<DecideRequest>(decideRequestSchema, b);
export const decodeDecideReply = (b: Uint8Array): DecideReply => decodeWith<DecideReply>(decideReplySchema, b);
export const decodeListRequest = (b: Uint8Array): ListRequest => decodeWith<ListRequest>(listRequestSchema, b);
export const decodeListReply = (b: Uint8Array): ListReply => decodeWith<ListReply>(listReplySchema, b);
export const decodeApproval = (b: Uint8Array): Approval => decodeWith<Approval>(approvalSchema, b);
export const encodeExecutionRequest = (r: ExecutionRequest): Uint8Array => encodeWith(executionRequestSchema, r);
export const decodeExecutionRequest = (b: Uint8Array): ExecutionRequest => decodeWith<ExecutionRequest>(executionRequestSchema, b);
export const decodeExecutionView = (b: Uint8Array): ExecutionView => decodeWith<ExecutionView>(executionViewSchema, b);

// ---- ids ----

/** The longest capability or execution id, in bytes. */
export const maxIdLength = 128;

/** Why id cannot name an execution (1 to 128 bytes of [A-Za-z0-9_-]), or undefined. */
export function invalidExecutionId(id: string): string | undefined {
  if (id === "") return "execution id is empty";
  if (id.length > maxIdLength) return `execution id is ${id.length} bytes, at most ${maxIdLength}`;
  const m = /[^A-Za-z0-9_-]/.exec(id);
  if (m !== null) return `execution id ${JSON.stringify(id)} has the character ${JSON.stringify(m[0])} at byte ${utf8Bytes(id.slice(0, m.index)).length}`;
  return undefined;
}

/** Why id cannot name a capability ([a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*, at most 128 bytes), or undefined. */
export function invalidCapabilityId(id: string): string | undefined {
  if (id === "") return "capability id is empty";
  const n = utf8Bytes(id).length;
  if (n > maxIdLength) return `capability id is ${n} bytes, at most ${maxIdLength}`;
  if (!/^[a-z]/.test(id)) return `capability id ${JSON.stringify(id)} must start with a lower-case letter`;
  if (!/^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$/.test(id)) {
    return /(^|\.)(\.|$)/.test(id) || id.endsWith(".")
      ? `capability id ${JSON.stringify(id)} has an empty token`
      : `capability id ${JSON.stringify(id)} has a character outside [a-z0-9_-.]`;
  }
  return undefined;
}

/** A new UUIDv7: 48 bits of Unix milliseconds, then random bits. */
export function newExecutionId(): string {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  const ms = Date.now();
  const hi = Math.floor(ms / 2 ** 16);
  b[0] = (hi >>> 24) & 0xff;
  b[1] = (hi >>> 16) & 0xff;
  b[2] = (hi >>> 8) & 0xff;
  b[3] = hi & 0xff;
  b[4] = (ms >>> 8) & 0xff;
  b[5] = ms & 0xff;
  b[6] = 0x70 | ((b[6] as number) & 0x0f);
  b[8] = 0x80 | ((b[8] as number) & 0x3f);
  const h = Buffer.from(b).toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** When a UUIDv7 execution id was made; undefined for any other id. */
export function executionIdTime(id: string): Date | undefined {
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/i.test(id)) return undefined;
  const ms = parseInt(id.slice(0, 8) + id.slice(9, 13), 16);
  return new Date(ms);
}

// ---- what a model may see ----

/** The only shape of a failure a model may see. */
export interface ModelError {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  details?: Record<string, unknown>;
}

/**
 * What a model may see of an envelope's error, as Go's Envelope.ForModel: the
 * code, message and retryability of an exposed error, the same opaque
 * INTERNAL_ERROR for any other; details only with INPUT_INVALID,
 * RATE_LIMITED and QUOTA_EXCEEDED. Undefined
 * for an envelope without an error.
 */
export function forModel(env: Pick<Envelope, "error">): ModelError | undefined {
  const e = env.error;
  if (e === undefined) return undefined;
  if (!e.exposeToModel) return { code: "INTERNAL_ERROR", message: "The operation failed.", retryable: false };
  const m: ModelError = { code: e.code, message: e.message, retryable: e.retryable };
  if ((e.code === "INPUT_INVALID" || e.code === "RATE_LIMITED" || e.code === "QUOTA_EXCEEDED") && e.details !== undefined) m.details = e.details;
  return m;
}

/**
 * What a model is told of a recovered outcome, beside the output, as Go's
 * Recovered.ForModel: that the operation took effect although its worker did
 * not report it, and how that is known. Undefined for an outcome that was
 * not recovered.
 */
export function recoveredForModel(env: Pick<Envelope, "recovered">): string | undefined {
  const r = env.recovered;
  if (r === undefined) return undefined;
  const n = r.attempt ?? 0;
  switch (r.how) {
    case "receipt":
      return `The operation took effect (attempt ${n}). Its worker stopped before reporting the result; this result was recovered from the receipt the operation recorded when its effect happened. Do not call it again to make sure.`;
    case "reconciler":
      return `The operation took effect (attempt ${n}). Its worker was lost before reporting the result; this result was recovered by checking the system where the effect lives. Do not call it again to make sure.`;
  }
  return `The operation took effect (attempt ${n}); its result was recovered (${r.how}) after its worker stopped.`;
}
