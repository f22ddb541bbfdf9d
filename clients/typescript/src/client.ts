// The client: submits execution requests, awaits their envelopes, reads
// status, cancels, describes, resumes approvals and (for approvers) lists and
// decides them, as the Go client does (executor.Client), over the same wire
// (docs/wire.md).

import { readFile } from "node:fs/promises";
import { credsAuthenticator, errors as natsErrors, type Msg, type NatsConnection, type Subscription } from "@nats-io/nats-core";
import { connect as natsConnect, type NodeConnectionOptions } from "@nats-io/transport-node";
import { jetstream, type JetStreamClient, JetStreamApiError } from "@nats-io/jetstream";
import { CapabilityError, CapstanError, ExpiredError, UnservedError } from "./errors.js";
import { MsgIds } from "./msgid.js";
import { anonymous, key, Names, validPrincipal } from "./names.js";
import { formatTimestamp, timeMillis, timeText, timestampOfDate } from "./time.js";
import { DecodeError } from "./msgpack.js";
import * as wire from "./wire.js";
import type { Actor, Approval, ApprovalStatus, Descriptor, Discovery, Envelope, EnvelopeError, ExecutionRecord, Progress, Request, Scope, State, Status } from "./wire.js";

/** The default NATS URL, when neither the options nor CAPSTAN_NATS_URL say. */
export const defaultURL = "nats://127.0.0.1:4222";

/** How long a request waits by default to be started (docs/design.md §13): 24 h. */
export const defaultStartWithinMs = 24 * 3600 * 1000;

/** Where a call comes from; a client fixes it, never the request's payload. */
export type Surface = "direct" | "mcp" | "http" | (string & {});

/** Receives what the client has to say; the client never prints. */
export interface Logger {
  debug?(message: string, attrs?: Record<string, unknown>): void;
  info?(message: string, attrs?: Record<string, unknown>): void;
  warn?(message: string, attrs?: Record<string, unknown>): void;
}

export interface ClientOptions {
  /** The surface every call of this client comes from. Default "direct". */
  surface?: Surface;
  /** The actor of calls that name none. */
  actor?: Actor;
  /** Prefix of capstan's names (default "CAPSTAN"). */
  prefix?: string;
  /**
   * How long a request may wait for a worker to start it before it ends
   * NOT_STARTED, in milliseconds (default 24 h); never more than the
   * envelope retention less a margin (see maxStartWithinMs), to which a
   * longer window is cut.
   */
  startWithinMs?: number;
  /**
   * What a call does when no live worker serves its capability: "queue"
   * (the default: it is stored, and call rejects at once with an
   * UnservedError naming its execution id), "refuse" (nothing is stored;
   * call and submit reject with an UnservedError), or "wait" (it is waited
   * for as any call). Told from the catalog, at no cost for a served
   * capability.
   */
  ifUnserved?: IfUnserved;
  logger?: Logger;
}

/** What a call does when no live worker serves its capability (see ClientOptions.ifUnserved). */
export type IfUnserved = "queue" | "refuse" | "wait";

export interface ConnectOptions extends ClientOptions {
  /** One URL, several separated by commas, or a list. Default CAPSTAN_NATS_URL, else nats://127.0.0.1:4222. */
  servers?: string | string[];
  /**
   * A NATS credentials file (its path, or its contents as bytes). When it
   * names a capstan principal, replies come under the principal's inbox
   * prefix, the only one the server lets it receive on.
   */
  creds?: string | Uint8Array;
  /** TLS: a custom root and a client certificate (file paths). */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  /** The connection's name in the server's monitoring. */
  name?: string;
  /** Bounds the first connection attempt, in milliseconds (default 5 s). */
  timeoutMs?: number;
}

export interface CallOptions {
  /** The execution id (default a new UUIDv7). Submitting twice with one id within the dedup window runs it once. */
  id?: string;
  /** The acting actor (default the client's). */
  actor?: Actor;
  /** Ties executions together. */
  correlationId?: string;
  /** Ends the whole execution CANCELLED at this time. */
  deadline?: Date | string;
  /** How long this request may wait to be started, in milliseconds (default the client's). */
  startWithinMs?: number;
  /** A W3C traceparent. */
  traceparent?: string;
  /** What this call does when no live worker serves its capability (default the client's). */
  ifUnserved?: IfUnserved;
  /**
   * Stops waiting (and, for submit, publishing): the promise rejects with
   * CapstanError ABORTED whose cause is the signal's reason. The execution
   * goes on; await its id again, or cancel it.
   */
  signal?: AbortSignal;
  /** Also cancel the execution when signal aborts a call (as an MCP client's notifications/cancelled does). */
  cancelOnAbort?: boolean;
  /**
   * Called with each progress report of the execution while call waits for
   * it (at most four a second, as the worker publishes them; best effort:
   * the envelope alone says how it ended). Without it nothing is subscribed.
   */
  onProgress?: (p: Progress) => void;
}

export interface AwaitOptions {
  signal?: AbortSignal;
  /** Called with each progress report of the execution while await waits for it (see CallOptions.onProgress). */
  onProgress?: (p: Progress) => void;
}

/** What the runtime knows of one execution. */
export interface ExecutionStatus {
  record?: ExecutionRecord;
  envelope?: Envelope;
}

/** The workers' answer to a cancel. */
export interface CancelReply {
  executionId: string;
  /** The record's state when the cancel was recorded. */
  state?: State;
  /** The execution had ended before the cancel, which then changed nothing; status is its envelope's. */
  finalized?: boolean;
  status?: Status;
  error?: string;
  /** A refusal's conditions (quota_exceeded; "unknown" when nothing of the execution is stored, and cancel rejects with UNKNOWN_EXECUTION) and facts (the quota, its limit, retryAfterMs). */
  conditions?: string[];
  details?: Record<string, unknown>;
}

export interface ExecutionOptions {
  /** Whose execution it is: honoured for an admin (and on an open server); a producer reads only its own. */
  owner?: string;
  /** Ask only where the execution is (the view's state): what status needs of an id it finds nothing for. */
  probe?: boolean;
  signal?: AbortSignal;
  /** Default 15 s. */
  timeoutMs?: number;
}

export interface DescribeOptions {
  /** Default the client's surface. */
  surface?: Surface;
  /** Default the client's actor. */
  actor?: Actor;
  scope?: Scope;
  signal?: AbortSignal;
  /** Default 10 s. */
  timeoutMs?: number;
}

