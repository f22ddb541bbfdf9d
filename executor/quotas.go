package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
)

// Quotas per principal (DESIGN §12 "Quotas"): what this worker refuses of a
// principal's control requests and approvals beyond its grant's quotas, and
// how the audit events of its read-only requests are coalesced.

// Control requests run on controlSlots goroutines, of which one principal
// holds at most controlShare: a principal's slow listings delay its own
// requests, and leave the others' slots free.
const (
	controlSlots = 8
	controlShare = controlSlots / 2
	// unquotedWaiting bounds the requests of a principal without quotas (an
	// admin, a worker, an open server's clients) waiting for a slot.
	unquotedWaiting = 1024
)

// now is the time of quotas and coalescing: the knob's clock, for tests
// that count without timing.
func (w *Worker) now() time.Time {
	if c := w.cfg.knobs.ControlClock; c != nil {
		return c()
	}
	return time.Now()
}

// quotasOf returns principal's quotas: none for a principal without a grant
// of its own account (an admin, a worker, an open server's clients).
func (w *Worker) quotasOf(principal string) (auth.Quotas, bool) {
	g, ok := w.grants.Lookup(principal)
	if !ok || !auth.HasOwnAccount(g.Role) {
		return auth.Quotas{}, false
	}
	return g.Quotas.OrDefault(), true
}

// replyBound is the largest reply principal may be sent: the worker's
// connection's max payload, or its account's if smaller.
func (w *Worker) replyBound(principal string) int {
	bound := int(w.nc.MaxPayload())
	if g, ok := w.grants.Lookup(principal); ok && g.Limits != nil && g.Limits.Payload > 0 && int(g.Limits.Payload) < bound {
		bound = int(g.Limits.Payload)
	}
	return bound
}

// refuser answers a control request that is not served with its reply
// type's form of the refusal.
type refuser func(m *nats.Msg, cerr *envelope.CapabilityError)

// gated serves a control request once it passes principal's
// controlPerSecond quota (refused at once, before its body is read), on the
// control gate's turns between principals. A principal may have at most a
// second's quota of requests waiting for a slot.
func (w *Worker) gated(serve nats.MsgHandler, refuse refuser) nats.MsgHandler {
	return func(m *nats.Msg) {
		principal := w.b.Names.PrincipalOfSubject(m.Subject)
		if !w.b.Names.ReplyAllowed(principal, m.Reply) {
			return // an answer aimed at someone else's subject: not served
		}
		q, quoted := w.quotasOf(principal)
		perSecond, waiting := int64(-1), unquotedWaiting
		if quoted && q.ControlPerSecond > 0 {
			perSecond, waiting = q.ControlPerSecond, int(q.ControlPerSecond)
		}
		if ok, wait := w.rates.Take(principal, perSecond, w.now()); !ok {
			w.quotaRefused(envelope.QuotaControlPerSecond, principal)
			refuse(m, envelope.QuotaExceeded("", envelope.QuotaControlPerSecond, "control requests a second", perSecond, wait))
			return
		}
		w.reading.Add(1)
		if !w.gate.Submit(principal, waiting, func() { defer w.reading.Done(); serve(m) }) {
			w.reading.Done()
			if w.stopping.Load() {
				refuse(m, &envelope.CapabilityError{Code: envelope.CodeInternalError, Retryable: true, ExposeToModel: true,
					Message: "The worker is stopping; try again."})
				return
			}
			w.quotaRefused(envelope.QuotaControlPerSecond, principal)
			refuse(m, envelope.QuotaExceeded("", envelope.QuotaControlPerSecond,
				"control requests a second, served or waiting", int64(waiting), time.Second))
		}
	}
}

// quotaRefused counts a refusal and logs it, once per principal and quota
// every refusalLogEvery with how many there were.
func (w *Worker) quotaRefused(quota, principal string) {
	w.cfg.Observer.QuotaExceeded(quota, principal)
	now := time.Now()
	key := quota + " " + principal
	w.refusalsMu.Lock()
	r := w.refusals[key]
	r.n++
	log := now.Sub(r.logged) >= refusalLogEvery
	n := r.n
	if log {
		r.logged, r.n = now, 0
	}
	w.refusals[key] = r
	w.refusalsMu.Unlock()
	if log {
		w.log.Warn("over a quota: refused", "quota", quota, "principal", principal, "refused", n)
	}
}

