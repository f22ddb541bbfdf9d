package approvalsrpc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
)

// decideTimeout bounds one decision or listing in a worker.
const decideTimeout = 10 * time.Second

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
// decide is refused exactly as one that does not exist (approvals.ErrNotFound): a
// refusal tells no one of another's approval, nor of its types.
func DecideAs(ctx context.Context, s *approvalstore.Store, principal string, req DecideRequest, authz Authorizer) (*approvals.Record, error) {
	r, err := s.Get(ctx, req.ApprovalID)
	if err != nil {
		return nil, err
	}
	who, open, err := authz.Approver(principal, r.Types)
	if err != nil {
		if !requestedBy(r, principal) {
			return nil, NotFound(req.ApprovalID)
		}
		return nil, fmt.Errorf("%w: %w", approvals.ErrForbidden, err)
	}
	v := approvals.Verdict{Approve: req.Approve, Approver: who, Comment: req.Comment}
	if open {
		v.Approver, v.SelfApproval = req.Approver, req.SelfApproval
	} else if r.Principal == principal {
		return nil, fmt.Errorf("%w: principal %q requested it", approvals.ErrSelfApproval, principal)
	}
	return s.Decide(ctx, req.ApprovalID, v)
}

// Serve answers decisions sent to n.DecideSubjects() in the workers' queue
// group, until the subscription is drained or closed. ServeList answers the
// listings.
func Serve(nc *nats.Conn, s *approvalstore.Store, n broker.Names, authz Authorizer) (*nats.Subscription, error) {
	return nc.QueueSubscribe(n.DecideSubjects(), n.WorkersQueue(), DecideHandler(s, n, authz))
}

// DecideHandler answers one decision sent to n.DecideSubjects(): what Serve
// subscribes, for a worker that schedules the requests it serves itself.
func DecideHandler(s *approvalstore.Store, n broker.Names, authz Authorizer) nats.MsgHandler {
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
			rec, err := DecideAs(ctx, s, principal, req, authz)
			cancel()
			reply.Record = shownTo(rec, principal)
			if err != nil {
				reply.Error, reply.Conditions = err.Error(), Conditions(err)
				reply.AuditUnavailable = rec != nil && slices.Contains(reply.Conditions, "audit_unavailable")
			}
		}
		b, err := envelope.Marshal(&reply)
		if err == nil {
			_ = m.Respond(b)
		}
	}
}

// ListAs returns the approvals principal may see: those of types it may
// decide (see Authorizer), and those requested under principal itself.
func ListAs(ctx context.Context, s *approvalstore.Store, principal string, req approvals.ListRequest, authz Authorizer) ([]*approvals.Record, error) {
	var all []*approvals.Record
	if req.ID != "" {
		r, err := s.Get(ctx, req.ID)
		if err != nil {
			return nil, err
		}
		all = []*approvals.Record{r}
	} else {
		var err error
		if all, err = s.List(ctx, approvalstore.Filter{Status: req.Status, CapabilityID: req.CapabilityID, Actor: req.Actor}); err != nil {
			return nil, err
		}
	}
	out := make([]*approvals.Record, 0, len(all))
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
		return nil, NotFound(req.ID)
	}
	return out, nil
}

// NotFound is the error of an approval id that names nothing the
// asker may see (approvals.ErrNotFound): the same, word for word, whether the approval
// does not exist or is another principal's.
func NotFound(id string) error { return fmt.Errorf("%w: %s", approvals.ErrNotFound, id) }

// shownTo is r as principal may receive it: when the capability redacts what
// approvers see (a Display is stored), anyone but the principal that
// requested it receives the display and the input's hash, not the input. The
// approval still binds the whole input, which the workers read from the
// store. On an open server, where every client reads the approvals bucket,
// the record is sent whole.
func shownTo(r *approvals.Record, principal string) *approvals.Record {
	if r == nil || len(r.Display) == 0 || principal == "" || principal == broker.Anonymous || requestedBy(r, principal) {
		return r
	}
	v := *r
	v.Input = nil
	return &v
}

// ShownTo is r as principal may receive it (see shownTo): what any reader on
// a principal's behalf hands it, an execution's view among them.
func ShownTo(r *approvals.Record, principal string) *approvals.Record { return shownTo(r, principal) }

// requestedBy reports whether an authenticated principal requested r.
func requestedBy(r *approvals.Record, principal string) bool {
	return principal != "" && principal != broker.Anonymous && r.Principal == principal
}

// ServeList answers listings sent to n.ListApprovalsSubjects() in the
// workers' queue group, each reply within the connection's max payload.
func ServeList(nc *nats.Conn, s *approvalstore.Store, x *Index, n broker.Names, authz Authorizer) (*nats.Subscription, error) {
	return nc.QueueSubscribe(n.ListApprovalsSubjects(), n.WorkersQueue(),
		ListHandler(s, x, n, authz, func(string) int { return int(nc.MaxPayload()) }))
}

// ListHandler answers one listing sent to n.ListApprovalsSubjects() (see
// PageAs): what ServeList subscribes, for a worker that schedules the
// requests it serves itself. maxBytes says how large a reply principal may
// be sent.
func ListHandler(s *approvalstore.Store, x *Index, n broker.Names, authz Authorizer, maxBytes func(principal string) int) nats.MsgHandler {
	return func(m *nats.Msg) {
		principal := n.PrincipalOfSubject(m.Subject)
		if !n.ReplyAllowed(principal, m.Reply) {
			return // an answer aimed at someone else's subject: not served
		}
		reply := &approvals.ListReply{V: envelope.Version, Records: []*approvals.Record{}}
		var req approvals.ListRequest
		if err := envelope.Unmarshal(m.Data, &req); err != nil {
			reply.Error, reply.Conditions = "the listing does not decode: "+err.Error(), []string{"invalid"}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			page, err := PageAs(ctx, s, x, principal, req, authz, maxBytes(principal))
			cancel()
			if err != nil {
				reply.Error, reply.Conditions = err.Error(), Conditions(err)
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
			b, _ = envelope.Marshal(&approvals.ListReply{V: envelope.Version, Records: []*approvals.Record{}, Conditions: []string{"invalid"},
				Error: fmt.Sprintf("the page is %d bytes, over the %d a reply may hold", len(b), bound)})
		}
		_ = m.Respond(b)
	}
}
