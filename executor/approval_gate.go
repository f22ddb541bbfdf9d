package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/observe"
)

// approvalGate is stage 8. It returns the execution's end and stop when the
// execution does not go on: a resume goes on once it consumed its approval;
// a call that needs an approval ends here, the engine asked to store a
// pending approval and end it approval-required.
// admit calls it only when an approval is asked for or carried.
func (a *admission) approvalGate(v verdict) (end engine.Admission, stop bool) {
	if a.req.ApprovalID != "" {
		// A resume is admitted under its execution's claim (it never takes
		// the short path): consuming the approval is this execution's.
		defer a.stage(observe.StageApproval)(nil)
		return a.useApproval()
	}
	return a.requestApproval(v), true
}

func (w *Worker) approvalStore() *approvals.Store {
	return approvals.NewStore(w.b.Approvals, w.audit).OnSkipped(w.skipped(w.b.Names.ApprovalsBucket()))
}

// requestApproval is the decision of a call that needs an approval: the
// approval record it asks the engine to have stored, under the id the
// engine reserves on the execution's record (so that a takeover of this
// execution finds the same approval instead of asking twice).
func (a *admission) requestApproval(v verdict) engine.Admission {
	m := a.b.meta
	unserializable := func(err error) engine.Admission {
		return a.deny("approval-unserializable-input", &envelope.CapabilityError{Code: envelope.CodeApprovalUnserializableInput,
			Stage: envelope.StageApproval, ExposeToModel: true, Cause: err,
			Message: "The input cannot be serialized canonically, so it cannot be approved."}, v.records)
	}
	input, hash, err := canonicalInput(a.input)
	if err != nil {
		return unserializable(err)
	}
	var display []byte
	if m.RedactApprovalInput != nil {
		shown, err := m.approvalDisplay(a.input)
		if err != nil {
			return a.fail(&envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageApproval,
				Message: "The operation failed.", Cause: err})
		}
		if display, _, err = canonicalInput(shown); err != nil {
			return unserializable(err)
		}
	}
	ttl := approvals.DefaultTTL
	reasons := v.reasons
	if ap := m.Approval; ap != nil {
		if ap.TTL > 0 {
			ttl = ap.TTL
		}
		if ap.Required {
			reason := ap.Reason
			if reason == "" {
				reason = "this capability requires an approval"
			}
			reasons = append(append([]string(nil), reasons...), reason)
		}
	}
	w, store, req, principal := a.w, a.w.approvalStore(), a.req, a.r.Principal
	return engine.Admission{Events: a.events, Approval: &engine.ApprovalNeeded{
		Store: func(ctx context.Context, id string) (*envelope.ApprovalRef, map[string]any, *envelope.CapabilityError) {
			rec, err := store.Get(ctx, id)
			if err != nil || rec.RequestedBy != req.ExecutionID {
				// One more pending approval of the principal's: within
				// its quota, or refused without being created.
				release, refusal := w.reservePending(principal)
				if refusal != nil {
					return nil, nil, refusal
				}
				defer release()
				now := time.Now().UTC()
				rec = &approvals.Record{
					ID: id, CapabilityID: req.CapabilityID, Surface: req.Surface, Actor: req.Actor,
					Input: input, InputHash: hash, Display: display, Reasons: reasons, Types: v.approvalTypes,
					Risk: string(m.Risk), SideEffect: string(m.SideEffect), RequestedAt: now, ExpiresAt: now.Add(ttl),
					RequestedBy: req.ExecutionID, CorrelationID: req.CorrelationID, Principal: principal,
				}
				if err := store.Create(ctx, rec); err != nil {
					return nil, nil, &envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageApproval,
						Retryable: true, ExposeToModel: true, Cause: err,
						Message: "The approval request could not be stored; try again."}
				}
				if w.approvalIndex != nil {
					w.approvalIndex.Noted(rec)
				}
			}
			ref := &envelope.ApprovalRef{ID: rec.ID, Reasons: rec.Reasons, Types: rec.Types, ExpiresAt: rec.ExpiresAt}
			data := map[string]any{"approvalId": rec.ID, "expiresAt": rec.ExpiresAt.Format(time.RFC3339Nano)}
			if len(rec.Reasons) > 0 {
				data["reasons"] = rec.Reasons
			}
			if len(rec.Types) > 0 {
				data["types"] = rec.Types
			}
			if len(v.records) > 0 {
				data["policyDecisions"] = v.records
			}
			return ref, data, nil
		},
	}}
}