// refusalLogEvery spaces the log lines of one principal's refusals.
const refusalLogEvery = 10 * time.Second

type refusalLog struct {
	logged time.Time
	n      int
}

// refusalConditions are the conditions a control reply names for a refusal.
func refusalConditions(cerr *envelope.CapabilityError) []string {
	if errors.Is(cerr, envelope.ErrQuotaExceeded) {
		return []string{"quota_exceeded"}
	}
	return nil
}

func (w *Worker) refuseDescribe(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respond(m, &DescribeReply{Discovery: Discovery{V: envelope.Version, Capabilities: []Descriptor{}, Worker: w.cfg.ID}, Error: cerr.Wire()})
}

func (w *Worker) refuseCancel(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respondJSON(m, CancelReply{ExecutionID: lastToken(m.Subject), Error: cerr.Message, Conditions: refusalConditions(cerr), Details: cerr.Details})
}

func (w *Worker) refuseDecision(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respond(m, &approvalsrpc.DecideReply{V: envelope.Version, Error: cerr.Message, Conditions: refusalConditions(cerr), Details: cerr.Details})
}

func (w *Worker) refuseApprovals(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respond(m, &approvals.ListReply{V: envelope.Version, Records: []*approvals.Record{}, Error: cerr.Message,
		Conditions: refusalConditions(cerr), Details: cerr.Details})
}

func (w *Worker) refuseExecutions(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respond(m, &ExecutionsPage{V: envelope.Version, Entries: []audit.Entry{}, Error: cerr.Message,
		Conditions: refusalConditions(cerr), Details: cerr.Details})
}

func (w *Worker) refuseExecution(m *nats.Msg, cerr *envelope.CapabilityError) {
	w.respond(m, &ExecutionView{V: envelope.Version, Error: cerr.Message, Conditions: refusalConditions(cerr), Details: cerr.Details})
}

// reservePending holds one of principal's pending approvals for the one this
// worker is about to create, or refuses it QUOTA_EXCEEDED (pendingApprovals)
// with when the first of them expires. Call release once it is created
// (and noted in the index) or not.
func (w *Worker) reservePending(principal string) (release func(), refusal *envelope.CapabilityError) {
	q, quoted := w.quotasOf(principal)
	if !quoted || q.PendingApprovals <= 0 || w.approvalIndex == nil {
		return func() {}, nil
	}
	// Counted from what every worker wrote before now: only approvals
	// created at this very moment elsewhere are missed.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = w.approvalIndex.Sync(ctx)
	cancel()
	release, wait, err := w.approvalIndex.Reserve(principal, q.PendingApprovals, time.Now())
	if err != nil {
		w.quotaRefused(envelope.QuotaPendingApprovals, principal)
		return nil, envelope.QuotaExceeded(envelope.StageApproval, envelope.QuotaPendingApprovals,
			"approvals pending at once", q.PendingApprovals, wait)
	}
	return release, nil
}

// Coalescing (DESIGN §8): the audit events of read-only requests — a
// description's capabilities.discovered, the only one they file — are
// filed at once for each distinct description (surface, actor, scope, what
// it listed and withheld) a principal asks for in an interval, up to
// coalesceDistinct of them; its repeats, and every description past those,
// are counted and filed as one event when the interval ends. No principal
// grows the trail by more than coalesceDistinct+1 events an interval on a
// worker, whatever it asks.

// coalesceEvery is the interval; coalesceDistinct how many distinct
// descriptions of a principal an interval files at once.
const (
	coalesceEvery    = 10 * time.Second
	coalesceDistinct = 16
)

// coalesceKept bounds the distinct actors and digests a summary names.
const coalesceKept = 16

// readOnlyEvents coalesces the events of read-only requests per principal.
type readOnlyEvents struct {
	mu   sync.Mutex
	open map[string]*coalesced
}

