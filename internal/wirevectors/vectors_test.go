package wirevectors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

var update = flag.Bool("update", false, "write testdata/go anew from the Go codec")

// Description is the JSON file beside the vectors: what each one holds.
type Description struct {
	About   string   `json:"about"`
	Vectors []Vector `json:"vectors"`
}

// Vector is one record's bytes and what they mean.
type Vector struct {
	Name string `json:"name"`
	// Kind names the record (see decoders).
	Kind  string `json:"kind"`
	File  string `json:"file"`
	About string `json:"about"`
	// Value is the decoded record in its JSON form (encoding/json of the Go
	// type); absent for a vector to refuse.
	Value json.RawMessage `json:"value,omitempty"`
	// Canonical is the file the record encodes to once decoded: its own,
	// unless it holds something a reader drops (a field no reader knows).
	Canonical string `json:"canonical,omitempty"`
	// Refused is the client error code of a vector every reader refuses.
	Refused string `json:"refused,omitempty"`
}

// decoders read each kind of record as a client does: a record whose v is not
// envelope.Version is refused, as one that does not decode.
var decoders = map[string]func([]byte) (any, error){
	"request":         func(b []byte) (any, error) { return envelope.DecodeRequest(b) },
	"envelope":        func(b []byte) (any, error) { return envelope.DecodeEnvelope(b) },
	"record":          decodeVersioned[execution.Record],
	"descriptor":      decodeVersioned[executor.Descriptor],
	"resources":       decodeVersioned[resources],
	"describeRequest": decodeVersioned[executor.DescribeRequest],
	"describeReply":   decodeVersioned[executor.DescribeReply],
	"decideRequest":   decodeVersioned[approvalsrpc.DecideRequest],
	"decideReply":     decodeVersioned[approvalsrpc.DecideReply],
	"listRequest":     decodeVersioned[approvals.ListRequest],
	"listReply":       decodeVersioned[approvals.ListReply],
	"approval":        decodeVersioned[approvals.Record],
	"progress":        func(b []byte) (any, error) { return envelope.DecodeProgress(b) },
}

// resources is the catalog's _resources entry (broker.ResourcesKey), as
// provisioning writes it.
type resources struct {
	V                   int   `json:"v"`
	EnvelopeRetentionMs int64 `json:"envelopeRetentionMs"`
}

func decodeVersioned[T any](b []byte) (any, error) {
	v := new(T)
	if err := envelope.Unmarshal(b, v); err != nil {
		return nil, err
	}
	if got := reflect.ValueOf(v).Elem().FieldByName("V").Int(); got != envelope.Version {
		return nil, fmt.Errorf("%w: schema version %d, want %d", envelope.ErrDecode, got, envelope.Version)
	}
	return v, nil
}

const (
	execID     = "0195f3c2-7a1e-7b4d-8c2f-3e5a6b7c8d9e"
	execID2    = "0195f3c2-7a1f-7c01-9d3e-4f6a7b8c9d0e"
	approvalID = "0195f3c2-7b00-7e22-a1b2-c3d4e5f60718"
	traceCtx   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

var (
	// Times in each form of the msgpack timestamp: 4 bytes (whole seconds
	// before 2106), 8 bytes (nanoseconds, seconds below 2^34), 12 bytes
	// (later, or before 1970).
	t8   = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)
	t4   = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	tFar = time.Date(2600, 1, 2, 3, 4, 5, 6, time.UTC)
	tOld = time.Date(1969, 7, 20, 20, 17, 40, 0, time.UTC)
)

func at(t time.Time) *time.Time { return &t }

// values is an output or input holding every kind of value a record may
// carry, in a struct so that its field order is fixed.
type values struct {
	MaxUint64  uint64         `json:"maxUint64"`
	MinInt64   int64          `json:"minInt64"`
	BeyondSafe int64          `json:"beyondSafe"` // 2^53 + 1: beyond a float64's integers
	Safe       int64          `json:"safe"`       // 2^53 - 1
	Small      int            `json:"small"`
	Negative   int            `json:"negative"`
	Zero       int            `json:"zero"`
	Half       float64        `json:"half"`
	Whole      float64        `json:"whole"` // a float64 holding a whole number stays a float64
	Single     float32        `json:"single"`
	Bytes      []byte         `json:"bytes"`
	Empty      []byte         `json:"empty"`
	When       time.Time      `json:"when"`
	Text       string         `json:"text"`
	Nothing    *int           `json:"nothing"`
	List       []any          `json:"list"`
	Object     map[string]any `json:"object"`
	Yes        bool           `json:"yes"`
	No         bool           `json:"no"`
}

func everyValue() values {
	return values{
		MaxUint64: math.MaxUint64, MinInt64: math.MinInt64, BeyondSafe: 1<<53 + 1, Safe: 1<<53 - 1,
		Small: 7, Negative: -33, Half: 1.5, Whole: 3, Single: 0.25, Bytes: []byte{0, 1, 0xfe, 0xff}, Empty: []byte{},
		When: t8, Text: "héllo, 世界 😀", List: []any{1, "two", 3.5, nil, []any{}, map[string]any{}},
		Object: map[string]any{"b": 2, "a": 1}, Yes: true,
	}
}

