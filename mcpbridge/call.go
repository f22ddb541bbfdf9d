package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/mcptasks"
)

// submitTimeout bounds publishing one request.
const submitTimeout = 10 * time.Second

// callTool runs one tools/call of a capability as a capstan execution for
// the view's actor.
func (b *Bridge) callTool(ctx context.Context, v *view, capID string, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	t, ok := v.lookup(capID)
	if !ok { // removed between the dispatch and now: the same answer as any unknown tool
		return refusal(envelope.CodeCapabilityNotFound, "No such capability."), nil
	}
	input, problem := argumentsOf(req.Params.Arguments, t.wrapped)
	if problem != "" {
		return refusal(envelope.CodeInputInvalid, problem), nil
	}
	// The same call again after its approval was granted runs the approved
	// call instead of asking for another approval.
	key := pendingKey(v.actor, capID, input)
	if approvalID, ok := b.pending.lookup(key); ok {
		return b.resumeApproval(ctx, v.actor, approvalID, newProgress(req), true)
	}
	return b.run(ctx, v.actor, newProgress(req), key, func(ctx context.Context, id string) error {
		if _, err := b.c.Submit(ctx, capID, input, b.assert(v.actor), executor.WithID(id)); err != nil {
			return err
		}
		// Stored; no live worker serves it: the caller hears so at once
		// (the catalog says it, at no cost for a served capability).
		var u *executor.UnservedError
		if errors.As(b.c.Serving(ctx, capID), &u) {
			u.ExecutionID, u.Queued = id, true
			return u
		}
		return nil
	})
}

// assert is the one place the bridge names the actor of a request: the
// caller authenticated by the transport (a bearer token, or --actor over
// stdio). Under capstan's trust boundary the bridge's NATS principal is a
// delegating producer whose grants say which actors it may assert.
func (b *Bridge) assert(actor envelope.Actor) executor.CallOption { return executor.As(actor) }

// argumentsOf turns tools/call arguments into the capability's input, or
// says to the model why it cannot.
func argumentsOf(args json.RawMessage, wrapped bool) (envelope.Raw, string) {
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	if wrapped {
		var w struct {
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(args, &w); err != nil || len(w.Input) == 0 {
			return nil, "The arguments must be an object with the property \"input\"."
		}
		args = w.Input
	}
	raw, err := envelope.RawFromJSON(args)
	if err != nil {
		return nil, "The arguments are not valid JSON."
	}
	return raw, ""
}

// run submits one execution under a new id and answers with its envelope,
// sending progress notifications from its audit trail while it runs. A
// client's notifications/cancelled cancels the execution; a lost connection
// does not (the envelope stays readable with capstan.status).
//
// key, when set, names the call for the pending approvals: the same call
// made again after its approval runs the approved one. p carries the
// request's progress token (its values only grow, across a resume too).
func (b *Bridge) run(ctx context.Context, actor envelope.Actor, p *progress, key string, submit func(context.Context, string) error) (*mcp.CallToolResult, error) {
	id := executionIDFor(actor)
	answered := trackCall(ctx, b, id)
	defer answered()
	stopFollowing := p.follow(ctx, b, id)
	defer stopFollowing()

	sctx, cancel := context.WithTimeout(ctx, submitTimeout)
	err := b.tooLarge(submit(sctx, id))
	cancel()
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return resultOf(refused(id, ce)), nil
	}
	var u *executor.UnservedError
	if errors.As(err, &u) {
		b.log.Warn("MCP call of a capability no live worker serves", "executionId", id, "err", err)
		return unserved(u), nil
	}
	if err != nil && explicitlyCancelled(ctx) && b.ctx.Err() == nil {
		// Cancelled while the request was being stored: it may have been.
		// A cancel recorded first ends it as soon as a worker sees it.
		b.cancelExecution(id)
		return nil, ctx.Err()
	}
	if err != nil {
		b.log.Warn("MCP call not submitted", "executionId", id, "err", err)
		return unconfirmed(id), nil
	}

	actx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	env, err := b.c.Await(actx, id)
	cancel()
	switch {
	case err == nil:
	case explicitlyCancelled(ctx) && b.ctx.Err() == nil:
		b.cancelExecution(id)
		return nil, ctx.Err()
	case ctx.Err() != nil:
		// The connection or the bridge ended: the execution goes on.
		return nil, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return stillRunning(id, b.cfg.CallTimeout), nil
	default:
		b.log.Warn("MCP call: awaiting its envelope failed", "executionId", id, "err", err)
		return unconfirmed(id), nil
	}
	if env.Status == envelope.StatusApprovalRequired && env.Approval != nil {
		if key != "" {
			b.pending.remember(key, env.Approval.ID)
		}
		if b.cfg.ApprovalWait > 0 {
			stopFollowing() // the resumed execution has a trail of its own
			if approved := b.awaitDecision(ctx, p, env.Approval.ID); approved {
				return b.resumeApproval(ctx, actor, env.Approval.ID, p, false)
			}
		}
	}
	return resultOf(env), nil
}

