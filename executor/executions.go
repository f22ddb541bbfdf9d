package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/capstan-dev/capstan/internal/trailhint"
	"github.com/capstan-dev/capstan/internal/wireerr"
)

// Reading executions on a principal's behalf (DESIGN §12, "Who reads
// what"). Under the trust boundary only workers and admins read the index,
// the trail and other principals' records; everyone else asks the workers,
// who answer with what the principal's role lets it see:
//
//   - an admin (and every client of an open server): every execution;
//   - a producer: its own (the principal of the execution's key);
//   - an approver: the executions behind the approvals it may decide, the
//     one that asked for an approval and the one that consumed it, with the
//     input as the capability shows it to approvers.
//
// The principal is the token of the request's subject, never a field of its
// body; the answer goes only to the principal's reply subject.

// ExecutionsRequest asks for a page of executions (capstan.executions.list.<principal>).
type ExecutionsRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	audit.Query
	// Cursor is a page's Next: where the next, older page begins.
	Cursor string `json:"cursor,omitempty"`
}

// ExecutionsPage answers an ExecutionsRequest: the entries newest first.
type ExecutionsPage struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Entries are the page's executions, newest first.
	Entries []audit.Entry `json:"entries"`
	// Next is the cursor of the next, older page; "" when nothing older
	// matches. A page may hold fewer entries than asked and still have a
	// next: what it read was superseded, or its reading bound was reached.
	Next string `json:"next,omitempty"`
	// Scanned is how many index entries were read to make the page.
	Scanned int `json:"scanned,omitempty"`
	// Scope says whose executions the principal sees: all, own, approvals.
	Scope string `json:"scope,omitempty"`
	// Error and Conditions carry a refusal: the message, and the names
	// (forbidden, unknown, not_found, invalid, quota_exceeded)
	// Err turns back into errors errors.Is recognizes.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// Scopes of what a principal sees.
const (
	ScopeAll       = "all"
	ScopeOwn       = "own"
	ScopeApprovals = "approvals"
)

// ExecutionRequest asks for one execution (capstan.executions.get.<principal>).
type ExecutionRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ExecutionID is the execution asked for.
	ExecutionID string `json:"executionId"`
	// Owner is the principal whose execution it is: read for admins (and on
	// an open server); by default the one its trail names.
	Owner string `json:"owner,omitempty"`
	// Probe asks only where the execution is (State): no trail, no
	// approvals. What await asks of an id it finds nothing for.
	Probe bool `json:"probe,omitempty"`
}

// Where an execution is, as ExecutionView.State says it.
const (
	// ExecQueued: its request is stored and no worker claimed it yet.
	ExecQueued = "queued"
	// ExecInFlight: its record says it is claimed, running or waiting.
	ExecInFlight = "in-flight"
	// ExecEnded: its envelope exists.
	ExecEnded = "ended"
	// ExecUnknown: nothing of it is stored: no request, record or envelope.
	ExecUnknown = "unknown"
	// ExecUncertain: the workers could not tell (a long backlog, an id
	// without a time): it may be queued.
	ExecUncertain = "uncertain"
)

// ExecutionView is one execution as a principal may see it.
type ExecutionView struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ExecutionID is the execution's.
	ExecutionID string `json:"executionId"`
	// Principal is whose execution it is.
	Principal string `json:"principal,omitempty"`
	// State says where it is: queued, in-flight, ended, unknown, uncertain.
	State string `json:"state"`
	// Record is its record, while one is kept.
	Record *execution.Record `json:"record,omitempty"`
	// Envelope is its outcome, once it ended.
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
	// Trail is its audit trail, oldest first.
	Trail []audit.Event `json:"trail,omitempty"`
	// Approvals are those it asked for or consumed, as the principal may see
	// them (an approver gets what the capability shows approvers of the
	// input).
	Approvals []*approvals.Record `json:"approvals,omitempty"`
	// Scope says why the principal may see it: all, own, approvals.
	Scope string `json:"scope,omitempty"`
	// Omitted names what the view leaves out because the reply would exceed
	// the payload the principal may receive: "trail", "approvals.input"
	// (the approvals' inputs and displays), "output" (the envelope's).
	Omitted []string `json:"omitted,omitempty"`
	// Error and Conditions carry a refusal: the message, and the names
	// (forbidden, unknown, not_found, invalid, quota_exceeded)
	// Err turns back into errors errors.Is recognizes.
	Error      string   `json:"error,omitempty"`
	Conditions []string `json:"conditions,omitempty"` // set with Error; see above
	// Details are a refusal's structured facts: for quota_exceeded, the
	// quota, its limit and retryAfterMs (envelope.QuotaExceeded).
	Details map[string]any `json:"details,omitempty"`
}