export interface ListApprovalsOptions {
  status?: ApprovalStatus;
  capabilityId?: string;
  actor?: Actor;
  /** Only approvals no longer pending; not with status. */
  decided?: boolean;
  /** Each requester's approvals newest first (default oldest first). */
  newest?: boolean;
  /** The page's size: default 50, at most 500. */
  limit?: number;
  /** The previous page's next. */
  cursor?: string;
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** A page of approvals: each requester's in order, the requesters taking turns, so that none hides another's. */
export interface ApprovalsPage {
  records: Approval[];
  /** Pass as cursor for the next page; undefined when nothing more matches. */
  next?: string;
  /** Approvals sent without their input and display: alone, too large for one reply. */
  trimmed?: string[];
}

export interface DecideOptions {
  approve: boolean;
  comment?: string;
  /** On an open server only, where no principal is authenticated: who decides. */
  approver?: Actor;
  /** On an open server only: the reason that lets a requester approve its own call. */
  selfApproval?: string;
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** The approvals a principal may see and decide, through requests the workers serve. */
export interface Approvals {
  /** A page of the approvals this principal may decide (of its types), or requested itself. */
  list(options?: ListApprovalsOptions): Promise<ApprovalsPage>;
  /** One approval by id. */
  get(approvalId: string, options?: Pick<ListApprovalsOptions, "signal" | "timeoutMs">): Promise<Approval>;
  /** Records this principal's decision; the approver is the principal, never a field. */
  decide(approvalId: string, options: DecideOptions): Promise<Approval>;
}

/** The longest start window when envelopes are kept retentionMs: the retention less an hour (a tenth of it, under ten hours). */
export function maxStartWithinMs(retentionMs: number): number {
  return retentionMs - Math.min(3600_000, retentionMs / 10);
}

const publishTryMs = 5000; // one attempt to store a request
const directGetMs = 5000;
const requestMs = 10_000; // cancel, describe, approvals
const executionRequestMs = 15_000; // an execution the workers read
const catalogProbeMs = 10_000;
const sweepAfterMs = 30_000;
const unservedGraceMs = 500; // how long a capability may look unserved before a call is told so
const probeAfterMs = 2000; // an id younger than this may name a request on its way
const maxQuotaWaits = 20; // how often status waits out its principal's control quota
const probeWaitMs = 2000; // how long await asks the workers whether an execution exists

/** Connects to NATS as the credentials' principal and opens a client on the connection, which it owns. */
export async function connect(options: ConnectOptions = {}): Promise<Client> {
  const names = new Names(options.prefix);
  const opts: NodeConnectionOptions = {
    servers: serversOf(options.servers),
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    timeout: options.timeoutMs ?? 5000,
  };
  if (options.name !== undefined) opts.name = options.name;
  if (options.creds !== undefined) {
    let creds: Uint8Array;
    try {
      creds = typeof options.creds === "string" ? await readFile(options.creds) : options.creds;
    } catch (err) {
      throw new CapstanError("INVALID_ARGUMENT", `capstan: credentials file: ${(err as Error).message}`, { cause: err });
    }
    opts.authenticator = credsAuthenticator(creds);
    const principal = principalFromCreds(creds);
    if (principal !== undefined) opts.inboxPrefix = names.inboxPrefix(principal);
  }
  if (options.tls !== undefined) {
    if ((options.tls.certFile === undefined) !== (options.tls.keyFile === undefined)) {
      throw new CapstanError("INVALID_ARGUMENT", "capstan: tls.certFile and tls.keyFile go together");
    }
    opts.tls = { ...options.tls };
  }
  const web = serversOf(options.servers).find((u) => /^https?:\/\//i.test(u));
  if (web !== undefined) {
    throw new CapstanError(
      "INVALID_ARGUMENT",
      `capstan: ${redact(web)} is a web address, not a NATS server's: NATS URLs begin nats:// (e.g. ${defaultURL}); the console's address is not the NATS server's`,
    );
  }
  let nc: NatsConnection;
  try {
    nc = await natsConnect(opts);
  } catch (err) {
    let hint = "";
    if (err instanceof natsErrors.ConnectionError || err instanceof natsErrors.TimeoutError) {
      hint = `. No NATS server answers at ${redact(opts.servers)}: start one with 'capstan dev' (a server and a demo worker) or 'capstan server', or point at yours with the servers option or CAPSTAN_NATS_URL`;
    }
    throw new CapstanError("TRANSPORT", `capstan: connect to ${redact(opts.servers)}: ${(err as Error).message}${hint}`, { cause: err });
  }
  try {
    return await Client.open(nc, { ...options, ownsConnection: true });
  } catch (err) {
    await nc.close();
    throw err;
  }
}

function serversOf(s: string | string[] | undefined): string[] {
  const list = s ?? process.env.CAPSTAN_NATS_URL ?? defaultURL;
  return (Array.isArray(list) ? list : list.split(",")).map((u) => u.trim()).filter((u) => u !== "");
}

/** A server URL list without the user, password or token any of them carries. */
function redact(servers: string | string[] | undefined): string {
  return serversOf(servers)
    .map((u) => u.replace(/\/\/[^@/]*@/, "//"))
    .join(",");
}

/**
 * The capstan principal a credentials file names (its user JWT's name), or
 * undefined when it names none.
 */
export function principalFromCreds(creds: Uint8Array | string): string | undefined {
  const text = typeof creds === "string" ? creds : new TextDecoder().decode(creds);
  const m = /-----BEGIN NATS USER JWT-----\s*([A-Za-z0-9_.-]+)\s*------END NATS USER JWT------/.exec(text);
  const payload = m?.[1]?.split(".")[1];
  if (payload === undefined) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as { name?: unknown };
    const name = typeof claims.name === "string" ? claims.name : "";
    return validPrincipal(name) && name !== anonymous ? name : undefined;
  } catch {
    return undefined;
  }
}

/** Ends with signal's reason as CapstanError ABORTED. */
function aborted(signal: AbortSignal, executionId?: string): CapstanError {
  return new CapstanError("ABORTED", `capstan: ${executionId !== undefined ? `waiting for ${executionId}` : "request"} aborted: ${String(signal.reason)}`, {
    cause: signal.reason,
    executionId,
  });
}

/** p, or a rejection when signal aborts first. */
function abortable<T>(p: Promise<T>, signal: AbortSignal | undefined, executionId?: string): Promise<T> {
  if (signal === undefined) return p;
  if (signal.aborted) return Promise.reject(aborted(signal, executionId));
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => { reject(aborted(signal, executionId)); };
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        resolve();
      },
      { once: true },
    );
  });
}

/** The pause before trying again: 10 ms longer each try, at most 500 ms (Go: broker.Backoff). */
function backoff(attempt: number): number {
  return Math.min(10 * (attempt + 1), 500);
}

function isNoResponders(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    if (e.name === "NoRespondersError") return true;
    const re = e as { isNoResponders?: () => boolean };
    if (typeof re.isNoResponders === "function" && re.isNoResponders()) return true;
  }
  return false;
}

function isTimeout(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) if (e.name === "TimeoutError") return true;
  return false;
}

/**
 * Whether a publish error may pass by itself: no stream answered (yet), the
 * answer was lost, or JetStream said "temporarily unavailable" (503) or
 * "duplicate message id is in process" (10158). Go: await.transient.
 */
function transient(err: unknown): boolean {
  if (queueFull(err) !== undefined) return false; // the principal's own backlog: publishing again does not drain it
  if (err instanceof JetStreamApiError) return err.status === 503 || err.code === 10158;
  if (err instanceof Error && err.name === "JetStreamNotEnabled") return true; // how the library reports no responders
  return isTimeout(err) || isNoResponders(err);
}

/** A failed envelope for a request refused before it was stored. */
function refusedEnvelope(r: Request, e: CapabilityError): Envelope {
  const error: wire.EnvelopeError = { code: e.code, message: e.message, retryable: e.retryable, exposeToModel: e.exposeToModel };
  if (e.details !== undefined) error.details = e.details;
  if (e.stage !== undefined) error.stage = e.stage;
  return { v: wire.version, executionId: r.executionId, capabilityId: r.capabilityId, status: "failed", error, attempts: 0, durationMs: 0,
    finalizedAt: formatTimestamp(timestampOfDate(new Date())) };
}

/**
 * The quota a full queue's refusal of a publication names (docs/design.md
 * §12 "Quotas"): JetStream's "maximum messages exceeded" or "maximum bytes
 * exceeded" of a stream that refuses new messages once full. Go:
 * broker.AsQueueFull.
 */
function queueFull(err: unknown): "queuedRequests" | "queuedBytes" | undefined {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    if (!(e instanceof JetStreamApiError) || e.code !== 10077) continue;
    if (e.message.includes("maximum messages exceeded")) return "queuedRequests";
    if (e.message.includes("maximum bytes exceeded")) return "queuedBytes";
  }
  return undefined;
}

/** The wait a full queue's refusal suggests, as Go's (broker.QueueFullError.QuotaError). */
const queueRetryAfterMs = 1000;

/** How long a refusal of a full queue waits for the workers to say its limit. */
const quotaLookupMs = 2000;

const closedMessage = "capstan: client closed while awaiting the envelope; the execution may still run";

interface Waiter {
  resolve(env: Envelope): void;
  reject(err: Error): void;
}

