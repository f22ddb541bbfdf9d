package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/mcptasks"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// The Tasks extension (io.modelcontextprotocol/tasks, protocol 2026-07-28):
// a tools/call from a client that declares the extension is answered at once
// with a task whose id is the execution id; tasks/get, tasks/update and
// tasks/cancel read and steer it. A task is nothing but capstan's durable
// state — the execution's record and envelope, the approval — so it survives
// the bridge's restart, and any bridge of a deployment answers for it.

const (
	relatedTaskMeta = "io.modelcontextprotocol/related-task"
	// codeMissingCapability is the protocol's "Missing required client capability".
	codeMissingCapability = -32021
	pollIntervalMs        = 1000
	// maxResumeHops bounds following approvals from one execution to the
	// execution that consumed them.
	maxResumeHops = 4
)

// serverCapabilities are what every actor's server declares: tools whose
// list changes, and the Tasks extension.
func serverCapabilities() *mcp.ServerCapabilities {
	c := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	c.AddExtension(mcptasks.TasksExtension, map[string]any{})
	return c
}

// routeTasks adds the extension's methods to a view's server, and answers a
// declaring client's tools/call with a task.
func (b *Bridge) routeTasks(v *view) {
	v.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ss, _ := req.GetSession().(*mcp.ServerSession)
			switch method {
			case "initialize":
				// A 2025-11-25 client learns of the core tasks here.
				res, err := next(ctx, method, req)
				if ip, ok := req.GetParams().(*mcp.InitializeParams); err == nil && ok && ip.ProtocolVersion == mcptasks.CoreTasksVersion {
					return withCoreTasks(res)
				}
				return res, err
			case "tools/list":
				res, err := next(ctx, method, req)
				if err == nil && coreSession(ss) {
					return withTaskSupport(res)
				}
				return res, err
			}
			cr, ok := req.(*mcp.CallToolRequest)
			if method != "tools/call" || !ok || cr.Params == nil {
				return next(ctx, method, req)
			}
			if _, asked := cr.Params.Meta[coreTaskMeta]; asked && coreSession(ss) {
				// A 2025-11-25 task: answered {"task": ...} at once.
				t, found := v.byName(cr.Params.Name)
				if !found {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "Tool " + cr.Params.Name + " is not called as a task"}
				}
				input, problem := argumentsOf(cr.Params.Arguments, t.wrapped)
				if problem != "" {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: problem}
				}
				return b.coreCreate(ctx, v.actor, t.capID, input)
			}
			t, ok := v.byName(cr.Params.Name)
			if ok && cr.Params.Name != t.def.Name {
				// A capability called by its id: the tool listed for it.
				cr.Params.Name = t.def.Name
			}
			if !ok || !extensionIn(cr.ClientCapabilities()) { // the bridge's own tools, or an unknown name: answered as usual
				return next(ctx, method, req)
			}
			input, problem := argumentsOf(cr.Params.Arguments, t.wrapped)
			if problem != "" {
				return next(ctx, method, req)
			}
			res, err := b.createTask(ctx, v.actor, t.capID, input)
			if err != nil && ctx.Err() == nil {
				b.log.Warn("MCP call not taken: capstan did not answer", "tool", cr.Params.Name, "err", err)
				res, err = unavailable(), nil
			}
			if r, ok := res.(*mcp.CallToolResult); ok {
				// A result in place of the task: the polymorphic result's
				// other shape says so (the SDK marks only the results of
				// its own tool handlers).
				return mcptasks.CompleteResult{CallToolResult: r}, err
			}
			return res, err
		}
	})
	must(mcp.AddReceivingCustomMethod(v.server, "tasks/get", func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.TaskParams) (mcp.Result, error) {
		if core(ss, p) {
			c, _, err := b.coreGet(ctx, v.actor, p.TaskID, true)
			if err != nil {
				return nil, b.protocolError(ctx, "tasks/get", err)
			}
			return c, nil
		}
		if err := checkDeclared(ss, p); err != nil {
			return nil, err
		}
		t, err := b.getTask(ctx, v.actor, p.TaskID, true)
		if err != nil {
			return nil, b.protocolError(ctx, "tasks/get", err)
		}
		t.ResultType = "complete"
		return t, nil
	}))
	// The core tasks' own methods (2025-11-25).
	must(mcp.AddReceivingCustomMethod(v.server, "tasks/result", func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.TaskParams) (*mcp.CallToolResult, error) {
		if !core(ss, p) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks/result is a method of protocol " + mcptasks.CoreTasksVersion}
		}
		res, err := b.coreResult(ctx, v.actor, p.TaskID)
		if err != nil {
			return nil, b.protocolError(ctx, "tasks/result", err)
		}
		return res, nil
	}))
	must(mcp.AddReceivingCustomMethod(v.server, "tasks/list", func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.ListTasksParams) (*mcptasks.ListTasksResult, error) {
		if !coreSession(ss) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks/list is a method of protocol " + mcptasks.CoreTasksVersion}
		}
		cursor := ""
		if p != nil {
			cursor = p.Cursor
		}
		res, err := b.coreList(ctx, v.actor, cursor)
		if err != nil {
			return nil, b.protocolError(ctx, "tasks/list", err)
		}
		return res, nil
	}))
	must(mcp.AddReceivingCustomMethod(v.server, "tasks/update", func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.TaskParams) (*mcptasks.Ack, error) {
		if err := checkDeclared(ss, p); err != nil {
			return nil, err
		}
		if err := b.updateTask(ctx, v.actor, p); err != nil {
			return nil, b.protocolError(ctx, "tasks/update", err)
		}
		return &mcptasks.Ack{ResultType: "complete"}, nil
	}))
	must(mcp.AddReceivingCustomMethod(v.server, "tasks/cancel", func(ctx context.Context, ss *mcp.ServerSession, p *mcptasks.TaskParams) (mcp.Result, error) {
		if core(ss, p) {
			c, err := b.coreCancel(ctx, v.actor, p.TaskID)
			if err != nil {
				return nil, b.protocolError(ctx, "tasks/cancel", err)
			}
			return c, nil
		}
		if err := checkDeclared(ss, p); err != nil {
			return nil, err
		}
		if err := b.cancelTask(ctx, v.actor, p.TaskID); err != nil {
			return nil, b.protocolError(ctx, "tasks/cancel", err)
		}
		return &mcptasks.Ack{ResultType: "complete"}, nil
	}))
}