// Errors of a reading refused or failed on the workers' side; errors.Is
// matches a reply's conditions against them.
var (
	// ErrNotAllowed: the principal's role does not let it see this.
	ErrNotAllowed = errors.New("capstan: not allowed to read this execution")
	// ErrNoSuchExecution: nothing of the execution is stored: for Status,
	// neither its record nor its envelope; for the others, neither its
	// request nor its record nor its envelope: it never existed, or is long
	// gone (see ErrExpired for one whose envelope expired).
	ErrNoSuchExecution = errors.New("capstan: no such execution")
	// ErrAmbiguousID: an id prefix names several executions.
	ErrAmbiguousID = errors.New("capstan: ambiguous execution id")
)

// readConditions name the conditions of a reading refused on the wire.
var readConditions = wireerr.Table{
	{Name: "forbidden", Err: ErrNotAllowed}, {Name: "unknown", Err: ErrNoSuchExecution},
	{Name: "not_found", Err: broker.ErrNotFound},
}

// readTimeout bounds one reading in a worker.
const readTimeout = 15 * time.Second

// viewer is what a principal may read.
type viewer struct {
	principal string
	scope     string
	role      auth.Role
}

// viewerOf decides what principal may read from its grant.
func (w *Worker) viewerOf(principal string) (viewer, error) {
	v := viewer{principal: principal}
	if principal == broker.Anonymous {
		if w.grants.Open() {
			v.scope = ScopeAll
			return v, nil
		}
		return v, fmt.Errorf("%w: anonymous request on a server with grants", ErrNotAllowed)
	}
	g, ok := w.grants.Lookup(principal)
	if !ok {
		if w.grants.Open() {
			v.scope = ScopeAll
			return v, nil
		}
		return v, fmt.Errorf("%w: principal %q has no grant", ErrNotAllowed, principal)
	}
	v.role = g.Role
	switch g.Role {
	case auth.RoleAdmin, auth.RoleWorker:
		v.scope = ScopeAll
	case auth.RoleProducer:
		v.scope = ScopeOwn
	case auth.RoleApprover:
		v.scope = ScopeApprovals
	default:
		return v, fmt.Errorf("%w: role %q reads no executions", ErrNotAllowed, g.Role)
	}
	return v, nil
}

// serveExecutions answers listings of executions.
func (w *Worker) serveExecutions(m *nats.Msg) {
	principal := w.b.Names.PrincipalOfSubject(m.Subject)
	if !w.b.Names.ReplyAllowed(principal, m.Reply) {
		return // an answer aimed at someone else's subject: not served
	}
	reply := ExecutionsPage{V: envelope.Version, Entries: []audit.Entry{}}
	var req ExecutionsRequest
	if err := envelope.Unmarshal(m.Data, &req); err != nil {
		reply.Error, reply.Conditions = "the listing does not decode: "+err.Error(), []string{"invalid"}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		page, err := w.listExecutions(ctx, principal, req)
		cancel()
		if err != nil {
			reply.Error, reply.Conditions = err.Error(), readConditions.Names(err)
		} else {
			reply = *page
			cutPage(&reply, req.Cursor, w.replyBound(principal))
		}
	}
	w.respond(m, &reply)
}

// cutPage ends a page early when its reply would exceed bound bytes, with
// the cursor of the first entry left out: a reply is never dropped for its
// size.
func cutPage(page *ExecutionsPage, cursor string, bound int) {
	size := func(v any) int {
		b, err := envelope.Marshal(v)
		if err != nil {
			return 0
		}
		return len(b)
	}
	if bound <= 0 || size(page) <= bound {
		return
	}
	used := size(&ExecutionsPage{V: page.V, Entries: []audit.Entry{}, Scanned: page.Scanned, Scope: page.Scope}) + 64
	k := 0
	for k < len(page.Entries) && used+size(&page.Entries[k]) <= bound {
		used += size(&page.Entries[k])
		k++
	}
	k = max(k, 1) // an entry is a few hundred bytes: one always fits
	if k == len(page.Entries) {
		return
	}
	if page.Scope == ScopeApprovals {
		off, _ := strconv.Atoi(strings.TrimPrefix(cursor, "o"))
		page.Next = "o" + strconv.Itoa(off+k)
	} else {
		page.Next = strconv.FormatUint(page.Entries[k-1].Seq, 10)
	}
	page.Entries = page.Entries[:k]
}

func (w *Worker) respond(m *nats.Msg, v any) {
	b, err := envelope.Marshal(v)
	if err != nil {
		w.log.Error("reply does not encode", "subject", m.Subject, "err", err)
		return
	}
	if err := m.Respond(b); err != nil {
		w.log.Error("reply not sent", "subject", m.Subject, "bytes", len(b), "err", err)
	}
}

