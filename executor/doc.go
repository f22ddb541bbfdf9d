// Package executor runs capabilities — the tools an AI agent calls — from NATS
// JetStream, and keeps capstan's promises across processes, machines and
// crashes: a write is never retried unless it declared itself idempotent, a
// redelivery or a lost worker never causes a second attempt of non-idempotent
// work, and every execution ends in exactly one result envelope.
//
// A capability is its metadata, an input type, an output type and a handler:
//
//	type GreetIn struct {
//		Name string `json:"name"`
//	}
//
//	greet := executor.Define("demo.greet", executor.Meta{
//		Description: "Greets someone by name.",
//		Expose:      executor.On(executor.SurfaceDirect),
//		SideEffect:  executor.SideEffectNone,
//	}, func(ctx context.Context, call executor.Call[GreetIn]) (string, error) {
//		return "Hello, " + call.Input.Name + "!", nil
//	})
//
// A registry checks every capability at once; a worker serves them as one
// pool; a client submits calls and awaits their envelopes:
//
//	reg, err := executor.NewRegistry(greet)      // all metadata problems, at once
//	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "default"})
//	go w.Run(ctx)                                 // returns after a graceful drain
//	<-w.Ready()                                   // listed and served: call at once
//
//	c, err := executor.NewClient(nc, executor.ClientConfig{})
//	env, err := c.Call(ctx, "demo.greet", GreetIn{Name: "Ada"}, executor.As(actor))
//	// err: transport trouble only. Governed outcomes are in env.Status:
//	// completed, failed, cancelled or approval-required.
//
// Before the handler runs, the worker governs the call: the capability must be
// exposed on the client's surface (an unknown, unexposed or hidden capability
// answers the same CAPABILITY_NOT_FOUND), the input is decoded strictly into
// In, every issue reported with its path, then checked by In's Validate method
// if it has one; the actor must be well-formed; policies (Meta.Policies,
// WorkerConfig.Policies) are all evaluated and fail closed. What a model may
// see of a failure is env.ForModel(). Client.Describe lists what a surface and
// actor may see, with a JSON Schema of each input.
//
// The handler's context carries the attempt's timeout (Meta.Timeout, default
// 30 s) and the caller's cancellation (Client.Cancel, WithDeadline). The
// runtime retries a failure only when all hold: Meta.Retry allows another
// attempt, the error is retryable (Retryable, or a timeout), and the
// capability's side effect is none or read, or it is declared Idempotent and
// its handler deduplicates with Call.IdempotencyKey. A last attempt that times
// out ends the envelope cancelled with code TIMEOUT; a cancel ends it cancelled
// with CANCELLED, never retried. A call that needs approval (Meta.Approval, or
// a policy answering StanceRequireApproval) ends approval-required; once someone
// else approves it (Client.Decide, or capstan approve), Client.Resume runs it
// once. Client.Status reads where an execution is, Client.Trail its audit
// trail. Each of these has a runnable example.
//
// Under the hood a request is a message on
// capstan.exec.<principal>.<capabilityId>, in its principal's queue; the
// worker claims it by creating the execution's record in a key-value bucket,
// moves the record through claimed, running{n}, backoff{n} and finalized with
// compare-and-swap, renews its lease while the handler runs, and creates the
// envelope (create-only) before it acknowledges the message. That machinery
// is internal (executor/internal/engine for a worker, executor/internal/await
// for a client); this package holds the API and the stages a capability's definition decides
// (stages.go, approval_gate.go).
package executor