// Strings whose lengths fall on each msgpack string form's edge.
var (
	str31  = string(bytes.Repeat([]byte("a"), 31))
	str32  = string(bytes.Repeat([]byte("b"), 32))
	str255 = string(bytes.Repeat([]byte("c"), 255))
	str256 = string(bytes.Repeat([]byte("d"), 256))
	str64k = string(bytes.Repeat([]byte("é"), 1<<15)) // 65,536 bytes: str32
)

type refund struct {
	OrderID string  `json:"orderId"`
	Amount  float64 `json:"amount"`
	Note    string  `json:"note,omitempty"`
	Tags    []string
	When    time.Time     `json:"when,omitzero"`
	Wait    time.Duration `json:"wait,omitempty"`
}

func refundSchema() map[string]any {
	return executor.InputSchema(executor.Define("orders.refund", executor.Meta{},
		func(context.Context, executor.Call[refund]) (struct{}, error) { return struct{}{}, nil }))
}

func descriptor(id string, approval bool) executor.Descriptor {
	return executor.Descriptor{V: envelope.Version, ID: id, Pool: "demo", Description: "Refunds an order — in full or in part.",
		SideEffect: "write", Risk: "high", Tags: []string{"money", "orders"}, Expose: []executor.Surface{"direct", "mcp"},
		Idempotent: true, TimeoutMs: 10000, RetryMaxAttempts: 2, RequiresApproval: approval, InputSchema: refundSchema(),
		Limits: []executor.LimitInfo{
			{Kind: executor.LimitConcurrency, Max: 4, AtLimit: executor.AtLimitWait, Text: "at most 4 running at once, 3 per principal",
				PrincipalMax: 3},
			{Kind: executor.LimitConcurrency, Per: executor.LimitPerActor, Max: 1, AtLimit: executor.AtLimitWait,
				Text: "at most 1 running at once per actor"},
			{Kind: executor.LimitBudget, Per: executor.LimitPerActor, Name: "amount", Max: 2000, IntervalMs: 86400000,
				AtLimit: executor.AtLimitApproval, Text: "amount 2000 per 24h per actor"},
		},
		ExpiresAt: t8.Add(30 * time.Second)}
}

func approvalRecord(status approvals.Status) approvals.Record {
	r := approvals.Record{V: envelope.Version, ID: approvalID, CapabilityID: "orders.refund", Surface: "mcp",
		Actor: envelope.Actor{ID: "alice", Kind: "user"}, Input: json.RawMessage(`{"amount":900,"orderId":"o-42"}`),
		InputHash: "5d2f0b4e9b0c7a1f3e8d6c5b4a392817161514131211100f0e0d0c0b0a090807",
		Reasons:   []string{"amount above 500"}, Types: []string{"finance"}, Risk: "high", SideEffect: "write",
		RequestedAt: t8, ExpiresAt: t8.Add(15 * time.Minute), Status: status, RequestedBy: execID,
		Principal: "alice", CorrelationID: "conv-7"}
	switch status {
	case approvals.StatusApproved, approvals.StatusRejected:
		r.Decision = &approvals.Decision{Status: status, Approver: envelope.Actor{ID: "carol", Kind: "user"},
			Comment: "vérifié ✓", DecidedAt: t8.Add(time.Minute)}
	case approvals.StatusConsumed:
		r.Decision = &approvals.Decision{Status: approvals.StatusApproved, Approver: envelope.Actor{ID: "carol", Kind: "user"},
			DecidedAt: t8.Add(time.Minute)}
		r.ConsumedBy, r.ConsumedAt, r.ConsumedUnder = execID2, t8.Add(2*time.Minute), t8.Add(90*time.Second)
		r.Display = json.RawMessage(`{"orderId":"o-42"}`)
	}
	return r
}