// useApproval runs stage 8 of a resume: the approval must be this call's
// (capability, actor, surface, validated input), approved and unexpired; its
// stored input must still hash to what was approved and decode into the
// current input type; then one CAS consumes it for this execution. It
// returns the execution's end and stop when the resume is refused.
func (a *admission) useApproval() (end engine.Admission, stop bool) {
	store := a.w.approvalStore()
	ctx, cancel := engine.StoreContext()
	defer cancel()
	id := a.req.ApprovalID
	refuse := func(reason string, code envelope.Code, msg string, cause error) (engine.Admission, bool) {
		return a.deny(reason, &envelope.CapabilityError{Code: code, Stage: envelope.StageApproval, ExposeToModel: true,
			Message: msg, Cause: cause}, nil), true
	}
	rec, err := store.Get(ctx, id)
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return refuse("approval-not-found", envelope.CodeForbidden, "No such approval.", err)
	case err != nil:
		return a.approvalStoreFailed(err), true
	case ownerOf(rec) != a.r.Principal:
		// Only the principal that asked for it may use it; to others it does
		// not exist — on the envelope, the trail and the record they may
		// read, word for word. The worker's log says whose it is.
		a.w.log.Warn("a resume names another principal's approval: refused as no such approval", "executionId",
			a.req.ExecutionID, "principal", a.r.Principal, "approvalId", id, "requestedBy", ownerOf(rec))
		return refuse("approval-not-found", envelope.CodeForbidden, "No such approval.", approvalsrpc.NotFound(id))
	case rec.CapabilityID != a.req.CapabilityID:
		return refuse("approval-other-capability", envelope.CodeForbidden, "The approval is for another capability.", nil)
	case rec.Actor.Kind != a.req.Actor.Kind || rec.Actor.ID != a.req.Actor.ID:
		return refuse("approval-other-actor", envelope.CodeForbidden, "A resume runs as the actor who asked for the approval.", nil)
	case rec.Surface != "" && rec.Surface != a.req.Surface:
		return refuse("approval-other-surface", envelope.CodeForbidden, "A resume runs on the surface the approval was asked from.", nil)
	}
	if err := rec.Usable(a.req.ExecutionID, a.r.RecordCreated, time.Now().UTC()); err != nil {
		if used := a.usedBefore(rec); used != nil {
			return refuse("approval-used-before", envelope.CodeApprovalConsumed, usedBeforeMessage, used)
		}
		// A governed outcome, not a fault: nothing for the logs.
		return refuse(unusableReason(err), approvals.Code(err), unusableMessage(err), nil)
	}
	if err := rec.CheckInput(); err != nil {
		return refuse("approval-input-mismatch", envelope.CodeApprovalInputMismatch, "The stored input is not the approved input.", err)
	}
	if _, h, err := canonicalInput(a.input); err != nil || h != rec.InputHash {
		return refuse("approval-input-mismatch", envelope.CodeApprovalInputMismatch, "The input is not the approved input.", nil)
	}
	// Re-validation: the approved input must still fit the capability's
	// current input type, or nothing runs and the approval stays unused.
	raw, _ := rec.Raw()
	in, err := a.b.decode(raw)
	if err != nil {
		if cerr := inputInvalid(err); cerr.Code != envelope.CodeInputInvalid {
			return a.fail(cerr), true // the capability's bug, not a refusal
		}
		return a.deny("approval-input-invalid", inputInvalid(err), nil), true
	}
	wasApproved := rec.Status == approvals.StatusApproved
	rec, err = store.Consume(ctx, id, a.req.ExecutionID, a.r.RecordCreated)
	if err != nil {
		if used := a.usedBefore(rec); used != nil {
			return refuse("approval-used-before", envelope.CodeApprovalConsumed, usedBeforeMessage, used)
		}
		if code := approvals.Code(err); code != "" {
			var cause error
			if code == envelope.CodeApprovalInputMismatch {
				cause = err // changed in the bucket: worth a look
			}
			return refuse(unusableReason(err), code, unusableMessage(err), cause)
		}
		return a.approvalStoreFailed(err), true
	}
	a.input = in
	a.grant = grantOf(rec)
	if wasApproved {
		a.file(audit.EventApprovalConsumed, map[string]any{"approvalId": rec.ID, "requestedBy": rec.RequestedBy,
			"approver": rec.Decision.Approver.String()})
	}
	return engine.Admission{}, false
}