/**
 * Hands envelopes to the calls waiting for them: one subscription to the
 * principal's republished envelopes, never a JetStream consumer per call,
 * and a re-read of the ones it may have missed (a reconnect; for the
 * anonymous principal, a gap in the stream's sequence; every 30 s, those
 * waited for longer). Go: executor/internal/await.
 */
class Waiters {
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly since = new Map<string, number>();
  private readonly sub: Subscription;
  private lastSeq = 0;
  reconnects = 0;
  private readonly timer: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly c: Client,
    private readonly nc: NatsConnection,
  ) {
    this.sub = nc.subscribe(c.names.envelopes(c.principal), { callback: (err, m) => { this.onEnvelope(err, m); } });
    this.timer = setInterval(() => { this.sweep(); }, 1000);
    this.timer.unref();
    void this.watchStatus();
    // A connection closed under the client ends its waits: nothing will deliver them.
    void nc.closed().then(() => {
      this.close();
    });
  }

  private async watchStatus(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (this.closed) return;
      if (s.type === "reconnect") {
        this.reconnects++;
        this.recheck(0);
      }
    }
  }

  private lastSweep = Date.now();

  private sweep(): void {
    if (Date.now() - this.lastSweep < sweepAfterMs) return;
    this.lastSweep = Date.now();
    this.recheck(sweepAfterMs);
  }

  private onEnvelope(err: Error | null, m: Msg): void {
    if (err !== null) {
      this.c.log.warn?.("envelope subscription failed", { err: err.message });
      return;
    }
    const k = this.c.names.envelopeKeyOf(m.subject);
    // Only the server's republish of this very key: the server also sends
    // replies to any subject a requester names.
    if (m.headers?.get("Nats-Subject") !== `$KV.${this.c.names.envelopesBucket}.${k}`) return;
    this.noteSequence(m);
    const dot = k.indexOf(".");
    const id = k.slice(dot + 1);
    if (dot < 0 || !this.waiters.has(id)) return;
    let env: Envelope;
    try {
      env = wire.decodeEnvelope(m.data);
    } catch (e) {
      this.c.log.warn?.("envelope does not decode", { executionId: id, err: (e as Error).message });
      return;
    }
    if (env.executionId !== id) {
      this.c.log.warn?.("envelope of another execution on this one's subject: ignored", { executionId: id, envelopeOf: env.executionId });
      return;
    }
    this.deliver(id, env);
  }

  private noteSequence(m: Msg): void {
    if (this.c.principal !== anonymous) return; // a principal's sequences have gaps by nature
    const seq = Number(m.headers?.get("Nats-Sequence") ?? "");
    if (!Number.isSafeInteger(seq) || seq <= 0) return;
    const prev = this.lastSeq;
    this.lastSeq = seq;
    if (prev !== 0 && seq !== prev + 1) this.recheck(0);
  }

  deliver(id: string, env: Envelope): void {
    const ws = this.waiters.get(id);
    this.waiters.delete(id);
    this.since.delete(id);
    for (const w of ws ?? []) w.resolve(env);
  }

  /** Registers a waiter of id's envelope; wait or remove ends it. */
  add(id: string): { waiter: Waiter; promise: Promise<Envelope> } {
    let resolve!: (env: Envelope) => void;
    let reject!: (err: Error) => void;
    const promise = new Promise<Envelope>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    promise.catch(() => undefined); // a waiter removed unawaited may be rejected at close
    const waiter = { resolve, reject: (err: Error) => {
      reject(new CapstanError("CLOSED", err.message, { executionId: id }));
    } };
    if (this.closed) waiter.reject(new Error(closedMessage));
    let ws = this.waiters.get(id);
    if (ws === undefined) {
      ws = new Set();
      this.waiters.set(id, ws);
      this.since.set(id, Date.now());
    }
    ws.add(waiter);
    return { waiter, promise };
  }

  remove(id: string, w: Waiter): void {
    const ws = this.waiters.get(id);
    ws?.delete(w);
    if (ws?.size === 0) {
      this.waiters.delete(id);
      this.since.delete(id);
    }
  }

  /** Reads the envelope of every execution waited for since at least minAgeMs and delivers those that exist. */
  private recheck(minAgeMs: number): void {
    if (this.closed) return;
    const now = Date.now();
    const ids = [...this.since].filter(([, t]) => now - t >= minAgeMs).map(([id]) => id);
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < ids.length && !this.closed) {
        const id = ids[next++] as string;
        try {
          const env = await this.c.loadEnvelope(this.c.principal, id);
          if (env !== undefined) this.deliver(id, env);
        } catch {
          // the next recheck asks again
        }
      }
    };
    for (let i = 0; i < Math.min(16, ids.length); i++) void worker();
  }

  /** Waits for a registered waiter's envelope until signal ends it or the client closes. */
  async wait(id: string, w: { waiter: Waiter; promise: Promise<Envelope> }, signal?: AbortSignal): Promise<Envelope> {
    try {
      return await abortable(w.promise, signal, id);
    } finally {
      this.remove(id, w.waiter);
    }
  }

  /** Stops watching and releases the subscription; waits still pending end with CLOSED. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    for (const ws of this.waiters.values()) for (const w of ws) w.reject(new Error(closedMessage));
    this.waiters.clear();
    this.since.clear();
    if (!this.nc.isClosed()) this.sub.unsubscribe();
  }
}

/**
 * A capstan client. Every governed outcome — completed, failed, cancelled,
 * approval-required — is an envelope; a promise rejects only for transport
 * trouble (CapstanError) or a refusal where no envelope exists
 * (CapabilityError).
 */
export class Client {
  readonly names: Names;
  /** Who the server knows this connection as: every subject it publishes to carries it. */
  readonly principal: string;
  readonly log: Logger;
  private readonly js: JetStreamClient;
  private readonly msgIds: MsgIds;
  private readonly w: Waiters;
  private readonly opts: ClientOptions;
  private readonly ownsConnection: boolean;
  private closing = false;
  /** Set once the connection was seen on a cluster (readsMayLag). */
  private clustered = false;
  private readonly listed = new Map<string, number>();
  /** The envelope retention in ms, read at open (0: unreadable, start windows not capped). */
  retentionMs = 0;

  /** The approvals this principal may see and decide. */
  readonly approvals: Approvals;

  private constructor(
    readonly nc: NatsConnection,
    options: ClientOptions & { ownsConnection?: boolean },
  ) {
    this.opts = options;
    this.ownsConnection = options.ownsConnection === true;
    this.names = new Names(options.prefix);
    this.log = options.logger ?? {};
    const inbox = (nc as unknown as { options?: { inboxPrefix?: string } }).options?.inboxPrefix;
    this.principal = this.names.principalOfInbox(inbox);
    this.js = jetstream(nc);
    this.msgIds = MsgIds.fromConnection(nc);
    this.w = new Waiters(this, nc);
    this.approvals = {
      list: (o = {}) => this.listApprovals(o),
      get: async (approvalId, o = {}) => {
        const [a] = (await this.listApprovals({ ...o, id: approvalId })).records;
        if (a === undefined) throw new CapstanError("REFUSED", `capstan: approval ${approvalId}: not found`, { conditions: ["not_found"] });
        return a;
      },
      decide: (approvalId, o) => this.decide(approvalId, o),
    };
  }

  /**
   * Opens a client on an existing connection (connected with the inbox
   * prefix of its principal, as connect does). It reads the envelope
   * retention, which caps start windows; it creates nothing.
   */
  static async open(nc: NatsConnection, options: ClientOptions & { ownsConnection?: boolean } = {}): Promise<Client> {
    const c = new Client(nc, options);
    c.readsMayLag(); // remembers the cluster the connection is in now
    await c.readRetention();
    return c;
  }