type issue struct {
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// goVectors are the records Go writes, each made as capstan makes it.
func goVectors() []struct {
	v     Vector
	value any
} {
	type vec = struct {
		v     Vector
		value any
	}
	completed := envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Status: envelope.StatusCompleted,
		Output: envelope.MustRaw(map[string]any{"hello": "world"}), Attempts: 1, DurationMs: 12, FinalizedBy: "worker-1",
		FinalizedAt: t8}
	failed := func(e envelope.Error, attempts int) envelope.Envelope {
		return envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "orders.refund", Status: envelope.StatusFailed,
			Error: &e, Attempts: attempts, DurationMs: 1534, FinalizedBy: "worker-2", FinalizedAt: t8}
	}
	full := envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "orders.refund",
		Input: envelope.MustRaw(map[string]any{"orderId": "o-42"}),
		Actor: envelope.Actor{ID: "alice", Kind: "user", Attrs: map[string]string{
			"tenant": "acme", "région": "eu", "～": "fullwidth tilde", "😀": "an emoji sorts after it in UTF-8, before it in UTF-16"}},
		Surface: "mcp", CorrelationID: "conv-7", SubmittedAt: t8, Deadline: at(t8.Add(time.Minute)),
		StartBy: at(t8.Add(24 * time.Hour)), ApprovalID: approvalID, Traceparent: traceCtx}
	running := execution.Record{V: 1, ExecutionID: execID, CapabilityID: "orders.refund", State: execution.StateRunning,
		Attempt: 2, Worker: "worker-1", Claim: "c-7f3a", LeaseUntil: t8.Add(30 * time.Second), StartedAt: t8,
		LastError: "TIMEOUT", CancelRequested: true, CancelRequestedAt: t8.Add(time.Second), ApprovalID: approvalID,
		Actor: "user:alice", Surface: "mcp", InputHash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		Status: "", Cause: "deadline exceeded", CreatedAt: t4, UpdatedAt: t8,
		Progress:   &envelope.Progress{V: 1, ExecutionID: execID, Attempt: 2, Done: 37, Total: 120, Message: "page 37 of 120", At: t8},
		KeyVersion: envelope.IdempotencyKeyVersion}
	finalized := execution.Record{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", State: execution.StateFinalized,
		Attempt: 1, Actor: "user:alice", Surface: "direct", Status: envelope.StatusCompleted, CreatedAt: t8, UpdatedAt: t8}
	pending := execution.Record{V: 1, ExecutionID: execID, State: execution.StatePending, CancelRequested: true,
		CancelRequestedAt: t8, CreatedAt: t8, UpdatedAt: t8}
	discovery := executor.Discovery{V: 1, ID: execID2, Surface: "mcp",
		Capabilities: []executor.Descriptor{descriptor("orders.refund", true), {V: 1, ID: "demo.echo", Pool: "demo",
			Description: "Returns its input.", SideEffect: "none", Expose: []executor.Surface{"mcp"}, TimeoutMs: 30000,
			InputSchema: map[string]any{}}},
		Digest: "4e1f3a0b7c2d9e8f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f", Worker: "worker-1"}

	return []vec{
		{Vector{Name: "request-minimal", Kind: "request", About: "the fewest fields a request has: no input, no actor; every empty field is left out"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", SubmittedAt: t8}},
		{Vector{Name: "request-full", Kind: "request", About: "every field; the actor's attrs sorted by their UTF-8 bytes (U+FF5E before U+1F600, the reverse of UTF-16 order)"},
			&full},
		{Vector{Name: "request-resume", Kind: "request", About: "a resume naming only its approval (sent to the _unrouted subject): no capabilityId"},
			&envelope.Request{V: 1, ExecutionID: execID2, SubmittedAt: t8, StartBy: at(t8.Add(24 * time.Hour)), ApprovalID: approvalID}},
		{Vector{Name: "request-values", Kind: "request", About: "an input of every kind of value: integers at the edges of 64 bits and of a float64's precision, floats of both widths, binary, a timestamp, nil, nested lists and maps"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Input: envelope.MustRaw(everyValue()),
				Actor: envelope.Actor{ID: "bot-1", Kind: "agent"}, Surface: "direct", SubmittedAt: t8}},
		{Vector{Name: "request-json-input", Kind: "request", About: "an input as a JSON client sends it: integers as integers, other numbers as float64; Go sorts the keys of a map it writes (encoding/json keeps no order)"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "orders.refund",
				Input: mustRawFromJSON(`{"orderId":"o-42","amount":900,"ratio":0.5,"big":18446744073709551615,"neg":-9223372036854775808,"nested":{"z":[true,false,null]}}`),
				Actor: envelope.Actor{ID: "alice", Kind: "user"}, Surface: "direct", SubmittedAt: t4}},
		{Vector{Name: "request-strings", Kind: "request", About: "strings on the edges of each msgpack string form: 31 and 32 bytes (fixstr, str8), 255 and 256 (str8, str16), 65,536 (str32); a correlation id in several scripts"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo",
				Input: envelope.MustRaw([]string{str31, str32, str255, str256, str64k}), CorrelationID: "ünïcödé-会話-😀", SubmittedAt: t8}},
		{Vector{Name: "request-times", Kind: "request", About: "timestamps in their 12-byte form: after 2514 and before 1970; one in the 4-byte form"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", SubmittedAt: tOld, Deadline: at(tFar), StartBy: at(t4)}},
		{Vector{Name: "request-empty-input", Kind: "request", About: "an empty object as input (kept: it is a value, not an absent one); an actor with a kind only"},
			&envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Input: envelope.MustRaw(map[string]any{}),
				Actor: envelope.Actor{Kind: "anonymous"}, SubmittedAt: t8}},

		{Vector{Name: "envelope-completed", Kind: "envelope", About: "a completed execution and its output"}, &completed},
		{Vector{Name: "envelope-completed-values", Kind: "envelope", About: "an output holding every kind of value (see request-values)"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Status: envelope.StatusCompleted,
				Output: envelope.MustRaw(everyValue()), Attempts: 1, DurationMs: 3, FinalizedBy: "worker-1", FinalizedAt: t8}},
		{Vector{Name: "envelope-completed-no-output", Kind: "envelope", About: "a completed execution whose handler returned nothing: no output field"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Status: envelope.StatusCompleted, Attempts: 1,
				FinalizedAt: t4}},
		{Vector{Name: "envelope-completed-scalar", Kind: "envelope", About: "an output that is a string, not an object"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "greet.hello", Status: envelope.StatusCompleted,
				Output: envelope.MustRaw("Hello, Ada!"), Attempts: 1, DurationMs: 1, FinalizedAt: t8}},
		{Vector{Name: "envelope-failed-exposed", Kind: "envelope", About: "a declared, retryable failure the model may see"},
			ptr(failed(envelope.Error{Code: envelope.CodeExecutionFailed, Message: "The card was declined.", Retryable: true,
				ExposeToModel: true, Stage: envelope.StageHandler}, 3))},
		{Vector{Name: "envelope-failed-opaque", Kind: "envelope", About: "a failure not exposed: a model sees only INTERNAL_ERROR, \"The operation failed.\""},
			ptr(failed(envelope.Error{Code: envelope.CodeExecutionFailed, Message: "connection refused by the ledger",
				Stage: envelope.StageHandler}, 1))},
		{Vector{Name: "envelope-input-invalid", Kind: "envelope", About: "INPUT_INVALID with its issues in details, written as maps with sorted keys; the only code whose details a model sees"},
			ptr(failed(envelope.Error{Code: envelope.CodeInputInvalid, Message: "The input is invalid.", ExposeToModel: true,
				Stage: envelope.StageInput, Details: map[string]any{"issues": []issue{
					{Path: "amount", Message: "want a number, got a string"}, {Message: "orderId is required"}}}}, 0))},
		{Vector{Name: "envelope-not-started", Kind: "envelope", About: "NOT_STARTED: no worker started it by its start deadline; it never ran"},
			ptr(failed(envelope.Error{Code: envelope.CodeNotStarted, Message: "No worker started the operation before its start deadline; it never ran.",
				ExposeToModel: true, Stage: envelope.StageQueue}, 0))},
		{Vector{Name: "envelope-outcome-unknown", Kind: "envelope", About: "OUTCOME_UNKNOWN: an attempt may have run and nothing may run it again"},
			ptr(failed(envelope.Error{Code: envelope.CodeOutcomeUnknown, Message: "The operation may or may not have taken effect.",
				ExposeToModel: true, Stage: envelope.StageHandler, Details: map[string]any{"recovered": "none"}}, 1))},
		{Vector{Name: "envelope-cancelled", Kind: "envelope", About: "cancelled by a per-attempt timeout, after two attempts"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.sleep", Status: envelope.StatusCancelled,
				Error: &envelope.Error{Code: envelope.CodeTimeout, Message: "The operation timed out.", Retryable: true,
					ExposeToModel: true, Stage: envelope.StageTimeout}, Attempts: 2, DurationMs: 2004, FinalizedBy: "worker-1", FinalizedAt: t8}},
		{Vector{Name: "envelope-approval-required", Kind: "envelope", About: "nothing ran: an approval of type finance is needed; resume it once approved"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "orders.refund", Status: envelope.StatusApprovalRequired,
				Approval: &envelope.ApprovalRef{ID: approvalID, Reasons: []string{"amount above 500", "montant élevé"},
					Types: []string{"finance"}, ExpiresAt: t8.Add(15 * time.Minute)},
				DurationMs: 4, FinalizedBy: "worker-1", FinalizedAt: t8}},
		{Vector{Name: "envelope-recovered", Kind: "envelope", About: "completed from the receipt attempt 1 recorded after its effect, its worker lost before it returned (design §5)"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "email.send", Status: envelope.StatusCompleted,
				Output: envelope.MustRaw(map[string]any{"outboxSeq": 42}), Attempts: 1, DurationMs: 31002, FinalizedBy: "worker-2",
				FinalizedAt: t8, Recovered: &envelope.Recovered{How: envelope.RecoveredByReceipt, Attempt: 1}}},
		{Vector{Name: "envelope-big-counts", Kind: "envelope", About: "integer fields beyond 32 bits"},
			&envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", Status: envelope.StatusCompleted,
				Attempts: 70000, DurationMs: 1 << 40, FinalizedAt: t8}},

		{Vector{Name: "record-running", Kind: "record", About: "an execution record with every field (a map16 header: more than 15 fields)"}, &running},
		{Vector{Name: "record-finalized", Kind: "record", About: "a finalized record: state finalized, the envelope's status"}, &finalized},
		{Vector{Name: "record-receipt", Kind: "record", About: "attempt 2, started after a reconciler proved attempt 1's effect absent, has recorded its receipt (design §5)"},
			&execution.Record{V: 1, ExecutionID: execID, CapabilityID: "email.send", State: execution.StateRunning, Attempt: 2,
				Worker: "worker-2", Claim: "c-9b1e", LeaseUntil: t8.Add(30 * time.Second), StartedAt: t8, Actor: "user:alice",
				Surface: "direct", CreatedAt: t4, UpdatedAt: t8, Receipt: envelope.MustRaw(map[string]any{"outboxSeq": 41}),
				ReceiptAttempt: 2, ReceiptAt: t8, Reattempts: 1}},
		{Vector{Name: "record-reconciling", Kind: "record", About: "a takeover asking the reconciler whether attempt 1 took effect, the second to ask"},
			&execution.Record{V: 1, ExecutionID: execID, CapabilityID: "email.send", State: execution.StateReconciling, Attempt: 1,
				Worker: "worker-3", Claim: "c-0d4c", LeaseUntil: t8.Add(30 * time.Second), StartedAt: t4, Actor: "user:alice",
				Surface: "direct", CreatedAt: t4, UpdatedAt: t8, Reconciliations: 2}},
		{Vector{Name: "record-pending-cancel", Kind: "record", About: "the pending record a cancel leaves before any claim"}, &pending},

		{Vector{Name: "progress", Kind: "progress", About: "a handler's progress report, as workers publish it on capstan.progress.<principal>.<executionId>: done and total are float64 whatever their value"},
			&envelope.Progress{V: 1, ExecutionID: execID, Attempt: 1, Done: 37, Total: 120, Message: "page 37 of 120 — rendu ✓", At: t8}},
		{Vector{Name: "progress-fractions", Kind: "progress", About: "fractional values, a later attempt, no message"},
			&envelope.Progress{V: 1, ExecutionID: execID, Attempt: 3, Done: 0.375, Total: 1.5, At: tFar}},
		{Vector{Name: "progress-message-only", Kind: "progress", About: "nothing counted: done and total absent (0, not known)"},
			&envelope.Progress{V: 1, ExecutionID: execID, Message: "connecting", At: t4}},

		{Vector{Name: "descriptor", Kind: "descriptor", About: "a catalog entry (key: the capability id) with its input's JSON Schema, every map's keys sorted"},
			ptr(descriptor("orders.refund", false))},
		{Vector{Name: "resources", Kind: "resources", About: "the catalog's _resources entry: how long envelopes are kept"},
			&resources{V: 1, EnvelopeRetentionMs: 25 * 3600 * 1000}},

		{Vector{Name: "describe-request", Kind: "describeRequest", About: "what a surface and an actor may see, within a scope"},
			&executor.DescribeRequest{V: 1, Surface: "mcp", Actor: envelope.Actor{ID: "ada", Kind: "user"},
				Scope: executor.Scope{Prefix: "orders.", Tags: []string{"money"}}}},
		{Vector{Name: "describe-request-minimal", Kind: "describeRequest", About: "an empty scope is left out, as every empty field"},
			&executor.DescribeRequest{V: 1, Surface: "direct", Actor: envelope.Actor{ID: "ada", Kind: "user"}}},
		{Vector{Name: "describe-request-queue", Kind: "describeRequest", About: "a principal asking for its queue, not the catalog"},
			&executor.DescribeRequest{V: 1, Queue: true}},
		{Vector{Name: "describe-reply-queue", Kind: "describeReply", About: "a principal's queue: what it holds and may hold (-1: no bound), no capabilities"},
			&executor.DescribeReply{Discovery: executor.Discovery{V: 1, Worker: "worker-1", Queue: &broker.QueueUsage{Principal: "alice",
				Stream: "CAPSTAN_EXEC_alice", Requests: 9999, Bytes: 1 << 21, MaxRequests: 10000, MaxBytes: -1}}}},
		{Vector{Name: "describe-reply", Kind: "describeReply", About: "a discovery: descriptors sorted by id, each with its input schema"},
			&executor.DescribeReply{Discovery: discovery}},
		{Vector{Name: "describe-reply-refused", Kind: "describeReply", About: "a describe refused: no capabilities field, the error instead"},
			&executor.DescribeReply{Discovery: executor.Discovery{V: 1, ID: execID2, Surface: "direct", Worker: "worker-1"},
				Error: &envelope.Error{Code: envelope.CodeForbidden, Message: "The actor is not allowed.", ExposeToModel: true,
					Stage: envelope.StageActor}}},

		{Vector{Name: "decide-request", Kind: "decideRequest", About: "an approver's decision"},
			&approvalsrpc.DecideRequest{V: 1, ApprovalID: approvalID, Approve: true, Comment: "vérifié ✓"}},
		{Vector{Name: "decide-request-open", Kind: "decideRequest", About: "a rejection on an open server, which names its approver"},
			&approvalsrpc.DecideRequest{V: 1, ApprovalID: approvalID, Approver: envelope.Actor{ID: "bob", Kind: "user"},
				SelfApproval: "on call"}},
		{Vector{Name: "decide-reply", Kind: "decideReply", About: "the decided approval"},
			&approvalsrpc.DecideReply{V: 1, Record: ptr(approvalRecord(approvals.StatusApproved))}},
		{Vector{Name: "decide-reply-refused", Kind: "decideReply", About: "a refused decision: its message and the conditions that name it"},
			&approvalsrpc.DecideReply{V: 1, Error: `capstan: self-approval is not allowed: principal "alice" requested it`,
				Conditions: []string{"self_approval"}}},
		{Vector{Name: "list-request", Kind: "listRequest", About: "a listing of pending approvals"},
			&approvals.ListRequest{V: 1, Status: approvals.StatusPending}},
		{Vector{Name: "list-request-one", Kind: "listRequest", About: "one approval by id, of one actor and capability"},
			&approvals.ListRequest{V: 1, ID: approvalID, CapabilityID: "orders.refund", Actor: envelope.Actor{ID: "alice", Kind: "user"}}},
		{Vector{Name: "list-reply", Kind: "listReply", About: "approvals in three states"},
			&approvals.ListReply{V: 1, Records: []*approvals.Record{ptr(approvalRecord(approvals.StatusPending)),
				ptr(approvalRecord(approvals.StatusRejected)), ptr(approvalRecord(approvals.StatusConsumed))}}},
		{Vector{Name: "list-reply-empty", Kind: "listReply", About: "no approvals: the empty list is left out"},
			&approvals.ListReply{V: 1, Records: []*approvals.Record{}}},
		{Vector{Name: "list-request-page", Kind: "listRequest", About: "the next page of decided approvals, newest first"},
			&approvals.ListRequest{V: 1, Limit: 20, Cursor: "eyJhIjoiYWxpY2UifQ", Decided: true, Newest: true}},
		{Vector{Name: "list-reply-page", Kind: "listReply", About: "a page cut before the rest, one record sent without its input"},
			&approvals.ListReply{V: 1, Records: []*approvals.Record{withoutInput(approvalRecord(approvals.StatusPending))},
				Next: "eyJhIjoiYWxpY2UifQ", Trimmed: []string{approvalID}}},
		{Vector{Name: "list-reply-quota", Kind: "listReply", About: "a listing refused by the principal's controlPerSecond quota"},
			&approvals.ListReply{V: 1, Records: []*approvals.Record{}, Error: "Over the controlPerSecond quota: at most 50 control requests a second. Try again in 20ms.",
				Conditions: []string{"quota_exceeded"}, Details: map[string]any{"quota": "controlPerSecond", "limit": int64(50), "retryAfterMs": int64(20)}}},
		{Vector{Name: "approval-consumed", Kind: "approval", About: "an approval record used by one execution, under the execution record created at consumedUnder; input and display are canonical JSON carried as binary"},
			ptr(approvalRecord(approvals.StatusConsumed))},
	}
}

func ptr[T any](v T) *T { return &v }

func withoutInput(r approvals.Record) *approvals.Record {
	r.Input, r.Display = nil, nil
	return &r
}

func mustRawFromJSON(s string) envelope.Raw {
	r, err := envelope.RawFromJSON([]byte(s))
	if err != nil {
		panic(err)
	}
	return r
}

// refusedVectors are bytes every client refuses as not decoding (DECODE).
func refusedVectors(t *testing.T) []struct {
	v Vector
	b []byte
} {
	type vec = struct {
		v Vector
		b []byte
	}
	completed := mustMarshal(t, &envelope.Envelope{V: 1, ExecutionID: execID, CapabilityID: "demo.echo",
		Status: envelope.StatusCompleted, Attempts: 1, FinalizedAt: t8})
	v2 := bytes.Clone(completed)
	v2[2] = 2 // the map header, "v", then its value
	noV := append([]byte{completed[0] - 1}, completed[3:]...)
	request := mustMarshal(t, &envelope.Request{V: 1, ExecutionID: execID, CapabilityID: "demo.echo", SubmittedAt: t8})
	reqV2 := bytes.Clone(request)
	reqV2[2] = 2
	badID := mustMarshal(t, &envelope.Request{V: 1, ExecutionID: "a.b", CapabilityID: "demo.echo", SubmittedAt: t8})
	noCap := mustMarshal(t, &envelope.Request{V: 1, ExecutionID: execID, SubmittedAt: t8})
	record := mustMarshal(t, &execution.Record{V: 3, ExecutionID: execID, State: execution.StateRunning})
	negative := mustMarshal(t, &envelope.Progress{V: 1, ExecutionID: execID, Done: -1, At: t8})
	infinite := mustMarshal(t, &envelope.Progress{V: 1, ExecutionID: execID, Total: math.Inf(1), At: t8})
	progressBadID := mustMarshal(t, &envelope.Progress{V: 1, ExecutionID: "a.b", At: t8})
	return []vec{
		{Vector{Name: "refused-envelope-v2", Kind: "envelope", About: "an envelope of schema version 2"}, v2},
		{Vector{Name: "refused-envelope-no-v", Kind: "envelope", About: "an envelope without v"}, noV},
		{Vector{Name: "refused-envelope-truncated", Kind: "envelope", About: "an envelope cut short"}, completed[:len(completed)-3]},
		{Vector{Name: "refused-envelope-array", Kind: "envelope", About: "an array where a map belongs"}, []byte{0x92, 0x01, 0x02}},
		{Vector{Name: "refused-envelope-crafted-length", Kind: "envelope", About: "a map header declaring 2^32-1 entries in 6 bytes"},
			[]byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0}},
		{Vector{Name: "refused-request-v2", Kind: "request", About: "a request of schema version 2"}, reqV2},
		{Vector{Name: "refused-request-bad-id", Kind: "request", About: "an execution id that is not one subject token"}, badID},
		{Vector{Name: "refused-request-no-capability", Kind: "request", About: "neither a capability id nor an approval id"}, noCap},
		{Vector{Name: "refused-record-v3", Kind: "record", About: "an execution record of schema version 3"}, record},
		{Vector{Name: "refused-progress-negative", Kind: "progress", About: "a progress report whose done is negative"}, negative},
		{Vector{Name: "refused-progress-infinite", Kind: "progress", About: "a progress report whose total is not finite"}, infinite},
		{Vector{Name: "refused-progress-bad-id", Kind: "progress", About: "an execution id that is not one subject token"}, progressBadID},
	}
}