// listExecutions is one page of what principal may see.
func (w *Worker) listExecutions(ctx context.Context, principal string, req ExecutionsRequest) (*ExecutionsPage, error) {
	v, err := w.viewerOf(principal)
	if err != nil {
		return nil, err
	}
	q := req.Query
	if q.Limit <= 0 {
		q.Limit = audit.DefaultLimit
	}
	q.Limit = min(q.Limit, audit.MaxLimit)
	switch v.scope {
	case ScopeApprovals:
		return w.listBehindApprovals(ctx, v, q, req.Cursor)
	case ScopeOwn:
		if q.Principal != "" && q.Principal != principal {
			return nil, fmt.Errorf("%w: a producer (%s) sees only its own executions, not %s's", ErrNotAllowed, principal, q.Principal)
		}
		q.Principal = principal
	}
	if req.Cursor != "" {
		if err := q.SetCursor(req.Cursor); err != nil {
			return nil, err
		}
	}
	return listWithQueued(ctx, w.b, q, req.Cursor == "", v.scope, current(w.b, w.envelopeRetention))
}

// listWithQueued is a page of the index (audit.List of q, its entries
// passed through current when set), with, on a listing's first
// page, the requests still waiting in their queue that match q first (see
// queuedEntries). What a worker answers; what an admin's command reads itself when
// no worker answers (execrpc.ListWithQueued).
func listWithQueued(ctx context.Context, b *broker.Broker, q audit.Query, first bool, scope string,
	current func(context.Context, []audit.Entry) []audit.Entry) (*ExecutionsPage, error) {
	var queued []audit.Entry
	if first && (q.Status == "" || q.Status == audit.EntryQueued) {
		var err error
		if queued, err = queuedEntries(ctx, b, q); err != nil {
			return nil, err
		}
	}
	// The index holds too the queued an operator's pause gave back (with a
	// record, which the queues' scan passes over).
	out := &ExecutionsPage{V: envelope.Version, Entries: queued, Scope: scope}
	q.Limit = max(q.Limit-len(queued), 1) // a page holds about Limit entries
	if b.Index == nil {
		return nil, fmt.Errorf("%w: the executions index (stream %s) does not exist: a worker of this version creates it",
			broker.ErrNotFound, b.Names.IndexStream())
	}
	page, err := audit.List(ctx, b.NC, b.Names.Prefix(), q)
	if err != nil {
		return nil, err
	}
	entries := page.Entries
	if current != nil {
		entries = current(ctx, entries)
	}
	out.Entries, out.Scanned = append(out.Entries, entries...), page.Scanned
	out.Next = page.Cursor()
	return out, nil
}

// queuedEntries returns the requests matching q (q.Principal's alone, when set)
// that wait in their queues with no record yet: no worker has taken them,
// so the index has no entry of them. It reads the queues (DESIGN §3) from
// their oldest requests, at most queuedScanMax of them in all (a listing
// stays quick whatever the backlog: the oldest waiting are the ones shown),
// and returns at most q.Limit, newest first, with status audit.EntryQueued.
func queuedEntries(ctx context.Context, b *broker.Broker, q audit.Query) ([]audit.Entry, error) {
	subj := b.Names.ExecSubjects()
	if q.Principal != "" {
		subj = b.Names.ExecSubject(q.Principal, ">")
	}
	streams, err := queueStreamsOf(ctx, b, q.Principal)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = audit.DefaultLimit
	}
	var out []audit.Entry
	read := 0
	for _, stream := range streams {
		var err error
		if out, err = queuedOf(ctx, b, q, stream, subj, limit, &read, out); err != nil || len(out) == limit || read == queuedScanMax {
			return sortedNewestFirst(out), err
		}
	}
	return sortedNewestFirst(out), nil
}