  private async readRetention(): Promise<void> {
    try {
      const b = await this.directGet(this.names.catalogBucket, "_resources");
      if (b === undefined || b.byteLength === 0) throw new Error("no _resources entry in the catalog");
      this.retentionMs = wire.decodeResources(b).envelopeRetentionMs;
    } catch (err) {
      this.log.warn?.("envelope retention unreadable: start windows are not capped by it", { err: (err as Error).message });
    }
  }

  /** The actor of calls that name none (ClientOptions.actor). */
  get actor(): Actor | undefined {
    return this.opts.actor;
  }

  /** The longest start window a request gets (0: not capped). */
  get maxStartWithinMs(): number {
    return this.retentionMs > 0 ? maxStartWithinMs(this.retentionMs) : 0;
  }

  /** Closes the client (and the connection, when connect opened it). Waits still pending end with CLOSED. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.w.close();
    if (this.ownsConnection) await this.nc.close();
  }

  private checkOpen(executionId?: string): void {
    if (this.closing) throw new CapstanError("CLOSED", "capstan: the client is closed", { executionId });
  }

  // ---- reading by key ----

  /**
   * Reads a bucket's key by direct get: undefined when it holds nothing (or
   * a delete marker). An answer that names another key is not taken.
   */
  private async directGet(bucket: string, k: string, signal?: AbortSignal): Promise<Uint8Array | undefined> {
    let m: Msg;
    try {
      m = await abortable(this.nc.request(this.names.directGet(bucket, k), undefined, { timeout: directGetMs }), signal);
    } catch (err) {
      if (err instanceof CapstanError) throw err;
      throw new CapstanError("TRANSPORT", `capstan: read ${bucket}/${k}: ${(err as Error).message}`, { cause: err });
    }
    const status = m.headers?.code ?? 0;
    if (m.data.length === 0 && status === 404) return undefined;
    if (m.data.length === 0 && status !== 0 && status !== 200) {
      throw new CapstanError("TRANSPORT", `capstan: read ${bucket}/${k}: ${status} ${m.headers?.description ?? ""}`);
    }
    if (m.headers?.get("Nats-Subject") !== `$KV.${bucket}.${k}`) {
      this.log.warn?.("a direct get answered for another key: ignored", { bucket, key: k, subject: m.headers?.get("Nats-Subject") });
      return undefined;
    }
    const op = m.headers.get("KV-Operation");
    const marker = m.headers.get("Nats-Marker-Reason");
    if (op === "DEL" || op === "PURGE" || marker === "MaxAge" || marker === "Purge" || marker === "Remove") return undefined;
    return m.data;
  }

  /** principal's envelope of id, if there is one. */
  async loadEnvelope(principal: string, id: string, signal?: AbortSignal): Promise<Envelope | undefined> {
    const b = await this.directGet(this.names.envelopesBucket, key(principal, id), signal);
    return b === undefined ? undefined : decoded(() => wire.decodeEnvelope(b), id);
  }

  private async loadRecord(principal: string, id: string, signal?: AbortSignal): Promise<ExecutionRecord | undefined> {
    const b = await this.directGet(this.names.executionsBucket, key(principal, id), signal);
    return b === undefined ? undefined : decoded(() => wire.decodeExecutionRecord(b), id);
  }

  /**
   * Where a request for capabilityId goes and whether a live worker serves
   * it (Go: Client.place): listed when its catalog entry is live, or its
   * whole pool is down (a request for one it does not list goes to
   * _unrouted, where a worker decides); unserved when its pool is down, or
   * no pool lists it and no worker answers at all. One read per capability
   * every 10 s for a served one.
   */
  private async placement(capabilityId: string): Promise<{ listed: boolean; unserved?: { pool?: string; lapsedAt?: string }; unread?: boolean }> {
    const seen = this.listed.get(capabilityId);
    if (seen !== undefined && Date.now() - seen < catalogProbeMs) return { listed: true };
    try {
      const b = await this.directGet(this.names.catalogBucket, capabilityId);
      if (b === undefined) return (await this.anyWorker()) ? { listed: false } : { listed: false, unserved: {} };
      const d = wire.decodeDescriptor(b);
      const now = Date.now();
      if (d.expiresAt !== undefined && timeMillis(d.expiresAt) <= now) {
        // Lapsed: listed only while its whole pool is down.
        const pb = await this.directGet(this.names.catalogBucket, `_pool.${d.pool}`);
        const pool = pb === undefined ? undefined : wire.decodeDescriptor(pb);
        if (pool?.expiresAt !== undefined && timeMillis(pool.expiresAt) > now) return { listed: false };
        return { listed: true, unserved: { pool: d.pool, ...(pool?.expiresAt !== undefined ? { lapsedAt: new Date(timeMillis(pool.expiresAt)).toISOString() } : {}) } };
      }
      this.listed.set(capabilityId, now);
      return { listed: true };
    } catch {
      return { listed: false, unread: true }; // unknown: _unrouted, where a worker decides
    }
  }

  /** Whether a worker of any pool answers: yes when it cannot be told. */
  private async anyWorker(): Promise<boolean> {
    try {
      await this.execution(wire.newExecutionId(), { probe: true, owner: this.principal, timeoutMs: probeWaitMs });
      return true;
    } catch (err) {
      return !(err instanceof CapstanError && err.code === "NO_WORKERS");
    }
  }

  // ---- submitting ----