// protocolError is what a client of a protocol method is told of err: a
// JSON-RPC error of the bridge's own as it is, anything else (NATS
// unreachable, no worker answering) only as capstan being unavailable,
// its cause logged. The error of a request its client ended stays as is.
func (b *Bridge) protocolError(ctx context.Context, method string, err error) error {
	var je *jsonrpc.Error
	if errors.As(err, &je) || ctx.Err() != nil {
		return err
	}
	b.log.Warn("MCP request failed: capstan did not answer", "method", method, "err", err)
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "capstan is unavailable"}
}

func must(err error) {
	if err != nil {
		panic(err) // a method name clashes with the SDK's: a programming error
	}
}

// core reports whether a tasks/* request is one of the core tasks: from a
// 2025-11-25 session that did not declare the extension.
func core(ss *mcp.ServerSession, p *mcptasks.TaskParams) bool {
	if p == nil || !coreSession(ss) {
		return false
	}
	return checkDeclared(ss, p) != nil
}

// extensionIn reports whether capabilities declare the Tasks extension.
func extensionIn(c *mcp.ClientCapabilities) bool {
	if c == nil {
		return false
	}
	_, ok := c.Extensions[mcptasks.TasksExtension]
	return ok
}

// checkDeclared refuses a tasks/* request without params, and one from a
// client that did not declare the extension, on the request or at
// initialization.
func checkDeclared(ss *mcp.ServerSession, p *mcptasks.TaskParams) error {
	if p == nil { // params absent or null: no task to name
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Invalid params: taskId is required"}
	}
	if caps, ok := p.Meta[mcp.MetaKeyClientCapabilities].(map[string]any); ok {
		if ext, ok := caps["extensions"].(map[string]any); ok {
			if _, ok := ext[mcptasks.TasksExtension]; ok {
				return nil
			}
		}
	}
	if ss != nil {
		if ip := ss.InitializeParams(); ip != nil && extensionIn(ip.Capabilities) {
			return nil
		}
	}
	return &jsonrpc.Error{Code: codeMissingCapability, Message: "Missing required client capability",
		Data: []byte(`{"requiredCapabilities":{"extensions":{"` + mcptasks.TasksExtension + `":{}}}}`)}
}

