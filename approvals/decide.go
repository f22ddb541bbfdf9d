package approvals

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
)

// ErrForbidden: the principal may not decide this approval (not an approver,
// or not of its types).
var ErrForbidden = errors.New("capstan: not allowed to decide this approval")

// DecideRequest asks the workers to record a decision. The approver is the
// principal whose subject the request arrived on (the server lets a principal
// publish only there), never a field of the request.
type DecideRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ApprovalID is the approval decided.
	ApprovalID string `json:"approvalId"`
	// Approve approves; false rejects.
	Approve bool `json:"approve"`
	// Comment is the approver's, kept on the record and the trail.
	Comment string `json:"comment,omitempty"`
	// Approver and SelfApproval are read on an open server only, where no
	// principal is authenticated and the decision names its approver.
	Approver     envelope.Actor `json:"approver,omitzero"`
	SelfApproval string         `json:"selfApproval,omitempty"` // the reason a requester gives for approving its own call
}

// DecideReply is the workers' answer: the decided record, or the conditions
// that refused it.
type DecideReply struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Record is the decided approval.
	Record *Record `json:"record,omitempty"`
	// Error and Conditions carry a refusal: the message, and the names of
	// the sentinel errors (not_found, expired, consumed, …) that
	// RequestDecision and RequestList turn back into errors errors.Is knows.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// AuditUnavailable: the decision stands but its audit event is not stored.
	AuditUnavailable bool `json:"auditUnavailable,omitempty"`
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// Authorizer says who an approver principal is and whether it may decide an
// approval of some types. open reports a server without principals, where a
// request names its approver.
type Authorizer interface {
	// Approver returns the actor principal decides as, if it may decide an
	// approval of these types.
	Approver(principal string, types []string) (approver envelope.Actor, open bool, err error)
}

// DecideAs records principal's decision: the approver is the identity the
// Authorizer gives the principal; an approval requested under the same
// principal, or by the same actor, is refused as self-approval, with no
// reason that lifts it. An approval principal neither requested nor may
// decide is refused exactly as one that does not exist (ErrNotFound): a
// refusal tells no one of another's approval, nor of its types.
func (s *Store) DecideAs(ctx context.Context, principal string, req DecideRequest, authz Authorizer) (*Record, error) {
	r, err := s.Get(ctx, req.ApprovalID)
	if err != nil {
		return nil, err
	}
	who, open, err := authz.Approver(principal, r.Types)
	if err != nil {
		if !requestedBy(r, principal) {
			return nil, notFound(req.ApprovalID)
		}
		return nil, fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	v := Verdict{Approve: req.Approve, Approver: who, Comment: req.Comment}
	if open {
		v.Approver, v.SelfApproval = req.Approver, req.SelfApproval
	} else if r.Principal == principal {
		return nil, fmt.Errorf("%w: principal %q requested it", ErrSelfApproval, principal)
	}
	return s.Decide(ctx, req.ApprovalID, v)
}

// Serve answers decisions sent to n.DecideSubjects() in the workers' queue
// group, until the subscription is drained or closed. ServeList answers the
// listings.
func (s *Store) Serve(nc *nats.Conn, n broker.Names, authz Authorizer) (*nats.Subscription, error) {
	return nc.QueueSubscribe(n.DecideSubjects(), n.WorkersQueue(), s.DecideHandler(n, authz))
}

// DecideHandler answers one decision sent to n.DecideSubjects(): what Serve
// subscribes, for a worker that schedules the requests it serves itself.
func (s *Store) DecideHandler(n broker.Names, authz Authorizer) nats.MsgHandler {
	return func(m *nats.Msg) {
		principal := n.PrincipalOfSubject(m.Subject)
		if !n.ReplyAllowed(principal, m.Reply) {
			return // an answer aimed at someone else's subject: not served
		}
		var reply DecideReply
		reply.V = envelope.Version
		var req DecideRequest
		if err := envelope.Unmarshal(m.Data, &req); err != nil {
			reply.Error, reply.Conditions = "the decision does not decode: "+err.Error(), []string{"invalid"}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			rec, err := s.DecideAs(ctx, principal, req, authz)
			cancel()
			reply.Record = shownTo(rec, principal)
			if err != nil {
				reply.Error, reply.Conditions = err.Error(), conditionsOf(err)
				reply.AuditUnavailable = rec != nil && slices.Contains(reply.Conditions, "audit_unavailable")
			}
		}
		b, err := envelope.Marshal(&reply)
		if err == nil {
			_ = m.Respond(b)
		}
	}
}

// RequestDecision sends req to the workers as principal (the connection's,
// see broker.PrincipalOf) and returns the decided record. A refusal is an
// error that errors.Is matches against the store's conditions (ErrSelfApproval,
// ErrForbidden, ErrAlreadyDecided...). A decision whose audit event is
// missing returns the record and an error matching audit.ErrUnavailable.
func RequestDecision(ctx context.Context, nc *nats.Conn, n broker.Names, req DecideRequest) (*Record, error) {
	req.V = envelope.Version
	var reply DecideReply
	if err := request(ctx, nc, n.DecideSubject(broker.PrincipalOf(nc, n)), "decide "+req.ApprovalID, &req, &reply); err != nil {
		return nil, err
	}
	if reply.Error == "" {
		return reply.Record, nil
	}
	return reply.Record, refusal(reply.Error, reply.Conditions, reply.Details)
}

// decideTimeout bounds one decision in a worker.
const decideTimeout = 10 * time.Second

// conditionNames name the store's conditions on the wire.
var conditionNames = []struct {
	name string
	err  error
}{
	{"not_found", ErrNotFound}, {"pending", ErrPending}, {"rejected", ErrRejected},
	{"cancelled", ErrCancelled}, {"expired", ErrExpired}, {"consumed", ErrConsumed},
	{"already_decided", ErrAlreadyDecided}, {"self_approval", ErrSelfApproval},
	{"input_mismatch", ErrInputMismatch}, {"invalid", ErrInvalid}, {"forbidden", ErrForbidden},
	{"audit_unavailable", audit.ErrUnavailable}, {"quota_exceeded", envelope.ErrQuotaExceeded},
}

func conditionsOf(err error) []string {
	var out []string
	for _, c := range conditionNames {
		if errors.Is(err, c.err) {
			out = append(out, c.name)
		}
	}
	return out
}

func errorsOf(names []string) []error {
	var out []error
	for _, n := range names {
		for _, c := range conditionNames {
			if c.name == n {
				out = append(out, c.err)
			}
		}
	}
	return out
}

// refusal is the error of a refusal a worker answered: a quota's is the
// *envelope.CapabilityError it was made from, any other matches the
// conditions it named.
func refusal(msg string, conds []string, details map[string]any) error {
	if slices.Contains(conds, "quota_exceeded") {
		return envelope.QuotaRefusal(msg, details)
	}
	return &remoteError{msg: msg, conds: errorsOf(conds)}
}

// remoteError is a refusal answered by a worker, matching the conditions it named.
type remoteError struct {
	msg   string
	conds []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.conds }

// ListRequest asks the workers for a page of approvals, as Filter selects
// them, or for the one named by ID. An approver receives the approvals of
// types it may decide, and any principal the approvals it requested itself (a
// producer follows its own calls' approvals so); on an open server, every
// one. A page holds each requesting principal's approvals oldest first
// (Newest: newest first), the principals taking turns, one approval each, so
// that no principal's approvals hide another's (DESIGN §7).
type ListRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ID asks for one approval; the other fields filter a listing.
	ID string `json:"id,omitempty"`
	// Status is as of now: an approval past its expiry lists as expired.
	Status Status `json:"status,omitempty"`
	// CapabilityID keeps the approvals of one capability.
	CapabilityID string `json:"capabilityId,omitempty"`
	// Actor keeps the approvals one requester asked for.
	Actor envelope.Actor `json:"actor,omitzero"`
	// Limit is the page's size: default DefaultPageSize, at most MaxPageSize.
	Limit int `json:"limit,omitempty"`
	// Cursor is a page's Next: where the next page begins.
	Cursor string `json:"cursor,omitempty"`
	// Decided keeps the approvals no longer pending as of now (approved,
	// rejected, cancelled, expired, consumed); not with Status.
	Decided bool `json:"decided,omitempty"`
	// Newest lists each requester's approvals newest first.
	Newest bool `json:"newest,omitempty"`
}

