package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// execSummary is one execution as its audit trail tells it.
type execSummary struct {
	ID           string
	CapabilityID string
	Actor        audit.Actor
	// Principal is who sent the request (empty on an open server).
	Principal   string
	Surface     string
	RequestedAt time.Time
	UpdatedAt   time.Time
	// Status is requested, running, retrying, approval-required, completed,
	// failed or cancelled.
	Status     string
	Code       string
	Attempts   int
	Takeovers  int
	ApprovalID string // the approval it asked for, or the one it resumed
	Resumed    bool
}

// V changes whenever the row changes.
func (e *execSummary) V() string {
	return e.ID + "/" + e.Status + "/" + e.UpdatedAt.String()
}

// apply folds one event into the summary.
func (e *execSummary) apply(ev *audit.Event) {
	if e.ID == "" {
		e.ID, e.CapabilityID, e.Actor, e.Surface, e.RequestedAt = ev.ExecutionID, ev.CapabilityID, ev.Actor, ev.Surface, ev.Timestamp
		e.Status = "requested"
	}
	e.UpdatedAt = ev.Timestamp
	switch ev.Type {
	case audit.EventRequested:
		e.Actor, e.Surface, e.RequestedAt, e.Principal = ev.Actor, ev.Surface, ev.Timestamp, ev.Principal
	case audit.EventDenied:
		e.Status, e.Code = "failed", strOf(ev.Data["publicCode"])
	case audit.EventApprovalRequested:
		e.Status, e.ApprovalID = "approval-required", strOf(ev.Data["approvalId"])
	case audit.EventHeld:
		e.Status = "queued" // an operator's pause gave it back to its queue
	case audit.EventLimited:
		if strOf(ev.Data["action"]) == "wait" {
			e.Status = "queued" // given back to its queue until a limit lets it
		}
	case audit.EventStarted:
		e.Status, e.Attempts = "running", max(e.Attempts, intOf(ev.Data["attempt"]))
		if id := strOf(ev.Data["approvalId"]); id != "" {
			e.ApprovalID, e.Resumed = id, true
		}
	case audit.EventRetried:
		e.Status = "retrying"
	case audit.EventTakenOver:
		e.Takeovers++
	case audit.EventCompleted:
		e.Status, e.Code = "completed", ""
		e.Attempts = max(e.Attempts, intOf(ev.Data["attempts"]))
	case audit.EventFailed:
		e.Status, e.Code = "failed", strOf(ev.Data["code"])
		e.Attempts = max(e.Attempts, intOf(ev.Data["attempts"]))
	case audit.EventCancelled:
		e.Status, e.Code = "cancelled", strOf(ev.Data["code"])
	}
}

// execFilter is the executions list's query.
type execFilter struct {
	Capability, Status, Actor, Principal, Since, Cursor string
	since                                               time.Time
}

var sinceChoices = []string{"15m", "1h", "6h", "24h", "7d", "30d"}

func parseExecFilter(q url.Values, now time.Time) execFilter {
	f := execFilter{Capability: strings.TrimSpace(q.Get("capability")), Status: q.Get("status"),
		Actor: strings.TrimSpace(q.Get("actor")), Principal: strings.TrimSpace(q.Get("principal")),
		Since: q.Get("since"), Cursor: q.Get("cursor")}
	if !slices.Contains(sinceChoices, f.Since) {
		f.Since = "" // any time the index keeps
		return f
	}
	d, err := time.ParseDuration(strings.Replace(f.Since, "d", "h", 1))
	if strings.HasSuffix(f.Since, "d") {
		d *= 24
	}
	if err == nil {
		f.since = now.Add(-d)
	}
	return f
}

// request is the filter as the workers' listing takes it.
func (f execFilter) request(limit int) executor.ExecutionsRequest {
	return executor.ExecutionsRequest{Cursor: f.Cursor, Query: audit.Query{CapabilityID: f.Capability, Status: f.Status,
		Actor: f.Actor, Principal: f.Principal, Since: f.since, Limit: limit}}
}