// queuedOf adds to out what Queued finds in one queue stream, counting the
// requests it reads in read.
func queuedOf(ctx context.Context, b *broker.Broker, q audit.Query, stream, subj string, limit int, read *int, out []audit.Entry) ([]audit.Entry, error) {
	seq := uint64(0)
	for ; *read < queuedScanMax; *read++ {
		m, err := nextMsg(ctx, b, stream, subj, seq, nil)
		if err != nil || m == nil {
			return out, err
		}
		seq = m.Sequence + 1
		p, _, ok := b.Names.ParseExecSubject(m.Subject)
		if !ok {
			continue
		}
		var r envelope.Request
		if envelope.Unmarshal(m.Data, &r) != nil || r.ExecutionID == "" {
			continue
		}
		e := audit.Entry{V: envelope.Version, ExecutionID: r.ExecutionID, Principal: p, CapabilityID: r.CapabilityID,
			Actor: audit.ActorOf(r.Actor), Surface: r.Surface, ApprovalID: r.ApprovalID, Resumed: r.ApprovalID != "",
			Status: audit.EntryQueued, RequestedAt: r.SubmittedAt, UpdatedAt: m.Time}
		if !q.Match(&e) {
			continue
		}
		// A taken request stays in the stream until its end: it has a
		// record, and the index its entry.
		if _, err := b.Executions.Get(ctx, broker.Key(p, r.ExecutionID)); err == nil {
			continue
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		if _, err := b.Envelopes.Get(ctx, broker.Key(p, r.ExecutionID)); err == nil {
			continue // ended without a record: a copy of a request already answered
		}
		out = append(out, e)
		if len(out) == limit {
			return out, nil
		}
	}
	return out, nil
}

// queueStreamsOf names the queue streams that may hold owner's requests:
// its own and the shared exec stream (which holds the anonymous principal's,
// and those stored before owner had a queue of its own); without an owner,
// every queue.
func queueStreamsOf(ctx context.Context, b *broker.Broker, owner string) ([]string, error) {
	switch owner {
	case "":
		return b.QueueNames(ctx)
	case broker.Anonymous:
		return []string{b.Names.ExecStream()}, nil
	}
	return []string{b.Names.QueueStream(owner), b.Names.ExecStream()}, nil
}

// queuedScanMax bounds the requests a listing reads in the queues.
const queuedScanMax = 500

func sortedNewestFirst(entries []audit.Entry) []audit.Entry {
	slices.SortFunc(entries, func(a, b audit.Entry) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	return entries
}

// current drops the running entries of executions that have ended since: a
// later entry of the index says so, which a listing shows where it stands
// (or, for an execution that ended after the listing began, the next
// listing does); asked for running ones alone, their envelope says so, and
// once that expired (retention), their record does. It keeps a queued
// entry (an operator's pause gave the execution back) only while the
// execution is still given back: it has a record that names no worker, and
// no envelope (a read that fails keeps it). A held execution's record is
// kept while it is held; once it ran, or ended and its record and envelope
// went, a listing that asks for queued ones alone finds no later entry to
// say so.
func current(b *broker.Broker, retention func(context.Context) time.Duration) func(context.Context, []audit.Entry) []audit.Entry {
	return func(ctx context.Context, entries []audit.Entry) []audit.Entry {
		out := entries[:0]
		kept, read := time.Duration(0), false
		for _, e := range entries {
			if e.Status != audit.EntryRunning && e.Status != audit.EntryQueued {
				out = append(out, e)
				continue
			}
			key := broker.Key(e.Principal, e.ExecutionID)
			_, err := b.Envelopes.Get(ctx, key)
			switch {
			case err == nil:
				continue // ended
			case e.Status == audit.EntryQueued:
				rec, _, err := broker.Load[execution.Record](ctx, b.Executions, key)
				if errors.Is(err, broker.ErrNotFound) || err == nil && !givenBack(rec) {
					continue
				}
			case errors.Is(err, jetstream.ErrKeyNotFound):
				if !read {
					kept, read = retention(ctx), true
				}
				// Older than the envelopes' retention, it may have ended
				// with an envelope expired since: its record says.
				if olderThan(e.UpdatedAt, kept) {
					rec, _, err := broker.Load[execution.Record](ctx, b.Executions, key)
					if notRenewed(rec, err) {
						continue
					}
				}
			}
			out = append(out, e)
		}
		return out
	}
}

// givenBack reports whether an execution's record says it waits in its
// queue: the worker that held it gave it back (a pause or a limit's wait),
// and it names none.
func givenBack(rec *execution.Record) bool { return rec.Worker == "" }

// olderThan reports whether since is longer ago than retention (never, for
// a retention of 0: unknown, or for ever).
func olderThan(since time.Time, retention time.Duration) bool {
	return retention > 0 && time.Since(since) > retention
}

// notRenewed reports whether an execution's record, as its read returned
// rec and err, is gone or held by no worker's lease: of an execution with
// no envelope that started longer ago than the envelopes' retention, that
// it ended and its envelope expired since (one running that long keeps its
// lease renewed; a read without claims has no record, and one running that
// long is taken as ended).
func notRenewed(rec *execution.Record, err error) bool {
	return errors.Is(err, broker.ErrNotFound) || err == nil && !rec.LeaseUntil.After(time.Now())
}

// approvalsOf returns the approvals v may decide.
func (w *Worker) approvalsOf(ctx context.Context, v viewer) ([]*approvals.Record, error) {
	mayDecide := func(r *approvals.Record) bool {
		_, _, err := w.grants.Approver(v.principal, r.Types)
		return err == nil
	}
	if w.approvalIndex != nil {
		return w.approvalIndex.Select(mayDecide), nil
	}
	all, err := approvalstore.NewStore(w.b.Approvals, nil).List(ctx, approvalstore.Filter{})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(r *approvals.Record) bool { return !mayDecide(r) }), nil
}

// listBehindApprovals lists, for an approver, the executions behind the
// approvals it may decide: each approval's requesting execution and the
// execution that consumed it, from their envelopes. Approvals are few (a
// bucket with a TTL), so the page is made from all of them; the cursor is
// an offset.
func (w *Worker) listBehindApprovals(ctx context.Context, v viewer, q audit.Query, cursor string) (*ExecutionsPage, error) {
	recs, err := w.approvalsOf(ctx, v)
	if err != nil {
		return nil, err
	}
	var entries []audit.Entry
	for _, r := range recs {
		asked, _ := w.entryOf(ctx, r, r.RequestedBy, false)
		entries = append(entries, asked)
		if r.ConsumedBy == "" {
			continue
		}
		if resumed, ok := w.entryOf(ctx, r, r.ConsumedBy, true); ok {
			entries = append(entries, resumed)
		}
	}
	entries = slices.DeleteFunc(entries, func(e audit.Entry) bool { return !q.Match(&e) })
	slices.SortFunc(entries, func(a, b audit.Entry) int {
		if c := b.UpdatedAt.Compare(a.UpdatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ExecutionID, a.ExecutionID)
	})
	off := 0
	if cursor != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(cursor, "o"))
		if err != nil || n < 0 || !strings.HasPrefix(cursor, "o") {
			return nil, fmt.Errorf("cursor %q: not one of this listing's", cursor)
		}
		off = min(n, len(entries))
	}
	page := &ExecutionsPage{V: envelope.Version, Scope: ScopeApprovals, Scanned: len(recs)}
	end := min(off+q.Limit, len(entries))
	page.Entries = entries[off:end]
	if end < len(entries) {
		page.Next = "o" + strconv.Itoa(end)
	}
	return page, nil
}

