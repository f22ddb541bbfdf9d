// Capabilities as Vercel AI SDK tools, without importing the SDK: each tool
// is the shape the SDK's tool() returns (a description, an input schema in
// the SDK's schema shape, an execute function), so `generateText({ tools })`
// takes them as they are. Pass the SDK's own jsonSchema to wrap the schemas
// with it instead.
//
// A tool's execute is one governed call. What it returns is what a model may
// see (docs/typescript.md): the output of a completed execution (with how it
// was known, when it was recovered from a lost attempt); only
// forModel() of a failure; for an approval, what is pending and what to do
// next — never the approval itself, which only someone else can grant.

import type { CallOptions, Client, DescribeOptions } from "./client.js";
import { CapstanError, UnservedError } from "./errors.js";
import { toJSONValue } from "./json.js";
import { executionIdFor, namesActor } from "./owner.js";
import { forModel, invalidExecutionId, recoveredForModel, type Actor, type Descriptor, type Envelope, type ModelError } from "./wire.js";

/** The schema shape the AI SDK's jsonSchema() returns (Symbol.for("vercel.ai.schema")). */
export interface SchemaLike {
  readonly jsonSchema: Record<string, unknown>;
  readonly validate: undefined;
}

/** A tool as the AI SDK's tool() makes it; S is its input schema's type (the SDK's Schema, when its jsonSchema wraps them). */
export interface Tool<S = SchemaLike> {
  description: string;
  inputSchema: S;
  execute(input: unknown, options?: { abortSignal?: AbortSignal; toolCallId?: string }): Promise<unknown>;
}

export interface ToolsOptions<S = SchemaLike> extends Omit<DescribeOptions, "signal" | "timeoutMs"> {
  /** Options of every call (the actor, a correlation id, a start window); its actor, else options.actor, else the client's, is the one the tools serve. */
  call?: Omit<CallOptions, "signal" | "id" | "cancelOnAbort">;
  /** How long a call is waited for before the model is told it is still running (default 5 min). */
  callTimeoutMs?: number;
  /** A tool's name (default: toolName(d.id), the MCP bridge's name for it, which model providers take). */
  name?: (d: Descriptor) => string;
  /** Wraps a JSON Schema for the SDK: pass `jsonSchema` from "ai" (default: an object of the same shape). */
  jsonSchema?: (schema: Record<string, unknown>) => S;
  /** Adds capstan_resume and capstan_status, as the MCP bridge adds capstan.resume and capstan.status (default true). */
  controlTools?: boolean;
}

export const resumeToolName = "capstan_resume";
export const statusToolName = "capstan_status";

const schemaSymbol = Symbol.for("vercel.ai.schema");

/** The longest tool name the model providers' APIs take. */
const maxToolName = 64;

/**
 * The tool name of a capability id, the MCP bridge's (mcpbridge.ToolName):
 * one that model providers take, ^[a-zA-Z0-9_-]{1,64}$. Dots (and any other
 * character) become underscores; an id longer than 64 bytes (ids have up to
 * 128) keeps its first 55 and its FNV-1a hash, so that two ids stay two
 * names.
 */
export function toolName(capabilityId: string): string {
  const name = Array.from(capabilityId, (c) => (/^[a-zA-Z0-9_-]$/.test(c) ? c : "_")).join("");
  if (name.length <= maxToolName) return name;
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(capabilityId)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return `${name.slice(0, maxToolName - 9)}_${h.toString(16).padStart(8, "0")}`;
}

/** A model's argument as text ("" when it is not text). */
function text(v: unknown): string {
  return typeof v === "string" ? v : "";
}

/** The input schema of a control tool: one required string, an id. */
function idInput(name: string, description: string): Record<string, unknown> {
  return { type: "object", required: [name], properties: { [name]: { type: "string", description } } };
}

function schemaLike(schema: Record<string, unknown>): SchemaLike {
  return { [schemaSymbol]: true, _type: undefined, jsonSchema: schema, validate: undefined } as unknown as SchemaLike;
}

