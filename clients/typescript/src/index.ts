// @capstan-dev/client: call capstan capabilities from TypeScript.
//
//   import { connect } from "@capstan-dev/client";
//   const capstan = await connect({ creds: "secrets/alice.creds", actor: { kind: "user", id: "alice" } });
//   const env = await capstan.call("demo.echo", { hello: "world" });
//   console.log(env.status, env.output);
//
// Every governed outcome is an envelope; a promise rejects only for
// transport trouble (CapstanError) or a refusal where no envelope exists
// (CapabilityError). docs/typescript.md is the manual, docs/wire.md the
// contract.

export {
  Client,
  connect,
  defaultStartWithinMs,
  defaultURL,
  maxStartWithinMs,
  principalFromCreds,
  type Approvals,
  type ApprovalsPage,
  type AwaitOptions,
  type CallOptions,
  type CancelReply,
  type ClientOptions,
  type ConnectOptions,
  type DecideOptions,
  type DescribeOptions,
  type ExecutionOptions,
  type ExecutionStatus,
  type IfUnserved,
  type ListApprovalsOptions,
  type Logger,
  type Surface,
} from "./client.js";
export { CapabilityError, CapstanError, ExpiredError, UnservedError, type ClientErrorCode } from "./errors.js";
export { stringifyJSON, toJSONValue } from "./json.js";
export { anonymous } from "./names.js";
export { idempotencyKey, idempotencyKeyFromId, idempotencyKeyOf } from "./idempotency.js";
export {
  cleanProgressMessage,
  executionIdTime,
  forModel,
  recoveredForModel,
  maxProgressMessage,
  newExecutionId,
  progressText,
  type Actor,
  type Approval,
  type ApprovalRef,
  type ApprovalStatus,
  type Decision,
  type Descriptor,
  type Discovery,
  type Envelope,
  type EnvelopeError,
  type ErrorCode,
  type ExecutionRecord,
  type ExecutionState,
  type ExecutionView,
  type ModelError,
  type Progress,
  type QueueUsage,
  type Recovered,
  type Scope,
  type State,
  type Status,
} from "./wire.js";