  private newRequest(capabilityId: string, input: unknown, o: CallOptions): Request {
    const now = new Date();
    const r: Request = {
      v: wire.version,
      executionId: o.id ?? wire.newExecutionId(),
      capabilityId,
      surface: this.opts.surface ?? "direct",
      submittedAt: formatTimestamp(timestampOfDate(now)),
    };
    if (input !== undefined && input !== null) r.input = input;
    const actor = o.actor ?? this.opts.actor;
    if (actor === undefined || actor.kind === "" || actor.id === "") {
      // The workers would refuse it (UNAUTHENTICATED) after a round trip.
      throw new CapstanError(
        "INVALID_ARGUMENT",
        'capstan: a call needs an actor, who it runs for: connect({ actor: { kind: "user", id: "ada" } }), or the call\'s own actor option',
      );
    }
    r.actor = actor;
    if (o.correlationId !== undefined) r.correlationId = o.correlationId;
    if (o.deadline !== undefined) r.deadline = timeText(o.deadline);
    if (o.traceparent !== undefined) r.traceparent = o.traceparent;
    r.startBy = this.startBy(now, o.startWithinMs);
    const bad = wire.invalidExecutionId(r.executionId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${bad}`);
    return r;
  }

  /** A request's start deadline: now plus its window, cut to the longest the retention allows. */
  private startBy(now: Date, startWithinMs?: number): string {
    let ms = startWithinMs ?? this.opts.startWithinMs ?? defaultStartWithinMs;
    if (!Number.isFinite(ms) || ms <= 0) {
      throw new CapstanError("INVALID_ARGUMENT", `capstan: startWithinMs ${ms}: want a positive number of milliseconds`);
    }
    if (this.maxStartWithinMs > 0) ms = Math.min(ms, this.maxStartWithinMs);
    return formatTimestamp(timestampOfDate(new Date(now.getTime() + ms)));
  }

  /**
   * Stores m in the exec stream under the msg id, publishing again under the
   * same id until JetStream acknowledges or refuses it, or signal ends it:
   * within the dedup window a repeat of a request that was stored after all
   * is dropped, so a lost acknowledgement never submits twice.
   */
  private async publish(subject: string, data: Uint8Array, msgID: string, executionId: string, signal?: AbortSignal): Promise<{ duplicate: boolean }> {
    for (let attempt = 0; ; attempt++) {
      this.checkOpen(executionId);
      if (signal?.aborted === true) throw aborted(signal, executionId);
      try {
        const ack = await abortable(this.js.publish(subject, data, { msgID, timeout: publishTryMs }), signal, executionId);
        return { duplicate: ack.duplicate };
      } catch (err) {
        if (err instanceof CapstanError) throw err;
        const quota = queueFull(err);
        if (quota !== undefined) throw await this.quotaError(quota, err);
        if (err instanceof Error && err.name === "InvalidArgumentError" && err.message.includes("max_payload")) {
          // The connection refused to send it: nothing can run, so no
          // execution id to read (Go: the MCP bridge's INPUT_INVALID).
          throw new CapstanError(
            "INVALID_ARGUMENT",
            `capstan: the input is too large: capstan takes requests of at most ${this.nc.info?.max_payload ?? "?"} bytes; nothing was sent`,
            { cause: err },
          );
        }
        if (!transient(err)) {
          throw new CapstanError("TRANSPORT", `capstan: submit ${executionId}: ${(err as Error).message}`, { cause: err, executionId });
        }
        this.log.debug?.("request not stored yet; publishing again", { subject, attempt: attempt + 1, err: (err as Error).message });
        await sleep(backoff(attempt), signal);
      }
    }
  }

  /**
   * The QUOTA_EXCEEDED refusal of a request its principal's full queue did
   * not take, with the queue's limit as the workers read it (absent when
   * none answered in time). Go: Client.quotaError.
   */
  private async quotaError(quota: "queuedRequests" | "queuedBytes", cause: unknown): Promise<CapabilityError> {
    let limit: number | undefined;
    try {
      const u = await this.queue({ timeoutMs: quotaLookupMs });
      limit = quota === "queuedBytes" ? u.maxBytes : u.maxRequests;
    } catch {
      // No worker said: the refusal names the quota alone.
    }
    // Go's envelope.QuotaExceeded, word for word.
    const what = quota === "queuedBytes" ? "bytes of requests waiting to start" : "requests waiting to start";
    const details: Record<string, unknown> = { quota, retryAfterMs: queueRetryAfterMs };
    let message = `Over the ${quota} quota: too many ${what}. Try again in 1s.`;
    if (limit !== undefined && limit >= 0) {
      message = `Over the ${quota} quota: at most ${limit} ${what}. Try again in 1s.`;
      details.limit = limit;
    }
    return new CapabilityError({ code: "QUOTA_EXCEEDED", message, retryable: true, exposeToModel: true, details, stage: "queue" }, { cause });
  }

  /**
   * What this principal has waiting in its queue and may have waiting
   * (docs/design.md §12 "Quotas"), as a worker reads it from the server:
   * the limits every submit is held to. Go: Client.Queue.
   */
  async queue(options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<wire.QueueUsage> {
    const req: wire.DescribeRequest = { v: wire.version, queue: true };
    const m = await this.workerRequest("queue", this.names.describe(this.principal), wire.encodeDescribeRequest(req), options);
    const r = decoded(() => wire.decodeDescribeReply(m.data));
    if (r.error !== undefined) throw new CapabilityError(r.error);
    if (r.queue === undefined) {
      throw new CapstanError("TRANSPORT", `capstan: queue: the worker that answered (${r.worker ?? "?"}) does not tell queues`);
    }
    return r.queue;
  }

  private async send(r: Request, signal?: AbortSignal, ifUnserved: IfUnserved = "wait"): Promise<{ duplicate: boolean; unserved?: UnservedError }> {
    let place: Awaited<ReturnType<Client["placement"]>> = r.capabilityId !== "" ? await this.placement(r.capabilityId) : { listed: false };
    // A worker starting alongside the caller lists its capabilities within
    // a second: a capability is told unserved only once it stayed so that long.
    for (const deadline = Date.now() + unservedGraceMs; place.unserved !== undefined && ifUnserved !== "wait" && Date.now() < deadline; ) {
      await sleep(unservedGraceMs / 10, signal);
      if (signal?.aborted === true) throw aborted(signal, r.executionId);
      // A read that fails tells nothing: the capability stays unserved
      // until a read finds a worker for it.
      const next = await this.placement(r.capabilityId);
      if (next.unread !== true) place = next;
    }
    const subject = place.listed ? this.names.exec(this.principal, r.capabilityId) : this.names.unrouted(this.principal);
    const unserved = (queued: boolean): UnservedError | undefined =>
      place.unserved === undefined ? undefined : new UnservedError(r.capabilityId, { ...place.unserved, queued, executionId: r.executionId });
    if (ifUnserved === "refuse" && place.unserved !== undefined) throw unserved(false) as UnservedError;
    let data: Uint8Array;
    try {
      data = wire.encodeRequest(r);
    } catch (err) {
      throw new CapstanError("INVALID_ARGUMENT", `capstan: input does not encode: ${(err as Error).message}`, { cause: err, executionId: r.executionId });
    }
    // The exec stream's dedup id: the execution's key, tagged by the connection's key.
    const ack = await this.publish(subject, data, this.msgIds.request(this.principal, r.executionId), r.executionId, signal);
    const u = ifUnserved === "queue" ? unserved(true) : undefined;
    return u === undefined ? ack : { ...ack, unserved: u };
  }

  private ifUnserved(o: CallOptions): IfUnserved {
    return o.ifUnserved ?? this.opts.ifUnserved ?? "queue";
  }

  /**
   * Publishes one execution request and returns its execution id once
   * JetStream stored it. Submitting the same id again within the dedup
   * window is a no-op. An id that can never name a capability is refused
   * with a CAPABILITY_NOT_FOUND CapabilityError, unpublished; with
   * ifUnserved "refuse", a capability no live worker serves with an
   * UnservedError, unpublished; a request its principal's full queue
   * refuses, with a QUOTA_EXCEEDED CapabilityError naming the quota and its
   * limit (docs/design.md §12 "Quotas").
   */
  async submit(capabilityId: string, input?: unknown, options: CallOptions = {}): Promise<string> {
    this.checkOpen();
    const r = this.newRequest(capabilityId, input, options);
    const bad = wire.invalidCapabilityId(capabilityId);
    if (bad !== undefined) throw notFound(bad);
    await this.send(r, options.signal, this.ifUnserved(options) === "refuse" ? "refuse" : "wait");
    return r.executionId;
  }

  /**
   * Submits and awaits. Rejects only for transport trouble; governed
   * outcomes (completed, failed, cancelled, approval-required) are in the
   * envelope. An id that can never name a capability is answered, never
   * published, with a failed CAPABILITY_NOT_FOUND envelope, and a request
   * its principal's full queue refuses, never stored, with a failed
   * QUOTA_EXCEEDED one. A capability no live worker serves rejects at once
   * with an UnservedError (queued, by default; see ClientOptions.ifUnserved).
   */
  async call(capabilityId: string, input?: unknown, options: CallOptions = {}): Promise<Envelope> {
    this.checkOpen();
    const r = this.newRequest(capabilityId, input, options);
    const bad = wire.invalidCapabilityId(capabilityId);
    if (bad !== undefined) {
      return {
        v: wire.version,
        executionId: r.executionId,
        capabilityId,
        status: "failed",
        error: { code: "CAPABILITY_NOT_FOUND", message: "No such capability.", retryable: false, exposeToModel: true, stage: "resolve" },
        attempts: 0,
        durationMs: 0,
        finalizedAt: r.submittedAt,
      };
    }
    return this.sendAndAwait(r, options.id === undefined, options);
  }

  /**
   * Follows the progress of one of this principal's executions until the
   * returned function is called: fn gets each report that decodes, of that
   * execution, on its own subject, its message cleaned, one at a time and in
   * order. The subscription goes out before anything the caller publishes
   * next on the connection, so the server knows of it before any worker may
   * report. Without fn nothing is subscribed.
   */
  private followProgress(id: string, fn: ((p: Progress) => void) | undefined): () => void {
    if (fn === undefined) return () => undefined;
    const subject = this.names.progress(this.principal, id);
    let stopped = false;
    const sub = this.nc.subscribe(subject, {
      callback: (err, m) => {
        if (err !== null || stopped || m.subject !== subject) return;
        let p: Progress;
        try {
          p = wire.decodeProgress(m.data);
        } catch (e) {
          this.log.debug?.("progress report does not decode: ignored", { executionId: id, err: (e as Error).message });
          return;
        }
        if (p.executionId !== id) return;
        // Whoever published it (an open server keeps no one out), the
        // message is one printable line.
        const message = wire.cleanProgressMessage(p.message ?? "");
        if (message === "") delete p.message;
        else p.message = message;
        try {
          fn(p);
        } catch (e) {
          this.log.warn?.("onProgress threw", { executionId: id, err: (e as Error).message });
        }
      },
    });
    return () => {
      stopped = true;
      if (!this.nc.isClosed()) sub.unsubscribe();
    };
  }

  private async sendAndAwait(r: Request, ownId: boolean, options: CallOptions): Promise<Envelope> {
    const stop = this.followProgress(r.executionId, options.onProgress);
    try {
      return await this.sendAndAwaitEnvelope(r, ownId, options);
    } finally {
      stop();
    }
  }

  private async sendAndAwaitEnvelope(r: Request, ownId: boolean, options: CallOptions): Promise<Envelope> {
    const id = r.executionId;
    const reconnects = this.w.reconnects;
    const w = this.w.add(id);
    let ack: { duplicate: boolean; unserved?: UnservedError };
    try {
      ack = await this.send(r, options.signal, r.approvalId !== undefined ? "wait" : this.ifUnserved(options));
      if (ack.unserved !== undefined) {
        // Stored, and no live worker serves it: said at once, unless a
        // caller's own id names an execution that has ended already.
        const env = ownId ? undefined : await this.loadEnvelope(this.principal, id, options.signal).catch(() => undefined);
        if (env !== undefined) {
          this.w.remove(id, w.waiter);
          return env;
        }
        throw ack.unserved;
      }
    } catch (err) {
      this.w.remove(id, w.waiter);
      if (err instanceof CapabilityError && err.code === "QUOTA_EXCEEDED") {
        // Refused at the door: an envelope that was never stored, as for a
        // capability id that can never be one.
        return refusedEnvelope(r, err);
      }
      throw err;
    }
    try {
      // A request under an id the client made and the stream took as new
      // had no envelope before the waiter: it can only come on the
      // subscription, unless the connection reconnected since.
      if (!ownId || ack.duplicate || this.w.reconnects !== reconnects) {
        const env = await this.loadEnvelope(this.principal, id, options.signal).catch((e: unknown) => {
          if (e instanceof CapstanError && (e.code === "DECODE" || e.code === "ABORTED")) throw e;
          return undefined; // unreadable for now: the waiter's re-reads cover it
        });
        if (env !== undefined) {
          this.w.remove(id, w.waiter);
          return env;
        }
      }
      return await this.w.wait(id, w, options.signal);
    } catch (err) {
      if (err instanceof CapstanError && err.code === "ABORTED" && options.cancelOnAbort === true) {
        this.cancel(id).catch((e: unknown) => this.log.warn?.("cancel after abort failed", { executionId: id, err: (e as Error).message }));
      }
      throw err;
    }
  }

  /**
   * Waits for an execution's envelope until signal ends the wait. An
   * execution whose envelope is no longer kept fails at once with an
   * ExpiredError (code EXPIRED); an id of which nothing is stored, as the
   * workers tell (no request in its queue, no record, no envelope), with
   * UNKNOWN_EXECUTION: at once, or, for an id made less than two seconds
   * ago (its request may be on its way), once it is two seconds old.
   */
  async await(executionId: string, options: AwaitOptions = {}): Promise<Envelope> {
    this.checkOpen(executionId);
    const bad = wire.invalidExecutionId(executionId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${bad}`);
    const stop = this.followProgress(executionId, options.onProgress);
    try {
      return await this.awaitEnvelope(executionId, options);
    } finally {
      stop();
    }
  }