// usedBeforeMessage is what the model is told of a request that names an
// approval its own execution id consumed under an earlier record: the
// request was sent again after that run's record and envelope expired.
const usedBeforeMessage = "The approval was already used by an earlier run of this execution, which may have " +
	"taken effect; an approval authorizes one run. A new call needs a new approval."

// usedBefore is why rec, consumed by this very execution id, does not
// authorize this delivery (nil when it does, or was not consumed by it): it
// was consumed under another execution record — the request is a copy sent
// again after the first run's record expired, never a takeover of it, which
// holds the same record (DESIGN §7).
func (a *admission) usedBefore(rec *approvals.Record) error {
	if rec == nil || rec.Status != approvals.StatusConsumed || rec.ConsumedBy != a.req.ExecutionID ||
		rec.ConsumedUnder.Equal(a.r.RecordCreated) && !a.r.RecordCreated.IsZero() {
		return nil
	}
	return fmt.Errorf("approval %s consumed by this execution at %s under a record created %s; this delivery's was created %s",
		rec.ID, rec.ConsumedAt.Format(time.RFC3339Nano), rec.ConsumedUnder.Format(time.RFC3339Nano),
		a.r.RecordCreated.Format(time.RFC3339Nano))
}

func (a *admission) approvalStoreFailed(err error) engine.Admission {
	return a.fail(&envelope.CapabilityError{Code: envelope.CodeInternalError, Stage: envelope.StageApproval,
		Retryable: true, ExposeToModel: true, Cause: err,
		Message: "The approval could not be read; try again."})
}

// unusableReason names in the trail why an approval could not be used.
func unusableReason(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{approvals.ErrPending, "approval-pending"},
		{approvals.ErrRejected, "approval-rejected"},
		{approvals.ErrCancelled, "approval-cancelled"},
		{approvals.ErrExpired, "approval-expired"},
		{approvals.ErrConsumed, "approval-consumed"},
		{approvals.ErrInputMismatch, "approval-input-mismatch"},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "approval-unusable"
}

func unusableMessage(err error) string {
	switch approvals.Code(err) {
	case envelope.CodeApprovalPending:
		return "The approval has not been decided yet."
	case envelope.CodeApprovalRejected:
		if errors.Is(err, approvals.ErrCancelled) {
			return "The approval was cancelled."
		}
		return "The approval was rejected."
	case envelope.CodeApprovalExpired:
		return "The approval expired."
	case envelope.CodeApprovalConsumed:
		return "The approval was already used by another execution; a new call needs a new approval."
	case envelope.CodeApprovalInputMismatch:
		return "The stored input is not the approved input."
	}
	return "The approval cannot be used."
}