func taskNotFound() error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Failed to retrieve task: Task not found"}
}

// submitTask submits a task's call under a new id, the call tracked until
// answered is called: how both forms of tasks begin.
func (b *Bridge) submitTask(ctx context.Context, actor envelope.Actor, capID string, input envelope.Raw) (id string, answered func(), err error) {
	b.live.start(b) // the task's first reports, before tasks/get asks
	id = executionIDFor(actor)
	answered = trackCall(ctx, b, id)
	sctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	_, err = b.c.Submit(sctx, capID, input, b.assert(actor), executor.WithID(id))
	return id, answered, b.tooLarge(err)
}

// createTask submits the call and answers with its task once the request is
// stored: from then on tasks/get resolves.
func (b *Bridge) createTask(ctx context.Context, actor envelope.Actor, capID string, input envelope.Raw) (mcp.Result, error) {
	id, answered, err := b.submitTask(ctx, actor, capID, input)
	defer answered()
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return resultOf(refused(id, ce)), nil
	}
	if err != nil && explicitlyCancelled(ctx) && b.ctx.Err() == nil {
		b.cancelExecution(id) // the request may have been stored
		return nil, ctx.Err()
	}
	if err != nil {
		b.log.Warn("MCP call not submitted", "executionId", id, "err", err)
		return unconfirmed(id), nil
	}
	now := time.Now().UTC()
	t := b.task(id, now, now)
	t.ResultType = "task"
	t.Status, t.StatusMessage = mcptasks.TaskWorking, "queued"
	if b.cfg.TaskAfter < 0 {
		return t, nil
	}
	actx, cancel := context.WithTimeout(ctx, b.cfg.TaskAfter)
	env, err := b.c.Await(actx, id)
	cancel()
	switch {
	case err != nil && explicitlyCancelled(ctx) && b.ctx.Err() == nil:
		// Cancelled before it learnt its task: nobody could cancel it later.
		b.cancelExecution(id)
		return nil, ctx.Err()
	case err != nil:
		return t, nil // still running: the task it is
	case env.Status == envelope.StatusApprovalRequired && env.Approval != nil:
		t.Status, t.StatusMessage = mcptasks.TaskInputRequired, "waiting for approval "+env.Approval.ID
		t.LastUpdatedAt = env.FinalizedAt.Format(time.RFC3339Nano)
		return t, nil
	default:
		return resultOf(env), nil
	}
}

func (b *Bridge) task(id string, created, updated time.Time) *mcptasks.Task {
	// A task's result is its envelope: kept as long as the envelopes
	// bucket keeps it, which the client read when it opened.
	ttl := b.c.EnvelopeRetention()
	ms := ttl.Milliseconds()
	return &mcptasks.Task{
		ResultBase: mcp.ResultBase{Meta: mcp.Meta{relatedTaskMeta: map[string]any{"taskId": id}}},
		TaskID:     id, CreatedAt: created.Format(time.RFC3339Nano), LastUpdatedAt: updated.Format(time.RFC3339Nano),
		TTLMs: &ms, PollIntervalMs: pollIntervalMs,
	}
}