  private async awaitEnvelope(executionId: string, options: AwaitOptions): Promise<Envelope> {
    const w = this.w.add(executionId);
    let probeInMs: number | undefined;
    let ended = false; // the workers read its envelope where this client's replica did not
    try {
      const env = await this.loadEnvelope(this.principal, executionId, options.signal);
      if (env !== undefined) {
        this.w.remove(executionId, w.waiter);
        return env;
      }
      const xerr = await this.expired(this.principal, executionId, options.signal);
      if (xerr !== undefined) throw xerr;
      // Nothing stored of it, as the workers tell: it fails at once. An id
      // made a moment ago may name a request on its way: the workers are
      // asked once it is old enough.
      const made = wire.executionIdTime(executionId);
      const young = made === undefined ? 0 : made.getTime() + probeAfterMs - Date.now();
      if (young > 0) probeInMs = young;
      else {
        const state = await this.probeState(executionId, options.signal);
        if (state === "unknown") throw unknownExecution(executionId);
        ended = state === "ended";
      }
    } catch (err) {
      if (err instanceof CapstanError && ["EXPIRED", "ABORTED", "DECODE", "UNKNOWN_EXECUTION"].includes(err.code)) {
        this.w.remove(executionId, w.waiter);
        throw err;
      }
      // Unreadable for now: the waiter, registered before the read, gets
      // an envelope stored since, and its re-reads cover the read that failed.
      this.log.debug?.("envelope unreadable for now; waiting for it", { executionId, err: (err as Error).message });
    }
    if (ended) {
      this.w.remove(executionId, w.waiter);
      return this.loadEnded(executionId, options.signal);
    }
    if (probeInMs === undefined) return this.w.wait(executionId, w, options.signal);
    // Asked once the id is old enough, and again while the workers give no
    // answer; once they say it exists, the wait goes on as any other.
    const gone = new AbortController();
    const endedNow = new Error("ended: its envelope is read");
    let timer: NodeJS.Timeout | undefined;
    const ask = (): void => {
      void this.probeState(executionId, options.signal).then((state) => {
        if (state === "unknown") gone.abort(unknownExecution(executionId));
        else if (state === "ended") gone.abort(endedNow); // stored before the waiter, or where this client's replica has not applied it
        else if ((state === undefined || state === "uncertain") && !gone.signal.aborted && options.signal?.aborted !== true) timer = setTimeout(ask, probeAfterMs);
      });
    };
    timer = setTimeout(ask, probeInMs);
    try {
      return await this.w.wait(executionId, w, options.signal === undefined ? gone.signal : AbortSignal.any([options.signal, gone.signal]));
    } catch (err) {
      if (gone.signal.aborted && options.signal?.aborted !== true) {
        if (gone.signal.reason === endedNow) return await this.loadEnded(executionId, options.signal);
        throw gone.signal.reason as CapstanError;
      }
      throw err;
    } finally {
      gone.abort(); // stops asking
      clearTimeout(timer);
    }
  }

  /** Where the workers say this principal's execution is; undefined when they give no answer. */
  private async probeState(executionId: string, signal?: AbortSignal): Promise<string | undefined> {
    // Where reads may lag, the execution itself is asked for rather than
    // where it is: its state says "ended" whenever the workers read its
    // envelope (Go: Client.probeState).
    const probe = !this.readsMayLag();
    try {
      const v = await this.execution(executionId, { probe, owner: this.principal, timeoutMs: probeWaitMs, ...(signal !== undefined ? { signal } : {}) });
      return v.state;
    } catch (err) {
      if (!probe && err instanceof CapstanError && err.code === "UNKNOWN_EXECUTION") return "unknown";
      return undefined;
    }
  }