// unknownField appends a field no reader knows to the map b holds (fewer
// than 15 fields).
func unknownField(t *testing.T, b []byte) []byte {
	t.Helper()
	if b[0]&0xf0 != 0x80 || b[0] == 0x8f {
		t.Fatalf("not a small map: % x", b[:1])
	}
	out := append([]byte{b[0] + 1}, b[1:]...)
	extra := mustMarshal(t, map[string]any{"futureField": map[string]any{"nested": []any{1, "x"}}})
	return append(out, extra[1:]...)
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := envelope.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVectors_Go checks the vectors Go wrote: Go writes the same bytes today,
// every record decodes and encodes again to its canonical bytes, and every
// vector to refuse is refused. With -update it writes them anew.
func TestVectors_Go(t *testing.T) {
	dir := filepath.Join("testdata", "go")
	desc := Description{About: "Records as capstan's Go codec writes them (docs/wire.md). Each vector's file holds one " +
		"msgpack record of its kind; value is the record decoded, in its JSON form; a reader decodes the file and " +
		"encodes it again to the bytes of canonical. A vector with refused is refused by every reader with that error code."}
	files := map[string][]byte{}
	for _, gv := range goVectors() {
		v := gv.v
		v.File, v.Canonical = v.Name+".msgpack", v.Name+".msgpack"
		files[v.File] = mustMarshal(t, gv.value)
		desc.Vectors = append(desc.Vectors, v)
	}
	// A field no reader knows is dropped: the record encodes to the one
	// without it.
	for _, name := range []string{"envelope-completed", "request-minimal"} {
		v := Vector{Name: name + "-unknown-field", File: name + "-unknown-field.msgpack", Canonical: name + ".msgpack",
			About: "a field no reader knows, ignored: it encodes again without it"}
		for _, d := range desc.Vectors {
			if d.Name == name {
				v.Kind = d.Kind
			}
		}
		files[v.File] = unknownField(t, files[name+".msgpack"])
		desc.Vectors = append(desc.Vectors, v)
	}
	for _, rv := range refusedVectors(t) {
		v := rv.v
		v.File, v.Refused = v.Name+".msgpack", "DECODE"
		files[v.File] = rv.b
		desc.Vectors = append(desc.Vectors, v)
	}
	// Each value is its record decoded, in JSON: what a reader must find.
	for i, v := range desc.Vectors {
		if v.Refused != "" {
			continue
		}
		got, err := decoders[v.Kind](files[v.File])
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		j, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		desc.Vectors[i].Value = j
	}
	descJSON, err := json.MarshalIndent(desc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	descJSON = append(descJSON, '\n')

	if *update {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "vectors.json"), descJSON, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if have := readFile(t, filepath.Join(dir, "vectors.json")); !bytes.Equal(have, descJSON) {
		t.Errorf("testdata/go/vectors.json is not what the Go codec makes today (go test ./internal/wirevectors -update, and look at the diff)")
	}
	for name, b := range files {
		if have := readFile(t, filepath.Join(dir, name)); !bytes.Equal(have, b) {
			t.Errorf("%s: the Go codec writes other bytes today:\nhave % x\n now % x", name, have, b)
		}
	}
	checkVectors(t, dir)
}

// MsgIDVector is a request's message id as a connection that signs with an
// nkey makes it (broker.MsgIDs): a client in another language must make the
// same, so that a request submitted again by any process of the principal is
// dropped as a duplicate.
type MsgIDVector struct {
	// Seed is a user nkey seed made from fixed bytes for this vector only.
	Seed        string `json:"seed"`
	Principal   string `json:"principal"`
	ExecutionID string `json:"executionId"`
	MsgID       string `json:"msgId"`
	// Unsigned is the message id of a connection that does not sign.
	Unsigned string `json:"unsigned"`
}

// TestVectors_MsgIDs checks testdata/go/msgids.json against broker.MsgIDs
// (-update writes it).
func TestVectors_MsgIDs(t *testing.T) {
	seed, err := nkeys.EncodeSeed(nkeys.PrefixByteUser, bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := broker.NewMsgIDs(&nats.Conn{Opts: nats.Options{SignatureCB: kp.Sign}})
	if err != nil {
		t.Fatal(err)
	}
	unsigned, err := broker.NewMsgIDs(&nats.Conn{})
	if err != nil {
		t.Fatal(err)
	}
	var want []MsgIDVector
	for _, c := range []struct{ principal, id string }{{"alice", execID}, {"alice", execID2}, {"bob", execID}, {"_anon", execID}} {
		want = append(want, MsgIDVector{Seed: string(seed), Principal: c.principal, ExecutionID: c.id,
			MsgID: signed.Request(c.principal, c.id), Unsigned: unsigned.Request(c.principal, c.id)})
	}
	b, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "go", "msgids.json")
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if have := readFile(t, path); !bytes.Equal(have, b) {
		t.Errorf("%s is not what broker.MsgIDs makes today:\nhave %s\nnow  %s", path, have, b)
	}
}

// KeyVector is an execution's idempotency key (envelope.IdempotencyKey):
// what a handler is given, and what the system where its effect lives
// stores. A client in another language (a service that looks effects up)
// must derive the same.
type KeyVector struct {
	Principal   string `json:"principal"`
	ExecutionID string `json:"executionId"`
	// Key is this version's key, the principal's and the id's together
	// (key version 2).
	Key string `json:"key"`
	// KeyV1 is the key an execution begun before key versions used: the
	// id's alone, the same for every principal (key version 1, or none).
	KeyV1 string `json:"keyV1"`
}

// TestVectors_IdempotencyKeys checks testdata/go/idempotency-keys.json
// against envelope.IdempotencyKeyOf (-update writes it).
func TestVectors_IdempotencyKeys(t *testing.T) {
	var want []KeyVector
	for _, c := range []struct{ principal, id string }{{"alice", execID}, {"bob", execID}, {"alice", "refund-42"},
		{"bob", "refund-42"}, {"_anon", execID}} {
		want = append(want, KeyVector{Principal: c.principal, ExecutionID: c.id,
			Key:   envelope.IdempotencyKeyOf(envelope.IdempotencyKeyVersion, c.principal, c.id),
			KeyV1: envelope.IdempotencyKeyOf(1, c.principal, c.id)})
	}
	b, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "go", "idempotency-keys.json")
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if have := readFile(t, path); !bytes.Equal(have, b) {
		t.Errorf("%s is not what envelope.IdempotencyKeyOf makes today:\nhave %s\nnow  %s", path, have, b)
	}
}

// TestVectors_TypeScript reads the requests the TypeScript client wrote
// (testdata/ts, written by its tests with UPDATE_VECTORS=1) as a worker does,
// compares each with its description and encodes it again to the same bytes.
func TestVectors_TypeScript(t *testing.T) {
	desc := checkVectors(t, filepath.Join("testdata", "ts"))
	if len(desc.Vectors) == 0 {
		t.Fatal("testdata/ts holds no vectors")
	}
}

// checkVectors decodes every vector of dir, compares it with its value,
// encodes it again and compares the bytes with its canonical file; a vector
// to refuse must fail to decode with envelope.ErrDecode.
func checkVectors(t *testing.T, dir string) Description {
	t.Helper()
	var desc Description
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "vectors.json")), &desc); err != nil {
		t.Fatal(err)
	}
	for _, v := range desc.Vectors {
		decode, ok := decoders[v.Kind]
		if !ok {
			t.Errorf("%s: unknown kind %q", v.Name, v.Kind)
			continue
		}
		b := readFile(t, filepath.Join(dir, v.File))
		got, err := decode(b)
		if v.Refused != "" {
			if !errors.Is(err, envelope.ErrDecode) {
				t.Errorf("%s: decoded (err %v), want it refused", v.Name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		again, err := envelope.Marshal(got)
		if err != nil {
			t.Errorf("%s: encode: %v", v.Name, err)
			continue
		}
		if want := readFile(t, filepath.Join(dir, v.Canonical)); !bytes.Equal(again, want) {
			t.Errorf("%s: decoded and encoded again:\n got % x\nwant % x (%s)", v.Name, again, want, v.Canonical)
		}
		j, err := json.Marshal(got)
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		if !sameJSON(t, j, v.Value) {
			t.Errorf("%s: decoded as\n%s\nwant\n%s", v.Name, j, v.Value)
		}
	}
	return desc
}

// sameJSON compares two JSON documents as values, numbers by their text,
// fields whose value is empty (false, 0, "", null, [], {} or the zero time)
// as absent: msgpack records leave them out, and encoding/json writes those
// without omitempty.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	return reflect.DeepEqual(pruned(t, a), pruned(t, b))
}

func pruned(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return prune(v)
}

func prune(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if e = prune(e); !empty(e) {
				out[k] = e
			}
		}
		return out
	case []any:
		for i, e := range x {
			x[i] = prune(e)
		}
	}
	return v
}

func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == "" || x == "0001-01-01T00:00:00Z"
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