// Query is the filter as a query string, without its cursor: the first
// page's, which the live part fetches.
func (f execFilter) Query() string {
	q := url.Values{}
	for k, v := range map[string]string{"capability": f.Capability, "status": f.Status, "actor": f.Actor,
		"principal": f.Principal, "since": f.Since} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q.Encode()
}

// NextQuery is the query string of the page after one whose cursor is next.
func (f execFilter) NextQuery(next string) string {
	q, _ := url.ParseQuery(f.Query())
	q.Set("cursor", next)
	return q.Encode()
}

// pageSize is how many executions a page of the list shows.
const pageSize = 50

type execListData struct {
	Filter   execFilter
	Rows     []*execSummary
	Next     string
	Scope    string
	Statuses []string
	Since    []string
	// After is the audit stream's last sequence when the list was read, for
	// a session that follows the trail live (admins); 0 otherwise.
	After uint64
}

// Fingerprint changes whenever what the list shows does.
func (d *execListData) Fingerprint() string {
	var b strings.Builder
	for _, r := range d.Rows {
		b.WriteString(r.V())
		b.WriteByte(';')
	}
	sum := sha256.Sum256([]byte(b.String() + d.Next))
	return hex.EncodeToString(sum[:8])
}

// summaryOf is an index entry as the list shows it.
func summaryOf(e audit.Entry) *execSummary {
	return &execSummary{ID: e.ExecutionID, CapabilityID: e.CapabilityID, Actor: e.Actor, Principal: e.Principal,
		Surface: e.Surface, RequestedAt: e.RequestedAt, UpdatedAt: e.UpdatedAt, Status: e.Status, Code: e.Code,
		Attempts: e.Attempts, ApprovalID: e.ApprovalID, Resumed: e.Resumed}
}

// readList reads one page of the filter's executions, newest first.
func readList(ctx context.Context, s *session, f execFilter) (*execListData, error) {
	page, err := s.reads.list(ctx, f.request(pageSize))
	if err != nil {
		return nil, err
	}
	d := &execListData{Filter: f, Next: page.Next, Scope: page.Scope, Statuses: audit.EntryStatuses, Since: sinceChoices}
	for _, e := range page.Entries {
		d.Rows = append(d.Rows, summaryOf(e))
	}
	return d, nil
}

func (c *Console) executions(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if s.reads == nil {
		c.notPermitted(w, r, s, "the executions")
		return
	}
	f := parseExecFilter(r.URL.Query(), time.Now())
	var after uint64
	if b := s.broker(); b != nil {
		if info, err := b.Audit.Info(ctx); err == nil {
			after = info.State.LastSeq // read first: what the list shows is at least this
		}
	}
	d, err := readList(ctx, s, f)
	if err != nil {
		c.fail(w, r, s, readStatus(err), "Reading the executions: %v", err)
		return
	}
	d.After = after
	c.render(w, r, s, "executions", d)
}