  /**
   * Decides, for an execution of owner's whose envelope was not found,
   * whether it expired: its UUIDv7 id is older than the retention, and no
   * record of it is in flight.
   */
  private async expired(owner: string, id: string, signal?: AbortSignal): Promise<ExpiredError | undefined> {
    const made = wire.executionIdTime(id);
    if (made === undefined || this.retentionMs <= 0) return undefined;
    const age = Date.now() - made.getTime();
    if (age < Math.min(this.maxStartWithinMs, 60_000)) return undefined;
    await this.readRetention(); // now: an operator may have changed it
    if (age < this.retentionMs) return undefined;
    const rec = await this.loadRecord(owner, id, signal);
    if (rec === undefined) return new ExpiredError(id, made, this.retentionMs);
    if (inFlight(rec)) return undefined;
    if ((await this.loadEnvelope(owner, id, signal)) !== undefined) return undefined;
    return new ExpiredError(id, made, this.retentionMs, rec);
  }

  /** Reads the execution's record and envelope. */
  async status(executionId: string, options: AwaitOptions = {}): Promise<ExecutionStatus> {
    this.checkOpen(executionId);
    const bad = wire.invalidExecutionId(executionId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${bad}`);
    let [record, envelope] = await Promise.all([
      this.loadRecord(this.principal, executionId, options.signal),
      this.loadEnvelope(this.principal, executionId, options.signal),
    ]);
    if (record === undefined && envelope === undefined && this.readsMayLag()) {
      const v = await this.askedOf(executionId, options.signal);
      record = v?.record;
      envelope = v?.envelope;
      if (envelope !== undefined && (v?.omitted?.length ?? 0) > 0) {
        // Cut to fit the reply: the whole is read again, once the replica
        // that answers holds it.
        const bound = AbortSignal.timeout(probeWaitMs);
        envelope = (await this.loadEnded(executionId, options.signal === undefined ? bound : AbortSignal.any([options.signal, bound])).catch(() => undefined)) ?? envelope;
      }
    }
    const s: ExecutionStatus = {};
    if (record !== undefined) s.record = record;
    if (envelope !== undefined) s.envelope = envelope;
    if (record !== undefined && envelope !== undefined && record.state !== "finalized") {
      // The envelope is the proof of the end: a worker does not rewrite the
      // record after it. Show the record as it stands for what the envelope says.
      s.record = { ...record, state: "finalized", status: envelope.status, attempt: envelope.attempts };
    }
    if (s.record === undefined && s.envelope === undefined) {
      const xerr = await this.expired(this.principal, executionId, options.signal);
      if (xerr !== undefined) throw xerr;
      throw new CapstanError("UNKNOWN_EXECUTION", `capstan: no such execution: ${executionId}`, { executionId });
    }
    return s;
  }

  /**
   * Whether a read of the buckets may be answered by a replica behind its
   * stream's leader, which calls what it has not applied absent: on a
   * cluster. This client sends only direct gets, as a principal may (Go:
   * Broker.ReadsMayLag); where absence decides, it asks the workers. Once
   * seen, a cluster stays one: a connection between servers names none.
   */
  private readsMayLag(): boolean {
    if ((this.nc.info?.cluster ?? "") !== "") this.clustered = true;
    return this.clustered;
  }

  /**
   * What the workers hold of this principal's execution, for a status whose
   * reads found nothing where reads may lag (Go: Client.askedOf): undefined
   * when they hold nothing, or no worker runs. A quota's refusal is waited
   * out, at most maxQuotaWaits times; no answer rejects, rather than calling
   * the execution unknown.
   */
  private async askedOf(executionId: string, signal?: AbortSignal): Promise<wire.ExecutionView | undefined> {
    for (let waits = 0; ; waits++) {
      try {
        return await this.execution(executionId, { owner: this.principal, ...(signal !== undefined ? { signal } : {}) });
      } catch (err) {
        if (err instanceof CapstanError && (err.code === "UNKNOWN_EXECUTION" || err.code === "NO_WORKERS")) return undefined;
        const retryAfterMs = err instanceof CapabilityError && err.code === "QUOTA_EXCEEDED" ? err.details?.retryAfterMs : undefined;
        if (typeof retryAfterMs !== "number" || waits >= maxQuotaWaits || signal?.aborted === true) {
          throw new CapstanError("TRANSPORT", `capstan: ${executionId} is on no replica this client reads, and the workers did not say whether it exists: ${(err as Error).message}`, { cause: err, executionId });
        }
        await sleep(retryAfterMs, signal);
      }
    }
  }

  /**
   * The envelope of an execution the workers say ended, read again while
   * the replica that answers has not applied it, until signal aborts.
   */
  private async loadEnded(executionId: string, signal?: AbortSignal): Promise<Envelope> {
    for (let tries = 0; ; tries++) {
      const env = await this.loadEnvelope(this.principal, executionId, signal);
      if (env !== undefined) return env;
      if (signal?.aborted === true) throw aborted(signal, executionId);
      await sleep(Math.min(50 * 2 ** tries, 1000), signal);
    }
  }

  /**
   * Asks the workers for one execution as this principal may see it (Go:
   * Client.Execution): where it is (state), its record, envelope and the
   * approvals behind it. With probe, the state alone: "queued" when its
   * request is stored and no worker has taken it yet, which status cannot
   * tell from an id nothing is known of. Nothing stored of it (without
   * probe) rejects with UNKNOWN_EXECUTION, another refusal with REFUSED
   * (conditions: forbidden, not_found, invalid); no worker answering with
   * NO_WORKERS.
   */
  async execution(executionId: string, options: ExecutionOptions = {}): Promise<wire.ExecutionView> {
    const bad = wire.invalidExecutionId(executionId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${bad}`);
    const req: wire.ExecutionRequest = { v: wire.version, executionId };
    if (options.owner !== undefined) req.owner = options.owner;
    if (options.probe === true) req.probe = true;
    const what = `read execution ${executionId}`;
    const m = await this.workerRequest(what, this.names.execution(this.principal), wire.encodeExecutionRequest(req), { timeoutMs: executionRequestMs, ...options }, executionId);
    const v = decoded(() => wire.decodeExecutionView(m.data), executionId);
    if (v.error !== undefined) {
      const conditions = v.conditions ?? [];
      if (conditions.includes("quota_exceeded")) throw refusal("", v.error, conditions, v.details);
      const code = conditions.includes("unknown") ? "UNKNOWN_EXECUTION" : "REFUSED";
      throw new CapstanError(code, `capstan: ${what}: ${v.error}`, { conditions, executionId });
    }
    return v;
  }