// tooLarge turns the refusal of a request larger than the server takes in
// one message into INPUT_INVALID with the limit: such a request was never
// sent, so nothing can run, and the model must not be told that it may run
// (unconfirmed) and sent to read an execution that stays queued forever.
// Any other error is returned as it is.
func (b *Bridge) tooLarge(err error) error {
	if !errors.Is(err, nats.ErrMaxPayload) {
		return err
	}
	return &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
		Message: fmt.Sprintf("The input is too large: capstan takes requests of at most %d bytes. Nothing ran.", b.nc.MaxPayload())}
}

// explicitlyCancelled tells a client's notifications/cancelled (the request's
// context cancelled without a cause) from a lost connection (cancelled with
// the read error as its cause). Over stateless HTTP the request is the whole
// exchange: its end, however it comes, is the client giving up.
func explicitlyCancelled(ctx context.Context) bool {
	if !errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	return context.Cause(ctx) == context.Canceled || ctx.Value(closeCancelsKey{}) != nil
}

func (b *Bridge) cancelExecution(id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), 10*time.Second)
	defer cancel()
	if _, err := b.c.Cancel(ctx, id); err != nil {
		b.log.Warn("cancel after notifications/cancelled failed", "executionId", id, "err", err)
		return
	}
	b.log.Info("execution cancelled by its MCP client", "executionId", id)
}

// refused is the envelope of a call refused before it was published.
func refused(id string, ce *envelope.CapabilityError) *envelope.Envelope {
	return &envelope.Envelope{V: envelope.Version, ExecutionID: id, Status: envelope.StatusFailed, Error: ce.Wire()}
}

// resultOf renders an envelope for the model: the output of a completed
// execution as structured content and JSON text (and, when it was recovered
// from a lost attempt, what Recovered.ForModel says of it); only ForModel() of a failed
// or cancelled one; what is pending, why, and what to do next for one that
// needs an approval.
func resultOf(env *envelope.Envelope) *mcp.CallToolResult {
	meta := mcp.Meta{metaKey + "executionId": env.ExecutionID, metaKey + "status": string(env.Status)}
	switch env.Status {
	case envelope.StatusCompleted:
		text, structured := outputOf(env.Output)
		content := []mcp.Content{&mcp.TextContent{Text: text}}
		if r := env.Recovered; r != nil {
			// The outcome was recovered from a lost attempt (DESIGN §5): the
			// model is told so, lest it call again to make sure.
			meta[metaKey+"recovered"] = r.How
			content = append(content, &mcp.TextContent{Text: r.ForModel()})
		}
		return &mcp.CallToolResult{Meta: meta, Content: content, StructuredContent: structured}
	case envelope.StatusApprovalRequired:
		return approvalResult(env, meta)
	default:
		me := env.ForModel()
		if me == nil {
			me = &envelope.ModelError{Code: envelope.CodeInternalError, Message: "The operation failed."}
		}
		return &mcp.CallToolResult{Meta: meta, IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: errorText(me)}},
			StructuredContent: me}
	}
}

// outputOf returns the output as JSON text, and as structured content: the
// output itself when it is an object, else {"result": output}.
func outputOf(out envelope.Raw) (string, any) {
	if len(out) == 0 {
		return "null", map[string]any{"result": nil}
	}
	j, err := json.Marshal(out)
	if err != nil {
		return "The output could not be rendered as JSON.", nil
	}
	var v any
	if json.Unmarshal(j, &v) != nil {
		return string(j), nil
	}
	if obj, ok := v.(map[string]any); ok {
		return string(j), obj
	}
	return string(j), map[string]any{"result": v}
}

func errorText(me *envelope.ModelError) string {
	s := fmt.Sprintf("%s: %s", me.Code, me.Message)
	if me.Retryable {
		s += " (retryable)"
	}
	if len(me.Details) > 0 {
		if d, err := json.Marshal(me.Details); err == nil {
			s += "\n" + string(d)
		}
	}
	return s
}