// entryOf is an execution behind approval r as an index entry, from its
// envelope when it has one. A resume with none waits in its queue when its
// record names no worker (a pause or a limit gave it back); one that ended
// and whose envelope expired since (notRenewed) has no entry (ok is false):
// its outcome is gone, and the approval says it was consumed.
func (w *Worker) entryOf(ctx context.Context, r *approvals.Record, id string, resume bool) (e audit.Entry, ok bool) {
	e = audit.Entry{V: envelope.Version, ExecutionID: id, Principal: r.Principal, CapabilityID: r.CapabilityID,
		Actor: audit.ActorOf(r.Actor), Surface: r.Surface, ApprovalID: r.ID, Resumed: resume,
		RequestedAt: r.RequestedAt, UpdatedAt: r.RequestedAt, Status: audit.EntryApprovalRequired}
	if resume {
		e.RequestedAt, e.UpdatedAt, e.Status = r.ConsumedAt, r.ConsumedAt, audit.EntryRunning
	}
	key := broker.Key(r.Principal, id)
	env, _, err := broker.Load[envelope.Envelope](ctx, w.b.Envelopes, key)
	switch {
	case err == nil:
		e.Status, e.Attempts, e.DurationMs, e.UpdatedAt = string(env.Status), env.Attempts, env.DurationMs, env.FinalizedAt
		if env.Error != nil {
			e.Code = string(env.Error.Code)
		}
	case resume && errors.Is(err, broker.ErrNotFound):
		rec, _, err := broker.Load[execution.Record](ctx, w.b.Executions, key)
		if olderThan(r.ConsumedAt, w.envelopeRetention(ctx)) && notRenewed(rec, err) {
			return e, false
		}
		if err == nil && givenBack(rec) {
			e.Status = audit.EntryQueued
		}
	}
	return e, true
}

// envelopeRetention is how long envelopes are kept, as this worker last
// read it (0: for ever).
func (w *Worker) envelopeRetention(context.Context) time.Duration { return w.run.EnvelopeRetention() }

// serveExecution answers requests for one execution.
func (w *Worker) serveExecution(m *nats.Msg) {
	principal := w.b.Names.PrincipalOfSubject(m.Subject)
	if !w.b.Names.ReplyAllowed(principal, m.Reply) {
		return // an answer aimed at someone else's subject: not served
	}
	var reply *ExecutionView
	var req ExecutionRequest
	if err := envelope.Unmarshal(m.Data, &req); err != nil {
		reply = &ExecutionView{Error: "the request does not decode: " + err.Error(), Conditions: []string{"invalid"}}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		var err error
		reply, err = w.execution(ctx, principal, req)
		cancel()
		if err != nil {
			reply = &ExecutionView{ExecutionID: req.ExecutionID, Error: err.Error(), Conditions: readConditions.Names(err)}
		}
	}
	reply.V = envelope.Version
	w.respond(m, fitView(reply, w.replyBound(principal)))
}