// getTask reads the task's state from the execution, following an approval
// to the execution that consumed it. An approved approval nobody resumed yet
// is resumed here when resume is set, under an id derived from the approval,
// so that however many bridges poll, one execution runs (and the approval
// authorizes one). tasks/cancel reads without resume: a cancel never starts
// the call it cancels.
func (b *Bridge) getTask(ctx context.Context, actor envelope.Actor, taskID string, resume bool) (*mcptasks.Task, error) {
	if envelope.ValidExecutionID(taskID) != nil || !b.owns(ctx, actor, taskID) {
		return nil, taskNotFound()
	}
	b.live.start(b)
	id := taskID
	created := time.Time{}
	for hop := 0; ; hop++ {
		st, err := b.c.Status(execrpc.TakeAbsenceAsQueued(ctx), id)
		switch {
		case errors.Is(err, executor.ErrNoSuchExecution):
			// Stored, not yet claimed by a worker.
			t := b.task(taskID, createdOf(taskID, created), time.Now().UTC())
			t.Status, t.StatusMessage = mcptasks.TaskWorking, "queued"
			return t, nil
		case err != nil:
			return nil, err
		}
		if created.IsZero() && st.Record != nil {
			created = st.Record.CreatedAt
		}
		env := st.Envelope
		if env == nil {
			t := b.task(taskID, createdOf(taskID, created), updatedAt(st))
			t.Status, t.StatusMessage = mcptasks.TaskWorking, b.runningText(id, st.Record)
			return t, nil
		}
		t := b.task(taskID, createdOf(taskID, created), env.FinalizedAt)
		switch env.Status {
		case envelope.StatusCompleted, envelope.StatusFailed:
			t.Status, t.Result = mcptasks.TaskCompleted, resultOf(env)
			t.StatusMessage = string(env.Status)
			return t, nil
		case envelope.StatusCancelled:
			t.Status, t.Result = mcptasks.TaskCancelled, resultOf(env)
			if me := env.ForModel(); me != nil {
				t.StatusMessage = me.Message
			}
			return t, nil
		}
		// approval-required
		if env.Approval == nil || hop >= maxResumeHops {
			t.Status, t.Result = mcptasks.TaskCompleted, resultOf(env)
			return t, nil
		}
		rec, err := b.approval(ctx, env.Approval.ID)
		if err != nil {
			return nil, err
		}
		switch rec.StatusAt(time.Now()) {
		case approvals.StatusPending:
			t.Status = mcptasks.TaskInputRequired
			t.StatusMessage = "waiting for approval " + rec.ID
			t.InputRequests = approvalInputRequest(rec)
			t.LastUpdatedAt = rec.RequestedAt.Format(time.RFC3339Nano)
			return t, nil
		case approvals.StatusApproved:
			if !resume {
				t.Status, t.StatusMessage = mcptasks.TaskWorking, "approved by "+decider(rec)+"; not resumed yet"
				return t, nil
			}
			rid := rec.ID + "-resume"
			sctx, cancel := context.WithTimeout(ctx, submitTimeout)
			_, err := b.c.SubmitResume(sctx, rec.ID, executor.WithID(rid))
			cancel()
			if err != nil {
				return nil, err
			}
			t.Status, t.StatusMessage = mcptasks.TaskWorking, "approved by "+decider(rec)+"; running"
			return t, nil
		case approvals.StatusConsumed:
			id = rec.ConsumedBy
			continue
		case approvals.StatusCancelled:
			t.Status, t.StatusMessage = mcptasks.TaskCancelled, "the approval request was withdrawn; nothing ran"
			return t, nil
		default:
			code := envelope.CodeApprovalRejected
			if rec.StatusAt(time.Now()) == approvals.StatusExpired {
				code = envelope.CodeApprovalExpired
			}
			t.Status = mcptasks.TaskCompleted
			t.Result = refusal(code, "The approval was "+string(rec.StatusAt(time.Now()))+"; nothing ran.")
			return t, nil
		}
	}
}

// createdOf is when task id was created: when its id was made, which every
// answer about it reads alike, whatever it holds of the task (its request
// waiting in its queue, a record made at a later delivery, a listing's
// entry without the request's time); else t, else now.
func createdOf(id string, t time.Time) time.Time {
	if tagged(id) {
		id = id[:uuidLen] // the UUIDv7 the actor's tag follows
	}
	if made, ok := envelope.ExecutionIDTime(id); ok {
		return made.UTC()
	}
	if !t.IsZero() {
		return t
	}
	return time.Now().UTC()
}

func updatedAt(st *executor.ExecutionStatus) time.Time {
	if st.Record != nil {
		return st.Record.UpdatedAt
	}
	return time.Now().UTC()
}

// runningText is the status message of a task whose execution runs: its
// state as its record tells it and, once its handler reported progress,
// the latest report (from the progress subjects, or the record's).
func (b *Bridge) runningText(id string, r *execution.Record) string {
	text := stateText(r)
	if r == nil || r.State != execution.StateRunning {
		return text
	}
	if p := b.live.of(id, r.Attempt, r.Progress); p != nil {
		text += ": " + reportText(p)
	}
	return text
}

// stateText is the progress of an execution as its record tells it.
func stateText(r *execution.Record) string {
	if r == nil {
		return "queued"
	}
	switch r.State {
	case execution.StateRunning:
		return fmt.Sprintf("started, attempt %d", r.Attempt)
	case execution.StateBackoff:
		return fmt.Sprintf("retrying: attempt %d after %s", r.Attempt+1, r.LastError)
	}
	return string(r.State)
}