// ListReply is the workers' answer to a ListRequest: one page.
type ListReply struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Records are the page's approvals, in the listing's order.
	Records []*Record `json:"records"`
	// Error and Conditions carry a refusal: the message, and the names of
	// the sentinel errors (not_found, expired, consumed, …) that
	// RequestDecision and RequestList turn back into errors errors.Is knows.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// Next is the cursor of the next page; "" when nothing more matches. A
	// page holds fewer records than asked when more would not fit in one
	// reply (the payload the principal may receive).
	Next string `json:"next,omitempty"`
	// Trimmed names the records sent without their input and display: alone,
	// they would not fit in a reply. InputHash still names the input.
	Trimmed []string `json:"trimmed,omitempty"`
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// ListAs returns the approvals principal may see: those of types it may
// decide (see Authorizer), and those requested under principal itself.
func (s *Store) ListAs(ctx context.Context, principal string, req ListRequest, authz Authorizer) ([]*Record, error) {
	var all []*Record
	if req.ID != "" {
		r, err := s.Get(ctx, req.ID)
		if err != nil {
			return nil, err
		}
		all = []*Record{r}
	} else {
		var err error
		if all, err = s.List(ctx, Filter{Status: req.Status, CapabilityID: req.CapabilityID, Actor: req.Actor}); err != nil {
			return nil, err
		}
	}
	out := make([]*Record, 0, len(all))
	for _, r := range all {
		if requestedBy(r, principal) {
			out = append(out, r)
			continue
		}
		if _, _, err := authz.Approver(principal, r.Types); err == nil {
			out = append(out, shownTo(r, principal))
		}
	}
	if req.ID != "" && len(out) == 0 {
		// Neither requested nor decidable by principal: to it, no such
		// approval, word for word.
		return nil, notFound(req.ID)
	}
	return out, nil
}