// fitView leaves out of a view, in this order, its trail, its approvals'
// inputs and its envelope's output while its reply would exceed bound
// bytes, naming each in Omitted; a view that still does not fit is a
// refusal that says so. A reply is never dropped for its size.
func fitView(view *ExecutionView, bound int) *ExecutionView {
	fits := func() bool {
		b, err := envelope.Marshal(view)
		return err == nil && (bound <= 0 || len(b) <= bound)
	}
	if fits() {
		return view
	}
	cuts := []struct {
		name string
		cut  func()
	}{
		{"trail", func() { view.Trail = nil }},
		{"approvals.input", func() {
			for i, r := range view.Approvals {
				c := *r
				c.Input, c.Display = nil, nil
				view.Approvals[i] = &c
			}
		}},
		{"output", func() {
			if view.Envelope != nil {
				e := *view.Envelope
				e.Output = nil
				view.Envelope = &e
			}
		}},
	}
	for _, c := range cuts {
		c.cut()
		view.Omitted = append(view.Omitted, c.name)
		if fits() {
			return view
		}
	}
	return &ExecutionView{V: view.V, ExecutionID: view.ExecutionID, Conditions: []string{"invalid"},
		Error: fmt.Sprintf("execution %s does not fit in a reply of %d bytes, even without its trail, inputs and output", view.ExecutionID, bound)}
}

// execution is one execution as principal may see it. Execution ids are
// unique per principal only (DESIGN §2): the owner is the producer itself, or
// the one the request names (an admin's, an approver's: checked, never
// trusted), or the one principal with an execution of that id.
func (w *Worker) execution(ctx context.Context, principal string, req ExecutionRequest) (*ExecutionView, error) {
	v, err := w.viewerOf(principal)
	if err != nil {
		return nil, err
	}
	id := req.ExecutionID
	if err := envelope.ValidExecutionID(id); err != nil {
		return nil, err
	}
	if req.Owner != "" && !broker.ValidPrincipal(req.Owner) {
		return nil, fmt.Errorf("owner %q is not a principal", req.Owner)
	}
	candidates := []string{req.Owner}
	switch {
	case v.scope == ScopeOwn:
		if req.Owner != "" && req.Owner != principal {
			return nil, fmt.Errorf("%w: a producer (%s) reads only its own executions, not %s's", ErrNotAllowed, principal, req.Owner)
		}
		candidates = []string{principal}
	case principal == broker.Anonymous:
		candidates = []string{broker.Anonymous} // an open server: every execution is the anonymous principal's
	case req.Owner == "":
		owners, err := broker.Owners(ctx, w.b, id)
		if err != nil {
			return nil, err
		}
		candidates = owners
		if len(owners) > 1 && v.scope == ScopeAll {
			return nil, fmt.Errorf("execution %s exists for several principals (%s): name one as its owner", id, strings.Join(owners, ", "))
		}
	}
	if req.Probe {
		if v.scope == ScopeApprovals {
			return nil, fmt.Errorf("%w: an approver (%s) reads executions behind its approvals, not where any is", ErrNotAllowed, principal)
		}
		owner := ""
		if len(candidates) == 1 {
			owner = candidates[0]
		}
		view := &ExecutionView{ExecutionID: id, Scope: v.scope}
		view.State, view.Principal, err = w.where(ctx, owner, id)
		return view, err
	}
	if len(candidates) == 0 {
		if v.scope == ScopeApprovals {
			return nil, fmt.Errorf("%w: an approver (%s) reads only the executions behind approvals it may decide", ErrNotAllowed, principal)
		}
		candidates = []string{principal} // nothing in the buckets: queued, or nothing
	}
	var refused error
	for _, owner := range candidates {
		view, err := w.executionOf(ctx, v, owner, id)
		if errors.Is(err, ErrNotAllowed) {
			refused = err
			continue
		}
		return view, err
	}
	return nil, refused
}