// approvalKey is the inputRequests key of an approval: one per approval, so
// never reused within a task.
func approvalKey(id string) string { return "approval-" + id }

// approvalInputRequest tells the client what the task waits for, as a form
// elicitation with nothing to fill in: someone else decides the approval;
// the requester may only withdraw the call (decline or cancel).
func approvalInputRequest(rec *approvals.Record) map[string]any {
	msg := fmt.Sprintf("%s waits for approval %s (%s)", rec.CapabilityID, rec.ID, typesText(rec.Types))
	if len(rec.Reasons) > 0 {
		msg += ": " + rec.Reasons[0]
	}
	msg += ". Someone else must approve it; the task then runs by itself. Decline to withdraw the call."
	return map[string]any{approvalKey(rec.ID): map[string]any{
		"method": "elicitation/create",
		"params": map[string]any{"mode": "form", "message": msg,
			"requestedSchema": map[string]any{"type": "object", "properties": map[string]any{}}},
	}}
}

// updateTask takes the answer to an approval's input request: decline or
// cancel withdraws the approval request; accept changes nothing.
func (b *Bridge) updateTask(ctx context.Context, actor envelope.Actor, p *mcptasks.TaskParams) error {
	if envelope.ValidExecutionID(p.TaskID) != nil || !b.owns(ctx, actor, p.TaskID) {
		return taskNotFound()
	}
	for key, resp := range p.InputResponses {
		r, _ := resp.(map[string]any)
		action, _ := r["action"].(string)
		if action != "decline" && action != "cancel" {
			continue
		}
		id, ok := approvalOf(key)
		if !ok {
			continue // not a key this task issued
		}
		if err := b.withdraw(ctx, actor, id); err != nil {
			return err
		}
	}
	return nil
}

func approvalOf(key string) (string, bool) {
	const prefix = "approval-"
	if len(key) <= len(prefix) || key[:len(prefix)] != prefix {
		return "", false
	}
	return key[len(prefix):], true
}

// withdraw cancels the actor's own pending approval request.
func (b *Bridge) withdraw(ctx context.Context, actor envelope.Actor, approvalID string) error {
	rec, err := b.approval(ctx, approvalID)
	if err != nil || rec.Actor.Kind != actor.Kind || rec.Actor.ID != actor.ID {
		return nil // unknown or another's: ignored, as the extension asks
	}
	_, err = b.c.WithdrawApproval(ctx, approvalID, actor, "withdrawn by the requester over MCP")
	switch {
	case errors.Is(err, approvals.ErrNoBucket):
		// A principal writes no approval: the request stays until an
		// approver rejects it or it expires.
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
			Message: "The bridge cannot withdraw approval " + approvalID + " under its credentials; it expires unless someone approves or rejects it."}
	case err != nil && !errors.Is(err, approvals.ErrAlreadyDecided):
		return err
	}
	return nil
}

// cancelTask cancels the execution the task is at: a pending approval is
// withdrawn, a running execution cancelled. Cancelling is cooperative: a
// task that already ended keeps its outcome.
func (b *Bridge) cancelTask(ctx context.Context, actor envelope.Actor, taskID string) error {
	if envelope.ValidExecutionID(taskID) != nil || !b.owns(ctx, actor, taskID) {
		return taskNotFound()
	}
	id := taskID
	for hop := 0; hop < maxResumeHops; hop++ {
		st, err := b.c.Status(execrpc.TakeAbsenceAsQueued(ctx), id)
		if err != nil || st.Envelope == nil {
			// Queued or running (or not yet visible): cancel the execution.
			if _, err := b.c.Cancel(ctx, id); err != nil && !errors.Is(err, executor.ErrNoWorkers) {
				b.log.Warn("tasks/cancel failed", "executionId", id, "err", err)
			}
			return nil
		}
		if st.Envelope.Status != envelope.StatusApprovalRequired || st.Envelope.Approval == nil {
			return nil // ended
		}
		rec, err := b.approval(ctx, st.Envelope.Approval.ID)
		if err != nil {
			return err
		}
		if rec.Status == approvals.StatusConsumed {
			id = rec.ConsumedBy
			continue
		}
		if err := b.withdraw(ctx, actor, rec.ID); !errors.Is(err, approvals.ErrConsumed) {
			return err
		}
		// Resumed meanwhile: cancel the execution that consumed it.
	}
	return nil
}