// readStatus is the HTTP status of a reading that failed.
func readStatus(err error) int {
	switch {
	case errors.Is(err, executor.ErrNotAllowed):
		return http.StatusForbidden
	case errors.Is(err, executor.ErrNoSuchExecution):
		return http.StatusNotFound
	case errors.Is(err, executor.ErrNoWorkers):
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// step is one event of an execution's timeline.
type step struct {
	audit.Event
	Offset time.Duration
	// Kind groups events for the eye: request, approval, start, retry,
	// takeover, outcome-ok, outcome-bad, note.
	Kind    string
	Title   string
	Details []string
}

// attempt is one attempt of the handler, as the trail tells it.
type attempt struct {
	N        int
	Worker   string
	Started  time.Time
	Ended    time.Time
	Outcome  string
	Takeover bool
}

type execData struct {
	ID       string
	Summary  *execSummary
	Record   *execution.Record
	Envelope *envelope.Envelope
	Steps    []step
	Attempts []attempt
	LastSeq  uint64
	// Approval is the approval it asked for or resumed, as of now, as the
	// principal may see it; Input is what of the input it shows (an
	// approver sees what the capability shows approvers).
	Approval    *approvals.Record
	ApprovalNow approvals.Status
	Input       string
	Redacted    bool
	MayCancel   bool
	Ended       bool
	// Progress is the handler's last report, as of the lease's last
	// renewal, while the execution runs (the page then follows it live).
	Progress *envelope.Progress
	// Log says whether the trail verifies against the audit log's latest
	// checkpoint (nil: not shown to this session, or not ended).
	Log *logCheck
	// Unknown: nothing of it is stored, yet or any more.
	Unknown bool
	// Fingerprint changes whenever what the page shows does.
	Fingerprint string
}

func (c *Console) execution(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if envelope.ValidExecutionID(id) != nil {
		c.fail(w, r, s, http.StatusNotFound, "%q is not an execution id.", id)
		return
	}
	if s.reads == nil {
		c.notPermitted(w, r, s, "executions")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	d, err := loadExecution(ctx, s, id, s.owner(r))
	if errors.Is(err, executor.ErrNoSuchExecution) {
		// Not yet, or no longer: a request just submitted has nothing stored
		// until a worker takes it, so the page waits for it, live.
		status := http.StatusNotFound
		if r.URL.Query().Get("part") != "" {
			status = http.StatusOK
		}
		c.renderStatus(w, r, s, status, "execution", &execData{ID: id, Unknown: true, Fingerprint: "unknown"})
		return
	}
	if err != nil {
		c.fail(w, r, s, readStatus(err), "Reading execution %s: %v", id, err)
		return
	}
	if d.Log = c.checkTrail(ctx, s, d); d.Log != nil {
		d.Fingerprint += "/log-" + d.Log.State
	}
	c.render(w, r, s, "execution", d)
}

func loadExecution(ctx context.Context, s *session, id, owner string) (*execData, error) {
	if s.reads == nil {
		return nil, fmt.Errorf("%w: %v", errNotPermitted, s.clientErr)
	}
	v, err := s.reads.get(ctx, id, owner)
	if err != nil {
		return nil, err
	}
	d := &execData{ID: id, Record: v.Record, Envelope: v.Envelope}
	trail := v.Trail
	d.Summary = &execSummary{Principal: v.Principal}
	for i := range trail {
		d.Summary.apply(&trail[i])
	}
	if d.Summary.ID == "" {
		d.Summary.ID = id
	}
	if d.Summary.CapabilityID == "" {
		switch {
		case v.Envelope != nil:
			d.Summary.CapabilityID = v.Envelope.CapabilityID
		case v.Record != nil:
			d.Summary.CapabilityID = v.Record.CapabilityID
		}
	}
	d.Steps, d.Attempts = timeline(trail)
	if n := len(trail); n > 0 {
		d.LastSeq = trail[n-1].Seq
	}
	for _, a := range v.Approvals {
		if a.ID == d.Summary.ApprovalID || d.Approval == nil {
			d.Approval, d.ApprovalNow = a, a.StatusAt(time.Now())
		}
	}
	if a := d.Approval; a != nil {
		shown := a.Input
		if len(a.Display) > 0 {
			shown, d.Redacted = a.Display, true
		}
		d.Input = prettyJSON(shown)
	}
	d.Ended = d.Envelope != nil
	own := d.Summary.Actor.Kind == s.p.Actor.Kind && d.Summary.Actor.ID == s.p.Actor.ID
	if !s.p.open {
		own = d.Summary.Principal == s.p.Name
	}
	d.MayCancel = !d.Ended && (own || s.p.Admin) && s.client != nil
	d.Fingerprint = fmt.Sprintf("%d/%d/%v/%v", d.LastSeq, len(trail), d.Envelope != nil, d.ApprovalNow)
	if rec := d.Record; rec != nil {
		d.Fingerprint += fmt.Sprintf("/%s%d%v", rec.State, rec.Attempt, rec.CancelRequested)
		if p := rec.Progress; p != nil && !d.Ended {
			d.Progress = p
			d.Fingerprint += fmt.Sprintf("/p%d", p.At.UnixNano())
		}
	}
	return d, nil
}

// timeline turns a trail into steps and attempts.
func timeline(trail []audit.Event) ([]step, []attempt) {
	var steps []step
	var atts []attempt
	end := func(t time.Time, outcome string) {
		if n := len(atts); n > 0 && atts[n-1].Ended.IsZero() {
			atts[n-1].Ended, atts[n-1].Outcome = t, outcome
		}
	}
	takeover := false
	for _, ev := range trail {
		st := step{Event: ev, Kind: "note", Title: ev.Type}
		if len(trail) > 0 {
			st.Offset = ev.Timestamp.Sub(trail[0].Timestamp)
		}
		add := func(label string, key string) {
			if v := strOf(ev.Data[key]); v != "" {
				st.Details = append(st.Details, label+" "+v)
			}
		}
		switch ev.Type {
		case audit.EventRequested:
			st.Kind, st.Title = "request", "requested by "+ev.Actor.Kind+":"+ev.Actor.ID
			if ev.Surface != "" {
				st.Details = append(st.Details, "surface "+ev.Surface)
			}
		case audit.EventDenied:
			st.Kind, st.Title = "outcome-bad", "denied"
			add("code", "publicCode")
			add("reason", "reason")
		case audit.EventApprovalRequested:
			st.Kind, st.Title = "approval", "approval requested"
			add("approval", "approvalId")
			if rs, ok := ev.Data["reasons"].([]any); ok {
				for _, r := range rs {
					st.Details = append(st.Details, "reason: "+strOf(r))
				}
			}
		case audit.EventApproved:
			st.Kind, st.Title = "approval", "approved by "+ev.Actor.Kind+":"+ev.Actor.ID
			add("comment:", "comment")
			add("self-approval:", "selfApproval")
		case audit.EventRejected:
			st.Kind, st.Title = "approval-bad", "rejected by "+ev.Actor.Kind+":"+ev.Actor.ID
			if strOf(ev.Data["status"]) == "cancelled" {
				st.Title = "approval cancelled by " + ev.Actor.Kind + ":" + ev.Actor.ID
			}
			add("comment:", "comment")
		case audit.EventApprovalConsumed:
			st.Kind, st.Title = "approval", "approval consumed"
			add("approval", "approvalId")
		case audit.EventStarted:
			n := intOf(ev.Data["attempt"])
			st.Kind, st.Title = "start", "attempt "+itoa(n)+" started"
			if ev.Worker != "" {
				st.Details = append(st.Details, "worker "+ev.Worker)
			}
			add("resumes approval", "approvalId")
			atts = append(atts, attempt{N: n, Worker: ev.Worker, Started: ev.Timestamp, Takeover: takeover})
			takeover = false
		case audit.EventRetried:
			st.Kind, st.Title = "retry", "retry: attempt "+itoa(intOf(ev.Data["attempt"]))
			add("after", "previousErrorCode")
			if strOf(ev.Data["reason"]) == "reconciled-absent" {
				st.Title += ", the reconciler proved the lost attempt's effect absent"
			}
			end(ev.Timestamp, strOf(ev.Data["previousErrorCode"]))
		case audit.EventTakenOver:
			st.Kind, st.Title = "takeover", "taken over by "+ev.Worker
			add("from worker", "fromWorker")
			add("state", "state")
			end(ev.Timestamp, "WORKER_LOST")
			takeover = true
		case audit.EventCompleted:
			st.Kind, st.Title = "outcome-ok", "completed"
			switch strOf(ev.Data["recovered"]) {
			case envelope.RecoveredByReceipt:
				st.Title = "completed, recovered from attempt " + itoa(intOf(ev.Data["recoveredAttempt"])) + "'s receipt"
				add("receipt sha256", "receiptHash")
			case envelope.RecoveredByReconciler:
				st.Title = "completed, recovered by the reconciler (attempt " + itoa(intOf(ev.Data["recoveredAttempt"])) + ")"
			}
			if ms := intOf(ev.Data["durationMs"]); ms > 0 {
				st.Details = append(st.Details, itoa(ms)+" ms")
			}
			st.Details = append(st.Details, "attempts "+itoa(intOf(ev.Data["attempts"])))
			end(ev.Timestamp, "completed")
		case audit.EventFailed:
			st.Kind, st.Title = "outcome-bad", "failed "+strOf(ev.Data["code"])
			add("stage", "stage")
			if ev.Data["attempts"] != nil {
				st.Details = append(st.Details, "attempts "+itoa(intOf(ev.Data["attempts"])))
			}
			end(ev.Timestamp, strOf(ev.Data["code"]))
		case audit.EventCancelled:
			st.Kind, st.Title = "outcome-bad", "cancelled "+strOf(ev.Data["code"])
			end(ev.Timestamp, strOf(ev.Data["code"]))
		case audit.EventReceiptRecorded:
			st.Kind, st.Title = "note", "receipt recorded by attempt "+itoa(intOf(ev.Data["attempt"]))
			add("sha256", "receiptHash")
		case audit.EventReconciled:
			st.Kind, st.Title = "takeover", "reconciled attempt "+itoa(intOf(ev.Data["attempt"]))+": "+strOf(ev.Data["verdict"])
			add("reason", "reason")
			if ms := intOf(ev.Data["durationMs"]); ms > 0 {
				st.Details = append(st.Details, itoa(ms)+" ms")
			}
			if b, _ := ev.Data["provesAbsence"].(bool); b {
				st.Details = append(st.Details, "proves absence")
			}
		case audit.EventDuplicateDelivery:
			st.Title = "duplicate delivery (acknowledged, not run)"
		case audit.EventEnvelopeConflict:
			st.Kind, st.Title = "takeover", "second finalization refused"
		}
		steps = append(steps, st)
	}
	return steps, atts
}

func itoa(n int) string { return strconv.Itoa(n) }

// cancel asks the workers to cancel an execution, for its owner or an admin.
func (c *Console) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if envelope.ValidExecutionID(id) != nil {
		c.fail(w, r, s, http.StatusNotFound, "%q is not an execution id.", id)
		return
	}
	defer http.Redirect(w, r, "/executions/"+id+"?owner="+s.owner(r), http.StatusSeeOther)
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if s.reads == nil || s.client == nil {
		s.setFlash("error", "Cancel not sent: your principal (%s) may not cancel executions.", s.p.Name)
		return
	}
	d, err := loadExecution(ctx, s, id, s.owner(r))
	if err != nil {
		s.setFlash("error", "Cancel not sent: %v", err)
		return
	}
	if !d.MayCancel {
		if d.Ended {
			s.setFlash("error", "Execution %s has already ended (%s).", shortID(id), d.Envelope.Status)
		} else {
			s.setFlash("error", "FORBIDDEN: only the execution's owner (%s:%s) or an admin may cancel it.", d.Summary.Actor.Kind, d.Summary.Actor.ID)
		}
		return
	}
	reply, err := s.cancel(ctx, id, d.Summary.Principal)
	switch {
	case err != nil:
		s.setFlash("error", "Cancel not confirmed: %v", err)
	case reply.Error != "":
		s.setFlash("error", "Cancel refused: %s", reply.Error)
	case reply.Finalized:
		s.setFlash("ok", "Execution %s has ended: %s.", shortID(id), reply.Status)
	default:
		s.setFlash("ok", "Cancel recorded (the execution was %s); the worker is stopping it.", reply.State)
	}
}