// coalesced is one principal's interval.
type coalesced struct {
	until    time.Time
	filed    map[string]bool // the descriptions filed at once
	from, to time.Time
	n        int
	last     *audit.Event
	actors   []string
	digests  []string
	unlisted int // events whose actor or digest is past the coalesceKept listed
	withheld map[string]string
}

// sameDescription is what makes two descriptions one: everything of their
// event but when it was and its id.
func sameDescription(ev *audit.Event) string {
	return fmt.Sprintf("%s\x00%s:%s\x00%v\x00%v\x00%v\x00%v\x00%v", ev.Surface, ev.Actor.Kind, ev.Actor.ID,
		ev.Data["scope"], ev.Data["digest"], ev.Data["withheld"], ev.Data["refused"], ev.Data["reason"])
}

// file reports whether ev is to be filed now: a description its principal
// has not asked for yet in the interval, within coalesceDistinct. Otherwise
// it is counted in the interval's summary.
func (c *readOnlyEvents) file(ev *audit.Event, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		c.open = map[string]*coalesced{}
	}
	key := sameDescription(ev)
	o := c.open[ev.Principal]
	if o == nil || !now.Before(o.until) && o.n == 0 {
		c.open[ev.Principal] = &coalesced{until: now.Add(coalesceEvery), filed: map[string]bool{key: true}}
		return true
	}
	if !o.filed[key] && len(o.filed) < coalesceDistinct {
		o.filed[key] = true
		return true
	}
	if o.n == 0 {
		o.from = now
	}
	o.n++
	o.to, o.last = now, ev
	listed := keep(&o.actors, ev.Actor.Kind+":"+ev.Actor.ID)
	if d, ok := ev.Data["digest"].(string); ok {
		listed = keep(&o.digests, d) && listed
	}
	if !listed {
		o.unlisted++
	}
	if ws, ok := ev.Data["withheld"].([]map[string]any); ok {
		if o.withheld == nil {
			o.withheld = map[string]string{}
		}
		for _, w := range ws {
			id, _ := w["capabilityId"].(string)
			reason, _ := w["reason"].(string)
			o.withheld[id] = reason
		}
	}
	return false
}

// keep adds s to list unless it holds coalesceKept already; it reports
// whether s is listed.
func keep(list *[]string, s string) bool {
	if slices.Contains(*list, s) {
		return true
	}
	if len(*list) >= coalesceKept {
		return false
	}
	*list = append(*list, s)
	return true
}

// due returns the summaries of the intervals ended at now (every one, for
// a zero now), and forgets them.
func (c *readOnlyEvents) due(now time.Time) []*audit.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*audit.Event
	for p, o := range c.open {
		if !now.IsZero() && now.Before(o.until) {
			continue
		}
		delete(c.open, p)
		if o.n == 0 {
			continue
		}
		data := map[string]any{"coalesced": o.n, "from": o.from.UTC().Format(time.RFC3339Nano),
			"to": o.to.UTC().Format(time.RFC3339Nano), "actors": o.actors, "digests": o.digests}
		if o.unlisted > 0 {
			data["unlisted"] = o.unlisted
		}
		if len(o.withheld) > 0 {
			data["withheld"] = o.withheld
		}
		out = append(out, &audit.Event{Type: o.last.Type, Surface: o.last.Surface, Actor: o.last.Actor, Principal: p,
			ExecutionID: envelope.NewExecutionID(), Data: data})
	}
	return out
}

// fileReadOnly files the event of a read-only request, coalesced.
func (w *Worker) fileReadOnly(ev *audit.Event) {
	if w.readOnly.file(ev, w.now()) {
		w.emit(ev)
	}
}

// coalesce files the summaries as their intervals end, and every one left
// when ctx ends.
func (w *Worker) coalesce(ctx context.Context) {
	t := time.NewTicker(coalesceEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.fileCoalesced(time.Time{})
			return
		case <-t.C:
			w.fileCoalesced(w.now())
		}
	}
}

// fileCoalesced files the summaries due at now (all of them for a zero now).
func (w *Worker) fileCoalesced(now time.Time) {
	for _, ev := range w.readOnly.due(now) {
		w.emit(ev)
	}
}