// executionOf is owner's execution id as v may see it.
func (w *Worker) executionOf(ctx context.Context, v viewer, owner, id string) (*ExecutionView, error) {
	view := &ExecutionView{ExecutionID: id, Principal: owner, Scope: v.scope}
	key := broker.Key(owner, id)
	if rec, _, err := broker.LoadCurrent[execution.Record](ctx, w.b, w.b.Executions, key); err == nil {
		view.Record = rec
	} else if !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	if env, _, err := broker.LoadCurrent[envelope.Envelope](ctx, w.b, w.b.Envelopes, key); err == nil {
		view.Envelope = env
	} else if !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	trail, err := w.trailOf(ctx, view)
	if err != nil {
		return nil, err
	}
	view.Trail = trail
	// The approvals behind it: asked for (its trail and envelope say which)
	// or consumed by it, by its owner.
	store := approvalstore.NewStore(w.b.Approvals, nil)
	behind := false
	for _, aid := range approvalIDs(view) {
		r, err := store.Get(ctx, aid)
		if err != nil || (r.RequestedBy != id && r.ConsumedBy != id) || r.Principal != owner {
			continue
		}
		if v.scope == ScopeApprovals {
			if _, _, err := w.grants.Approver(v.principal, r.Types); err != nil {
				continue
			}
			behind = true
		}
		view.Approvals = append(view.Approvals, approvalsrpc.ShownTo(r, v.principal))
	}
	if v.scope == ScopeApprovals && !behind {
		return nil, fmt.Errorf("%w: an approver (%s) reads only the executions behind approvals it may decide", ErrNotAllowed, v.principal)
	}
	if v.scope == ScopeApprovals && view.Record != nil {
		r := *view.Record
		r.Cause, r.Claim = "", "" // for operators and the owning worker
		view.Record = &r
	}
	switch {
	case view.Envelope != nil:
		view.State = ExecEnded
	case view.Record != nil, len(trail) > 0:
		view.State = ExecInFlight // a trail without a record: claimed, its record gone or not yet readable
	default:
		view.State, _, err = w.where(ctx, owner, id)
		if err != nil {
			return nil, err
		}
		if view.State == ExecUnknown {
			return nil, fmt.Errorf("%w: %s", ErrNoSuchExecution, id)
		}
	}
	if view.Envelope != nil && view.Record != nil && view.Record.State != execution.StateFinalized {
		r := *view.Record
		r.State, r.Status, r.Attempt = execution.StateFinalized, view.Envelope.Status, view.Envelope.Attempts
		view.Record = &r
	}
	return view, nil
}

// trailOf reads the audit trail of view's execution. An id made as a
// UUIDv7 says when to read its shard from; for one its caller chose, the
// record or envelope says when it was under way, and an id with neither has
// no trail read: the reading would walk its whole shard, one message get
// for each message of other executions since the stream began, which a
// principal could ask for fifty times a second.
func (w *Worker) trailOf(ctx context.Context, view *ExecutionView) ([]audit.Event, error) {
	var under time.Time // none known: no trail read
	if r := view.Record; r != nil {
		under = r.CreatedAt // claimed
	}
	if e := view.Envelope; e != nil {
		took := e.FinalizedAt.Add(-time.Duration(e.DurationMs) * time.Millisecond)
		if under.IsZero() || took.Before(under) {
			under = took
		}
	}
	// Used by audit.Read for an id that says no time of its own alone.
	ctx = trailhint.WithTime(ctx, under)
	trail, err := audit.Read(ctx, w.b.NC, w.b.Names.Prefix(), view.Principal, view.ExecutionID)
	if err != nil && !errors.Is(err, broker.ErrNotFound) {
		return nil, err
	}
	return trail, nil
}