func approvalResult(env *envelope.Envelope, meta mcp.Meta) *mcp.CallToolResult {
	a := env.Approval
	if a == nil {
		a = &envelope.ApprovalRef{}
	}
	next := fmt.Sprintf("Nothing ran. Ask a person allowed to approve (%s) to approve %s, for example with "+
		"'capstan approvals approve %s'; then make the same call again, or call %s with this approvalId. "+
		"You cannot approve it yourself.", typesText(a.Types), a.ID, a.ID, ResumeTool)
	ar := mcptasks.ApprovalRequired{Status: string(envelope.StatusApprovalRequired), ExecutionID: env.ExecutionID,
		CapabilityID: env.CapabilityID, ApprovalID: a.ID, Reasons: a.Reasons, Types: a.Types, ExpiresAt: a.ExpiresAt, Next: next}
	text := fmt.Sprintf("Approval required before %s runs (approval %s, expires %s).", env.CapabilityID, a.ID,
		a.ExpiresAt.Format(time.RFC3339))
	if len(a.Reasons) > 0 {
		text += " Why: " + strings.Join(a.Reasons, "; ") + "."
	}
	text += " " + next
	return &mcp.CallToolResult{Meta: meta, Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: ar}
}

func typesText(types []string) string {
	if len(types) == 0 {
		return "any approver"
	}
	return "approval types " + strings.Join(types, ", ")
}

// answer is what a tool call tells the model of err: capstan's failures
// (NATS unreachable, no worker answering) only as capstan being
// unavailable, in the shape of any refusal, their cause logged. The error
// of a request its client ended stays as is: nobody reads its answer.
func (b *Bridge) answer(ctx context.Context, tool string, res *mcp.CallToolResult, err error) (*mcp.CallToolResult, error) {
	if err == nil || ctx.Err() != nil {
		return res, err
	}
	b.log.Warn("MCP tool call failed: capstan did not answer", "tool", tool, "err", err)
	return unavailable(), nil
}

// unavailable is the result of a call capstan could not answer.
func unavailable() *mcp.CallToolResult {
	me := &envelope.ModelError{Code: envelope.CodeInternalError, Message: "capstan is unavailable; try again later.", Retryable: true}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: errorText(me)}}, StructuredContent: me}
}

// unconfirmed is the result of a call capstan may have taken without
// saying so (the request may be stored): not retryable, since calling again
// could run it twice; the model learns the execution id to read instead.
func unconfirmed(id string) *mcp.CallToolResult {
	me := &envelope.ModelError{Code: envelope.CodeInternalError,
		Message: "capstan is unavailable and did not confirm this call; it may run as execution " + id +
			". Call " + StatusTool + " with this executionId later to learn whether it ran, before calling again."}
	return &mcp.CallToolResult{Meta: mcp.Meta{metaKey + "executionId": id, metaKey + "status": "unknown"}, IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: errorText(me)}}, StructuredContent: me}
}

// refusal is the result of a call refused by the bridge itself.
func refusal(code envelope.Code, msg string) *mcp.CallToolResult {
	return modelError(&envelope.ModelError{Code: code, Message: msg})
}

func modelError(me *envelope.ModelError) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: errorText(me)}}, StructuredContent: me}
}

// quotaRefusal is the tool result of a request the workers refused because
// the bridge's principal is over a quota (QUOTA_EXCEEDED, with the quota, its
// limit and retryAfterMs, for the model to wait on), or nil for any other
// error.
func quotaRefusal(err error) *mcp.CallToolResult {
	var cerr *envelope.CapabilityError
	if !errors.Is(err, envelope.ErrQuotaExceeded) || !errors.As(err, &cerr) {
		return nil
	}
	return modelError(cerr.ForModel())
}

// unserved answers a call no live worker serves: queued (it runs once a
// worker starts, before its start deadline) or not submitted, and what the
// operator is to start.
func unserved(u *executor.UnservedError) *mcp.CallToolResult {
	if !u.Queued {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "No worker is serving this tool now; nothing ran. " + u.Error()}},
			StructuredContent: &envelope.ModelError{Code: envelope.CodeNotStarted, Message: "No worker is serving this tool now; nothing ran.", Retryable: true}}
	}
	next := fmt.Sprintf("It runs once a worker starts. Call %s with this executionId later to read its result; do not call the tool again meanwhile.", StatusTool)
	return &mcp.CallToolResult{
		Meta: mcp.Meta{metaKey + "executionId": u.ExecutionID, metaKey + "status": "queued"},
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("No worker is serving this tool now: the call is queued as execution %s. %s (%v)",
			u.ExecutionID, next, u)}},
		StructuredContent: mcptasks.StillRunning{Status: "queued", ExecutionID: u.ExecutionID, Next: next},
	}
}

func stillRunning(id string, waited time.Duration) *mcp.CallToolResult {
	next := fmt.Sprintf("Call %s with this executionId later to read its result.", StatusTool)
	return &mcp.CallToolResult{
		Meta:              mcp.Meta{metaKey + "executionId": id, metaKey + "status": "running"},
		Content:           []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("Still running after %v (execution %s). %s", waited, id, next)}},
		StructuredContent: mcptasks.StillRunning{Status: "running", ExecutionID: id, Next: next},
	}
}