/**
 * The capabilities the client's surface and actor may see (describe), as AI
 * SDK tools keyed by tool name.
 *
 * The tools serve one actor, options.call.actor, else options.actor (the
 * one whose tools are listed), else the client's: their calls run as it, and capstan_status answers only the executions it
 * started, as the MCP bridge's capstan.status does. Each execution the tools
 * start has an id that names the actor (a UUIDv7 and a tag hashed from it
 * and the actor, the bridge's), and capstan_status reads no other: an
 * execution of another actor of the same principal is answered NOT_FOUND,
 * as one that does not exist, and nothing of it is read. capstan_resume
 * likewise runs only the actor's own approvals: another actor's is "No such
 * approval.", as an unknown one, and nothing runs. Give each actor its own
 * tools.
 *
 * Without any actor, the capabilities' tools refuse every call (a call
 * needs one), capstan_status reads any execution of the principal by its
 * id, as Client.status does, and capstan_resume runs any of its approvals:
 * the principal is then the only boundary.
 */
export async function aiTools<S = SchemaLike>(client: Client, options: ToolsOptions<S> = {}): Promise<Record<string, Tool<S>>> {
  const discovery = await client.describe(options);
  const wrap = options.jsonSchema ?? (schemaLike as unknown as (schema: Record<string, unknown>) => S);
  const nameOf = options.name ?? ((d: Descriptor) => toolName(d.id));
  const actor = options.call?.actor ?? options.actor ?? client.actor;
  const tools: Record<string, Tool<S>> = {};
  for (const d of discovery.capabilities) {
    const name = nameOf(d);
    if (name in tools) throw new CapstanError("INVALID_ARGUMENT", `capstan: two capabilities are both the tool ${name}`);
    const { schema, wrapped } = objectSchema(jsonSafe(d.inputSchema ?? {}) as Record<string, unknown>);
    let description = d.requiresApproval === true ? `${d.description} Needs someone else's approval before it runs.`.trim() : d.description;
    if (d.paused !== undefined) {
      // An operator's pause (docs/design.md §18): the model learns it before it calls.
      const what = d.paused.refuse === true ? "calls fail at once with PAUSED" : "calls wait until it is lifted";
      description = `PAUSED by an operator (${d.paused.reason}): ${what}. ${description}`.trim();
    }
    tools[name] = {
      description,
      inputSchema: wrap(schema),
      execute: async (input, o) => {
        const args = wrapped ? (input as { input?: unknown } | undefined)?.input : input;
        return run(client, options, (signal) => client.call(d.id, args ?? {}, callOptions(options, actor, signal, o?.toolCallId)), o?.abortSignal);
      },
    };
  }
  if (options.controlTools !== false) {
    tools[resumeToolName] = {
      description:
        "Runs a call that needed an approval, once someone else approved it. Give the approvalId from the approval-required result. It runs at most once, whoever asks.",
      inputSchema: wrap(idInput("approvalId", "The approval id.")),
      execute: async (input, o) => {
        const approvalId = text((input as { approvalId?: unknown } | undefined)?.approvalId);
        if (actor !== undefined && invalidExecutionId(approvalId) === undefined) {
          // The workers would run another actor's approval (of the same
          // principal) as that actor, and show this one its result.
          let asked: Actor | undefined;
          try {
            asked = (await client.approvals.get(approvalId, { signal: o?.abortSignal })).actor;
          } catch (err) {
            if (err instanceof CapstanError && err.code === "ABORTED") throw err;
            const unknown = err instanceof CapstanError && err.code === "REFUSED" && (err.conditions.includes("not_found") || err.conditions.includes("forbidden"));
            if (!unknown) return unavailable(err);
          }
          if (asked === undefined || asked.kind !== actor.kind || asked.id !== actor.id) return noSuchApproval();
        }
        return run(client, options, (signal) => client.resume(approvalId, callOptions(options, actor, signal, o?.toolCallId)), o?.abortSignal);
      },
    };
    tools[statusToolName] = {
      description:
        "Reads the result of an execution you started, by its executionId: the result if it ended, else its state. Use it after a call that was still running.",
      inputSchema: wrap(idInput("executionId", "The execution id.")),
      execute: async (input, o) => {
        const id = text((input as { executionId?: unknown } | undefined)?.executionId);
        // An id without a tag (one these tools made before they tagged ids,
        // or made elsewhere) names no actor: the bridge judges such an id by
        // its audit trail, which this client does not read (nor may a
        // producer), so it is answered as another actor's would be.
        if (invalidExecutionId(id) !== undefined || (actor !== undefined && !namesActor(actor, id))) return notFound();
        try {
          return await statusForTheModel(client, id, o?.abortSignal);
        } catch (err) {
          if (err instanceof CapstanError && (err.code === "UNKNOWN_EXECUTION" || err.code === "EXPIRED" || err.code === "INVALID_ARGUMENT")) {
            return notFound();
          }
          return unavailable(err);
        }
      },
    };
  }
  return tools;
}