  /**
   * Asks the workers to cancel one of this principal's executions (an
   * admin's credentials may name another principal as owner). Cancelling is
   * terminal at any point: before a claim, during an attempt, during a
   * backoff. An execution that ended is not changed: the reply says
   * finalized and its status. An id of which nothing is stored rejects with
   * UNKNOWN_EXECUTION (EXPIRED for one older than the retention), and
   * nothing is recorded. A refusal the workers answer rejects with REFUSED,
   * the reply attached as its cause.
   */
  async cancel(executionId: string, options: { owner?: string; signal?: AbortSignal; timeoutMs?: number } = {}): Promise<CancelReply> {
    const bad = wire.invalidExecutionId(executionId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${bad}`);
    const body = options.owner !== undefined ? new TextEncoder().encode(JSON.stringify({ owner: options.owner })) : undefined;
    const m = await this.workerRequest(`cancel ${executionId}`, this.names.cancel(this.principal, executionId), body, options, executionId);
    let r: CancelReply;
    try {
      r = JSON.parse(new TextDecoder().decode(m.data)) as CancelReply;
    } catch (err) {
      throw new CapstanError("DECODE", `capstan: cancel ${executionId}: bad reply: ${(err as Error).message}`, { cause: err, executionId });
    }
    if (r.conditions?.includes("unknown") === true) {
      const xerr = await this.expired(options.owner ?? this.principal, executionId, options.signal);
      if (xerr !== undefined) throw xerr;
      throw new CapstanError("UNKNOWN_EXECUTION", `capstan: cancel ${executionId}: no such execution: nothing of it is stored; nothing was recorded`, { executionId, conditions: r.conditions });
    }
    if (r.error !== undefined && r.error !== "") {
      if (r.conditions?.includes("quota_exceeded") === true) throw refusal("", r.error, r.conditions, r.details);
      throw new CapstanError("REFUSED", `capstan: cancel ${executionId}: ${r.error}`, { cause: r, executionId });
    }
    return r;
  }

  /** A core NATS request only workers serve: NO_WORKERS when none answers. */
  private async workerRequest(what: string, subject: string, body: Uint8Array | undefined, o: { signal?: AbortSignal; timeoutMs?: number }, executionId?: string): Promise<Msg> {
    this.checkOpen(executionId);
    try {
      return await abortable(this.nc.request(subject, body, { timeout: o.timeoutMs ?? requestMs }), o.signal, executionId);
    } catch (err) {
      if (err instanceof CapstanError) throw err;
      if (isNoResponders(err)) throw new CapstanError("NO_WORKERS", `capstan: no worker is serving: ${what}`, { cause: err, executionId });
      throw new CapstanError("TRANSPORT", `capstan: ${what}: ${(err as Error).message}`, { cause: err, executionId });
    }
  }

  /**
   * Which capabilities a surface and an actor may see within scope, each
   * with the JSON Schema of its input. A refusal (a malformed actor, one the
   * grant does not allow) rejects with a CapabilityError. Every description
   * is audited as capabilities.discovered under the returned id.
   */
  async describe(options: DescribeOptions = {}): Promise<Discovery> {
    const req: wire.DescribeRequest = { v: wire.version, surface: options.surface ?? this.opts.surface ?? "direct" };
    const actor = options.actor ?? this.opts.actor;
    if (actor !== undefined) req.actor = actor;
    if (options.scope !== undefined) req.scope = options.scope;
    const m = await this.workerRequest("describe", this.names.describe(this.principal), wire.encodeDescribeRequest(req), options);
    const r = decoded(() => wire.decodeDescribeReply(m.data));
    if (r.error !== undefined) throw new CapabilityError(r.error);
    const { error: _error, ...discovery } = r;
    return discovery;
  }

  /**
   * Runs an approved call as a new execution (the request names only its
   * approval: the workers take the capability, input, actor and surface
   * from it, and refuse one another principal asked for) and awaits its
   * envelope. Of every execution resuming one approval, exactly one runs;
   * the others end APPROVAL_CONSUMED.
   */
  async resume(approvalId: string, options: Omit<CallOptions, "actor"> = {}): Promise<Envelope> {
    this.checkOpen();
    const r = this.resumeRequest(approvalId, options);
    return this.sendAndAwait(r, options.id === undefined, options);
  }

  /** Submits a resume (see resume) and returns its execution id. */
  async submitResume(approvalId: string, options: Omit<CallOptions, "actor"> = {}): Promise<string> {
    this.checkOpen();
    const r = this.resumeRequest(approvalId, options);
    await this.send(r, options.signal);
    return r.executionId;
  }

  private resumeRequest(approvalId: string, o: Omit<CallOptions, "actor">): Request {
    const bad = wire.invalidExecutionId(approvalId);
    if (bad !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: approval id: ${bad.replace("execution id", "id")}`);
    const now = new Date();
    const r: Request = {
      v: wire.version,
      executionId: o.id ?? wire.newExecutionId(),
      capabilityId: "",
      submittedAt: formatTimestamp(timestampOfDate(now)),
      startBy: this.startBy(now, o.startWithinMs),
      approvalId,
    };
    if (o.correlationId !== undefined) r.correlationId = o.correlationId;
    if (o.deadline !== undefined) r.deadline = timeText(o.deadline);
    if (o.traceparent !== undefined) r.traceparent = o.traceparent;
    const badId = wire.invalidExecutionId(r.executionId);
    if (badId !== undefined) throw new CapstanError("INVALID_ARGUMENT", `capstan: ${badId}`);
    return r;
  }

  private async listApprovals(o: ListApprovalsOptions & { id?: string }): Promise<ApprovalsPage> {
    const req: wire.ListRequest = { v: wire.version };
    if (o.id !== undefined) req.id = o.id;
    if (o.status !== undefined) req.status = o.status;
    if (o.capabilityId !== undefined) req.capabilityId = o.capabilityId;
    if (o.actor !== undefined) req.actor = o.actor;
    if (o.decided === true) req.decided = true;
    if (o.newest === true) req.newest = true;
    if (o.limit !== undefined) req.limit = o.limit;
    if (o.cursor !== undefined) req.cursor = o.cursor;
    const m = await this.workerRequest("list approvals", this.names.listApprovals(this.principal), wire.encodeListRequest(req), o);
    const r = decoded(() => wire.decodeListReply(m.data));
    if (r.error !== undefined) throw refusal("list approvals", r.error, r.conditions, r.details);
    const page: ApprovalsPage = { records: r.records };
    if (r.next !== undefined) page.next = r.next;
    if (r.trimmed !== undefined) page.trimmed = r.trimmed;
    return page;
  }

  private async decide(approvalId: string, o: DecideOptions): Promise<Approval> {
    const req: wire.DecideRequest = { v: wire.version, approvalId, approve: o.approve };
    if (o.comment !== undefined) req.comment = o.comment;
    if (o.approver !== undefined) req.approver = o.approver;
    if (o.selfApproval !== undefined) req.selfApproval = o.selfApproval;
    const m = await this.workerRequest(`decide ${approvalId}`, this.names.decide(this.principal), wire.encodeDecideRequest(req), o);
    const r = decoded(() => wire.decodeDecideReply(m.data));
    if (r.error !== undefined) {
      if (r.conditions?.includes("quota_exceeded") === true) throw refusal("", r.error, r.conditions, r.details);
      throw new CapstanError("REFUSED", `capstan: decide ${approvalId}: ${r.error}`, { conditions: r.conditions ?? [], cause: r.record });
    }
    if (r.record === undefined) throw new CapstanError("DECODE", `capstan: decide ${approvalId}: a reply without the approval`);
    return r.record;
  }
}

function unknownExecution(executionId: string): CapstanError {
  return new CapstanError("UNKNOWN_EXECUTION", `capstan: no such execution: ${executionId}: neither its request, nor its record, nor its envelope is stored`, { executionId });
}

function notFound(cause: string): CapabilityError {
  return new CapabilityError(
    { code: "CAPABILITY_NOT_FOUND", message: "No such capability.", retryable: false, exposeToModel: true, stage: "resolve" },
    { cause: new Error(`capstan: invalid capability id: ${cause}`) },
  );
}

/** A record decoded, or CapstanError DECODE. */
/**
 * A refusal the workers answered: a quota's is a CapabilityError
 * QUOTA_EXCEEDED with its details (the quota, its limit, retryAfterMs),
 * as Go's *envelope.CapabilityError; any other is REFUSED with its
 * conditions.
 */
function refusal(what: string, message: string, conditions: string[] | undefined, details: Record<string, unknown> | undefined): Error {
  if (conditions?.includes("quota_exceeded") === true) {
    const e: EnvelopeError = { code: "QUOTA_EXCEEDED", message, retryable: details?.retryAfterMs !== undefined, exposeToModel: true };
    if (details !== undefined) e.details = details;
    return new CapabilityError(e);
  }
  return new CapstanError("REFUSED", `capstan: ${what}: ${message}`, { conditions: conditions ?? [] });
}

function decoded<T>(f: () => T, executionId?: string): T {
  try {
    return f();
  } catch (err) {
    if (err instanceof DecodeError) {
      throw new CapstanError("DECODE", `capstan: record does not decode: ${err.message}`, { cause: err, executionId });
    }
    throw err;
  }
}

/** Whether a record is of an execution that may still write its envelope. */
function inFlight(r: ExecutionRecord): boolean {
  if (r.state === "finalized") return false;
  if (r.state === "pending") return true;
  return r.leaseUntil !== undefined && Date.now() < timeMillis(r.leaseUntil);
}

export type { Descriptor };