// approvalIDs are the approvals an execution's trail, record and envelope name.
func approvalIDs(v *ExecutionView) []string {
	var ids []string
	add := func(id string) {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, ev := range v.Trail {
		switch ev.Type {
		case audit.EventApprovalRequested, audit.EventStarted, audit.EventApprovalConsumed:
			if s, ok := ev.Data["approvalId"].(string); ok {
				add(s)
			}
		}
	}
	if v.Envelope != nil && v.Envelope.Approval != nil {
		add(v.Envelope.Approval.ID)
	}
	if v.Record != nil {
		add(v.Record.ApprovalID)
	}
	return ids
}

// probeMaxMsgs bounds the requests a probe reads in the exec stream.
const probeMaxMsgs = 2000

// where says where owner's execution id is, reading in the order that no
// claim racing the reads can hide it from: its request in the exec stream
// (a worker acknowledges a request only after its record exists), then its
// record (created before its envelope), then its envelope. owner "" (an
// admin who named none) looks at every principal's requests.
func (w *Worker) where(ctx context.Context, owner, id string) (state, principal string, err error) {
	return where(ctx, w.b, owner, id)
}

// where is Worker.where on any broker whose credentials read the exec stream
// and owner's keys: a worker's, or a client's of an open server when no
// worker answers.
func where(ctx context.Context, b *broker.Broker, owner, id string) (state, principal string, err error) {
	p := owner
	subj := b.Names.ExecSubjects()
	if owner != "" {
		subj = b.Names.ExecSubject(owner, ">")
	}
	streams, err := queueStreamsOf(ctx, b, owner)
	if err != nil {
		return "", "", err
	}
	certain := true
	for _, stream := range streams {
		queued, qp, sure, err := queuedIn(ctx, b, stream, subj, id)
		if err != nil {
			return "", "", err
		}
		if queued {
			return ExecQueued, qp, nil
		}
		certain = certain && sure
	}
	if owner == "" {
		// Without an owner the buckets cannot be read by key: whoever has
		// a record or an envelope of the id.
		if owners, err := broker.Owners(ctx, b, id); err == nil && len(owners) > 0 {
			return ExecInFlight, owners[0], nil
		}
		if !certain {
			return ExecUncertain, "", nil
		}
		return ExecUnknown, "", nil
	}
	// An absence the leader confirms: a replica behind would call a record
	// or an envelope that exists absent, and the id unknown.
	key := broker.Key(p, id)
	if ok, err := broker.Present(ctx, b, b.Executions, key); err != nil {
		return "", "", err
	} else if ok {
		return ExecInFlight, p, nil
	}
	if ok, err := broker.Present(ctx, b, b.Envelopes, key); err != nil {
		return "", "", err
	} else if ok {
		return ExecEnded, p, nil
	}
	if !certain {
		return ExecUncertain, p, nil
	}
	return ExecUnknown, p, nil
}

// queued looks for the request of id among the messages of the queue stream on
// subj: for a UUIDv7 id from the id's time less a minute (a request is never
// stored before its id is made, less the clocks' skew), else from the
// stream's start; certain is false when it stopped at probeMaxMsgs.
func queuedIn(ctx context.Context, b *broker.Broker, stream, subj, id string) (found bool, principal string, certain bool, err error) {
	var from *time.Time
	if made, v7 := envelope.ExecutionIDTime(id); v7 {
		t := made.Add(-time.Minute).UTC()
		from = &t
	}
	seq := uint64(0)
	for range probeMaxMsgs {
		m, err := nextMsg(ctx, b, stream, subj, seq, from)
		if err != nil {
			return false, "", false, err
		}
		if m == nil {
			return false, "", true, nil
		}
		from, seq = nil, m.Sequence+1
		// The message id names the execution: <principal>.<id>[.<tag>]
		// (or, from earlier versions, the id alone).
		if p, _, ok := b.Names.ParseExecSubject(m.Subject); ok && broker.ExecutionOfMsgID(m.Header.Get(nats.MsgIdHdr), p) == id {
			return true, p, true, nil
		}
	}
	return false, "", false, nil
}

// nextMsg is the first message of the queue stream on subj at or after seq (or
// time from), or nil: a message get, which a queue answers without
// direct gets.
func nextMsg(ctx context.Context, b *broker.Broker, stream, subj string, seq uint64, from *time.Time) (*jetstream.RawStreamMsg, error) {
	m, err := jsget.Get(ctx, b.NC, stream, jsget.Request{Seq: seq, NextFor: subj, StartTime: from})
	if jsget.Absent(err) {
		return nil, nil // no such message, or no such stream (a principal without a queue of its own)
	}
	return m, err
}

// Executions asks the workers for a page of the executions the client's
// principal may see.
func (c *Client) Executions(ctx context.Context, req ExecutionsRequest) (*ExecutionsPage, error) {
	req.V = envelope.Version
	return execrpc.Ask[ExecutionsPage](ctx, c.b.NC, c.b.Names, c.b.Names.ListExecutionsSubject, &req, "list executions")
}

// Err returns the refusal the page carries, as an error that errors.Is
// matches against ErrNotAllowed and the others of its conditions, or nil.
func (p *ExecutionsPage) Err() error {
	if p.Error == "" {
		return nil
	}
	return readConditions.Error(p.Error, p.Conditions, p.Details)
}

// Err returns the refusal the view carries, as an error that errors.Is
// matches against ErrNoSuchExecution, ErrNotAllowed and the others of its
// conditions, or nil.
func (v *ExecutionView) Err() error {
	if v.Error == "" {
		return nil
	}
	return readConditions.Error(v.Error, v.Conditions, v.Details)
}

// Execution asks the workers for one execution as the client's principal may
// see it: record, envelope, trail and the approvals behind it. A probe that
// no worker answers is answered by the client itself where it may read the
// exec stream (an open server), so that a request queued while no worker
// runs is said to be queued, not unknown; elsewhere it fails with
// ErrNoWorkers.
func (c *Client) Execution(ctx context.Context, req ExecutionRequest) (*ExecutionView, error) {
	req.V = envelope.Version
	v, err := execrpc.Ask[ExecutionView](ctx, c.b.NC, c.b.Names, c.b.Names.ExecutionSubject, &req, "read execution "+req.ExecutionID)
	if !errors.Is(err, ErrNoWorkers) || !req.Probe || c.principal != broker.Anonymous {
		return v, err
	}
	view := &ExecutionView{V: envelope.Version, ExecutionID: req.ExecutionID, Scope: ScopeAll}
	var werr error
	if view.State, view.Principal, werr = where(ctx, c.b, c.principal, req.ExecutionID); werr != nil {
		return nil, err
	}
	return view, nil
}