/** What capstan_resume tells a model of an approval it does not run: as the workers answer an unknown one, and nothing ran. */
function noSuchApproval(): unknown {
  return { status: "failed", error: { code: "FORBIDDEN", message: "No such approval.", retryable: false } };
}

/** What capstan_status tells a model of an execution it does not answer for: no such execution, whether one exists or not. */
function notFound(): unknown {
  return { error: { code: "NOT_FOUND", message: "No such execution, or its result is no longer kept.", retryable: false } };
}

/**
 * What capstan_status tells a model of an execution. Neither a record nor an
 * envelope: the workers say whether its request is stored and no worker has
 * taken it yet (queued: still running, as far as the model is concerned),
 * or nothing is stored of it (UNKNOWN_EXECUTION: not found). When they
 * cannot tell (no worker answers, a backlog too long to read), the model is
 * told capstan is unavailable and to ask again before calling again — never
 * that there is no such execution.
 */
async function statusForTheModel(client: Client, id: string, signal?: AbortSignal): Promise<unknown> {
  let s;
  try {
    s = await client.status(id, { signal });
  } catch (err) {
    if (!(err instanceof CapstanError && err.code === "UNKNOWN_EXECUTION")) throw err;
    let v;
    try {
      v = await client.execution(id, { probe: true, owner: client.principal, signal });
    } catch (perr) {
      if (perr instanceof CapstanError && (perr.code === "UNKNOWN_EXECUTION" || perr.code === "ABORTED")) throw perr;
      return unavailable(new CapstanError("TRANSPORT", (perr as Error).message, { cause: perr, executionId: id }));
    }
    switch (v.state) {
      case "queued":
        return { status: "running", executionId: id, state: "queued", next: `Queued: no worker has taken it yet. Call ${statusToolName} again later.` };
      case "unknown":
        throw err;
      case "in-flight":
      case "ended":
        s = await client.status(id, { signal }); // taken since the first read
        break;
      default: // uncertain: it may be queued
        return unavailable(new CapstanError("TRANSPORT", `capstan: the workers cannot tell whether ${id} is queued`, { executionId: id }));
    }
  }
  if (s.envelope !== undefined) return forTheModel(s.envelope);
  return { status: "running", executionId: id, state: s.record?.state, next: `Call ${statusToolName} again later.` };
}

/** A tool's call: with an actor, under an id that names it, which capstan_status then answers for. */
function callOptions<S>(options: ToolsOptions<S>, actor: Actor | undefined, signal: AbortSignal, toolCallId?: string): CallOptions {
  const o: CallOptions = { ...options.call, signal };
  if (actor !== undefined) {
    o.actor = actor;
    o.id = executionIdFor(actor);
  }
  if (o.correlationId === undefined && toolCallId !== undefined) o.correlationId = toolCallId;
  return o;
}

/**
 * Runs one call for a tool: the model's abort cancels the execution (and is
 * thrown, as the SDK expects); a call that outlives callTimeoutMs goes on,
 * and the model is told how to read its result later.
 */
async function run<S>(client: Client, options: ToolsOptions<S>, call: (signal: AbortSignal) => Promise<Envelope>, abort?: AbortSignal): Promise<unknown> {
  const timeout = AbortSignal.timeout(options.callTimeoutMs ?? 300_000);
  const signal = abort === undefined ? timeout : AbortSignal.any([abort, timeout]);
  try {
    return forTheModel(await call(signal));
  } catch (err) {
    if (err instanceof CapstanError && err.code === "ABORTED") {
      const id = err.executionId;
      if (abort?.aborted === true) {
        // The model's run was aborted: so is the call, as an MCP client's
        // notifications/cancelled cancels it.
        if (id !== undefined) {
          client.cancel(id).catch((e: unknown) => client.log.warn?.("cancel after abort failed", { executionId: id, err: (e as Error).message }));
        }
        throw err;
      }
      // Only the wait ended: the execution goes on.
      return { status: "running", executionId: id, next: `Still running. Call ${statusToolName} with this executionId later to read its result.` };
    }
    if (err instanceof CapstanError && err.code === "INVALID_ARGUMENT") {
      // Refused before anything was sent (an input too large for one
      // message): nothing ran, and no execution is there to read.
      return { error: { code: "INPUT_INVALID", message: err.message.replace(/^capstan: /, ""), retryable: false } };
    }
    if (err instanceof UnservedError) {
      client.log.warn?.("a call of a capability no live worker serves", { err: err.message });
      if (!err.queued) return { error: { code: "NOT_STARTED", message: "No worker is serving this tool now; nothing ran.", retryable: true } };
      return {
        status: "queued",
        executionId: err.executionId,
        next: `No worker is serving this tool now: the call is queued and runs once a worker starts. Call ${statusToolName} with this executionId later to read its result; do not call the tool again meanwhile.`,
      };
    }
    return unavailable(err);
  }
}