// canonicalInput is the canonical JSON and hash of a validated input (SI-6:
// an approval binds the value the handler will see, not the bytes submitted).
// The value is written as encoding/json writes it, the form its input schema
// describes and a resume checks again: a UUID or an IP address as its text,
// bytes in base64, a time in RFC 3339.
func canonicalInput(in any) (json.RawMessage, string, error) {
	j, err := json.Marshal(in)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", approvals.ErrUnserializableInput, err)
	}
	raw, err := envelope.RawFromJSON(j)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", approvals.ErrUnserializableInput, err)
	}
	return approvals.Canonical(raw)
}

func grantOf(r *approvals.Record) *ApprovalGrant {
	g := &ApprovalGrant{ID: r.ID}
	if r.Decision != nil {
		g.Approver, g.Comment = r.Decision.Approver, r.Decision.Comment
	}
	return g
}

// restoreGrant finds the approval a takeover's execution already consumed:
// a resume is covered by the approval it consumed, never asks again and never
// consumes twice.
func (a *admission) restoreGrant() *envelope.CapabilityError {
	if a.req.ApprovalID == "" {
		return nil
	}
	ctx, cancel := engine.StoreContext()
	defer cancel()
	fail := func(code envelope.Code, msg string, cause error) *envelope.CapabilityError {
		return &envelope.CapabilityError{Code: code, Stage: envelope.StageApproval, ExposeToModel: true, Message: msg, Cause: cause}
	}
	rec, err := a.w.approvalStore().Get(ctx, a.req.ApprovalID)
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return fail(envelope.CodeForbidden, "No such approval.", err)
	case err != nil:
		return fail(envelope.CodeInternalError, "The approval could not be read; try again.", err)
	case rec.Status != approvals.StatusConsumed || rec.ConsumedBy != a.req.ExecutionID:
		return fail(envelope.CodeApprovalConsumed, "The approval does not cover this execution.", nil)
	case !rec.ConsumedUnder.IsZero() && !rec.ConsumedUnder.Equal(a.r.RecordCreated):
		// Consumed under another record of this id: this one never consumed it.
		return fail(envelope.CodeApprovalConsumed, usedBeforeMessage, a.usedBefore(rec))
	}
	if err := rec.CheckInput(); err != nil {
		return fail(envelope.CodeApprovalInputMismatch, "The stored input is not the approved input.", err)
	}
	if _, h, err := canonicalInput(a.input); err != nil || h != rec.InputHash {
		return fail(envelope.CodeApprovalInputMismatch, "The input is not the approved input.", err)
	}
	a.grant = grantOf(rec)
	return nil
}

// ownerOf is the principal that requested an approval (the anonymous one on
// an open server, and for approvals stored before principals existed).
func ownerOf(r *approvals.Record) string {
	if r.Principal == "" {
		return broker.Anonymous
	}
	return r.Principal
}

// resolveResume fills a resume that names only its approval (see
// engine.Config.ResolveResume): the approval must be principal's.
func (w *Worker) resolveResume(ctx context.Context, principal string, req *envelope.Request) error {
	rec, err := w.approvalStore().Get(ctx, req.ApprovalID)
	notFound := func() error {
		return &envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageApproval, ExposeToModel: true,
			Message: "No such approval.", Cause: approvalsrpc.NotFound(req.ApprovalID)}
	}
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return notFound()
	case err != nil:
		return err
	case ownerOf(rec) != principal:
		// To another principal its approval does not exist (see useApproval).
		w.log.Warn("a resume names another principal's approval: refused as no such approval", "executionId",
			req.ExecutionID, "principal", principal, "approvalId", req.ApprovalID, "requestedBy", ownerOf(rec))
		return notFound()
	}
	raw, err := rec.Raw()
	if err != nil {
		return &envelope.CapabilityError{Code: envelope.CodeApprovalInputMismatch, Stage: envelope.StageApproval,
			ExposeToModel: true, Message: "The stored input is not the approved input.", Cause: err}
	}
	req.CapabilityID, req.Input, req.Actor, req.Surface = rec.CapabilityID, raw, rec.Actor, rec.Surface
	if req.CorrelationID == "" {
		req.CorrelationID = rec.CorrelationID
	}
	return nil
}