// notFound is the refusal of an approval id that names nothing the asker
// may see: the same, word for word, whether the approval does not exist or
// is another's.
func notFound(id string) error { return fmt.Errorf("%w: %s", ErrNotFound, id) }

// NoSuchApproval is the error of an approval id that names nothing the
// asker may see (ErrNotFound): the same, word for word, whether the approval
// does not exist or is another principal's.
func NoSuchApproval(id string) error { return notFound(id) }

// shownTo is r as principal may receive it: when the capability redacts what
// approvers see (a Display is stored), anyone but the principal that
// requested it receives the display and the input's hash, not the input. The
// approval still binds the whole input, which the workers read from the
// store. On an open server, where every client reads the approvals bucket,
// the record is sent whole.
func shownTo(r *Record, principal string) *Record {
	if r == nil || len(r.Display) == 0 || principal == "" || principal == broker.Anonymous || requestedBy(r, principal) {
		return r
	}
	v := *r
	v.Input = nil
	return &v
}

// ShownTo is r as principal may receive it (see shownTo): what any reader on
// a principal's behalf hands it, an execution's view among them.
func ShownTo(r *Record, principal string) *Record { return shownTo(r, principal) }

// requestedBy reports whether an authenticated principal requested r.
func requestedBy(r *Record, principal string) bool {
	return principal != "" && principal != broker.Anonymous && r.Principal == principal
}

// ServeList answers listings sent to n.ListApprovalsSubjects() in the
// workers' queue group, each reply within the connection's max payload.
func (s *Store) ServeList(nc *nats.Conn, n broker.Names, authz Authorizer) (*nats.Subscription, error) {
	return nc.QueueSubscribe(n.ListApprovalsSubjects(), n.WorkersQueue(),
		s.ListHandler(n, authz, func(string) int { return int(nc.MaxPayload()) }))
}

// ListHandler answers one listing sent to n.ListApprovalsSubjects() (see
// PageAs): what ServeList subscribes, for a worker that schedules the
// requests it serves itself. maxBytes says how large a reply principal may
// be sent.
func (s *Store) ListHandler(n broker.Names, authz Authorizer, maxBytes func(principal string) int) nats.MsgHandler {
	return func(m *nats.Msg) {
		principal := n.PrincipalOfSubject(m.Subject)
		if !n.ReplyAllowed(principal, m.Reply) {
			return // an answer aimed at someone else's subject: not served
		}
		reply := &ListReply{V: envelope.Version, Records: []*Record{}}
		var req ListRequest
		if err := envelope.Unmarshal(m.Data, &req); err != nil {
			reply.Error, reply.Conditions = "the listing does not decode: "+err.Error(), []string{"invalid"}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			page, err := s.PageAs(ctx, principal, req, authz, maxBytes(principal))
			cancel()
			if err != nil {
				reply.Error, reply.Conditions = err.Error(), conditionsOf(err)
			} else {
				reply = page
			}
		}
		b, err := envelope.Marshal(reply)
		if err != nil {
			return
		}
		if bound := maxBytes(principal); bound > 0 && len(b) > bound {
			// Never dropped for its size: the refusal says why.
			b, _ = envelope.Marshal(&ListReply{V: envelope.Version, Records: []*Record{}, Conditions: []string{"invalid"},
				Error: fmt.Sprintf("the page is %d bytes, over the %d a reply may hold", len(b), bound)})
		}
		_ = m.Respond(b)
	}
}

// RequestList asks the workers for a page of the approvals the connection's
// principal may see (see PageAs): Next is the cursor of the next one. A
// refusal matches the store's conditions with errors.Is (ErrNotFound,
// ErrForbidden, envelope.ErrQuotaExceeded).
func RequestList(ctx context.Context, nc *nats.Conn, n broker.Names, req ListRequest) (*ListReply, error) {
	req.V = envelope.Version
	var reply ListReply
	if err := request(ctx, nc, n.ListApprovalsSubject(broker.PrincipalOf(nc, n)), "list approvals", &req, &reply); err != nil {
		return nil, err
	}
	if reply.Error != "" {
		return nil, refusal(reply.Error, reply.Conditions, reply.Details)
	}
	if reply.Records == nil {
		reply.Records = []*Record{}
	}
	return &reply, nil
}

// request sends req to subject and decodes the workers' answer into reply;
// what names the request in errors.
func request(ctx context.Context, nc *nats.Conn, subject, what string, req, reply any) error {
	b, err := envelope.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return fmt.Errorf("capstan: %s: %w", what, err)
	}
	if err := envelope.Unmarshal(m.Data, reply); err != nil {
		return fmt.Errorf("capstan: %s: reply: %w", what, err)
	}
	return nil
}

// RequestOne returns the approval id names, among those the connection's
// principal may see: one request, answered with the record or a refusal
// (ErrNotFound, ErrForbidden).
func RequestOne(ctx context.Context, nc *nats.Conn, n broker.Names, id string) (*Record, error) {
	page, err := RequestList(ctx, nc, n, ListRequest{ID: id})
	if err != nil {
		return nil, err
	}
	for _, r := range page.Records {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
}