/** What a model may see of an envelope. */
export function forTheModel(env: Envelope): unknown {
  switch (env.status) {
    case "completed": {
      const note = recoveredForModel(env);
      if (note === undefined) return toJSONValue(env.output) ?? null;
      // Recovered from a lost attempt (docs/design.md §5): the model is told
      // so, lest it call again to make sure.
      return { status: "completed", executionId: env.executionId, output: toJSONValue(env.output) ?? null, recovered: env.recovered?.how, note };
    }
    case "approval-required": {
      const a = env.approval;
      const types = a?.types !== undefined && a.types.length > 0 ? `approval types ${a.types.join(", ")}` : "any approver";
      return {
        status: "approval-required",
        executionId: env.executionId,
        capabilityId: env.capabilityId,
        approvalId: a?.id,
        reasons: a?.reasons,
        types: a?.types,
        expiresAt: a?.expiresAt,
        next: `Nothing ran. Ask a person allowed to approve (${types}) to approve ${a?.id ?? ""}; then call ${resumeToolName} with this approvalId. You cannot approve it yourself.`,
      };
    }
    default:
      return { status: env.status, executionId: env.executionId, error: toJSONValue(forModel(env) ?? opaque) };
  }
}

const opaque: ModelError = { code: "INTERNAL_ERROR", message: "The operation failed.", retryable: false };

/**
 * Transport trouble, as a model may see it: capstan is unavailable, and
 * whether the call may run. A call that may run is not retryable: calling
 * again could run it twice (as the MCP bridge says too).
 */
function unavailable(err: unknown): unknown {
  const id = err instanceof CapstanError ? err.executionId : undefined;
  const message =
    id !== undefined
      ? `capstan is unavailable and did not confirm this call; it may run as execution ${id}. Call ${statusToolName} with this executionId later to learn whether it ran, before calling again.`
      : "capstan is unavailable; try again later.";
  return { error: { code: "INTERNAL_ERROR", message, retryable: id === undefined }, ...(id !== undefined ? { executionId: id } : {}) };
}

/** The keywords of a bound, which a bound no JSON number holds exactly leaves out. */
const bounds = new Set(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]);

/**
 * A schema as JSON.stringify writes it: a provider's SDK serializes tools'
 * schemas so, and throws on a bigint. A server of capstan 0.1 bounded 64-bit
 * integers by ±2^63, which msgpack decodes as bigint: such a bound, beyond
 * what a JSON number holds exactly, is left out (the workers' input check
 * still enforces it); any other bigint becomes a number where one holds it
 * exactly, else its decimal text.
 */
function jsonSafe(v: unknown): unknown {
  if (typeof v === "bigint") return Number.isSafeInteger(Number(v)) ? Number(v) : v.toString();
  if (Array.isArray(v)) return v.map(jsonSafe);
  if (v === null || typeof v !== "object" || v instanceof Date || v instanceof Uint8Array) return v;
  const out: Record<string, unknown> = {};
  for (const [k, e] of Object.entries(v)) {
    if (typeof e === "bigint" && bounds.has(k) && !Number.isSafeInteger(Number(e))) continue;
    out[k] = jsonSafe(e);
  }
  return out;
}

/**
 * An object schema for the input: the capability's own when it describes an
 * object (or anything), else one that takes the input under "input" (tool
 * arguments are objects), as the MCP bridge does.
 */
function objectSchema(s: Record<string, unknown>): { schema: Record<string, unknown>; wrapped: boolean } {
  if (Object.keys(s).length === 0) return { schema: { type: "object" }, wrapped: false };
  if (s.type === "object") return { schema: s, wrapped: false };
  if (s.type === undefined && s.properties !== undefined) return { schema: { ...s, type: "object" }, wrapped: false };
  return { schema: { type: "object", properties: { input: s }, required: ["input"] }, wrapped: true };
}
