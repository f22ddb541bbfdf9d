package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
)

// approvalView is an approval as the console shows it.
type approvalView struct {
	*approvals.Record
	// Now is the status as of the page's time.
	Now approvals.Status
	// Shown is what approvers see of the input (RedactApprovalInput's
	// display when the capability has one), indented.
	Shown     string
	Redacted  bool
	Mine      bool
	MayDecide bool
	// V changes whenever what the card shows changes.
	V string
}

func viewApproval(r *approvals.Record, s *session, now time.Time) approvalView {
	v := approvalView{Record: r, Now: r.StatusAt(now), Mine: s.mine(r), MayDecide: s.p.MayDecide(r)}
	shown := r.Input
	if len(r.Display) > 0 {
		shown, v.Redacted = r.Display, true
	}
	v.Shown = prettyJSON(shown)
	v.V = string(v.Now)
	if r.Decision != nil {
		v.V += "/" + r.Decision.DecidedAt.String()
	}
	if r.ConsumedBy != "" {
		v.V += "/" + r.ConsumedBy
	}
	return v
}

// prettyJSON indents JSON text written by a model, with its format
// characters escaped: its bidirectional controls may not reorder what the
// approver reads.
func prettyJSON(raw []byte) string {
	var buf bytes.Buffer
	s := string(raw)
	if json.Indent(&buf, raw, "", "  ") == nil {
		s = buf.String()
	}
	return escapeFormatChars(s)
}

func sameActor(a, b envelope.Actor) bool { return a.Kind == b.Kind && a.ID == b.ID }

type inboxData struct {
	Pending []approvalView
	// Others are pending approvals outside the principal's grants.
	Others  int
	Decided []approvalView
	Now     time.Time
	// Cursor is where this page of pending approvals begins ("" the first);
	// Next where the next one does ("" none).
	Cursor, Next string
}

// recentDecisions is how many decided approvals the inbox shows, and
// inboxPage how many pending ones a page of it holds.
const (
	recentDecisions = 20
	inboxPage       = 50
)

// The first pages the inbox shows: pending approvals, the requesters
// taking turns (one principal's many never hide another's), and the latest
// decided.
var (
	pendingFirst = approvals.ListRequest{Status: approvals.StatusPending, Limit: inboxPage}
	decidedFirst = approvals.ListRequest{Decided: true, Newest: true, Limit: recentDecisions}
)

func (c *Console) inbox(w http.ResponseWriter, r *http.Request, s *session) {
	if !c.mayReadApprovals(w, r, s) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	pendingReq := pendingFirst
	pendingReq.Cursor = r.URL.Query().Get("cursor")
	pending, err := s.approvals.Page(ctx, pendingReq)
	if err != nil {
		c.fail(w, r, s, http.StatusBadGateway, "reading approvals: %v", err)
		return
	}
	decided, err := s.approvals.Page(ctx, decidedFirst)
	if err != nil {
		c.fail(w, r, s, http.StatusBadGateway, "reading approvals: %v", err)
		return
	}
	now := time.Now()
	d := inboxData{Now: now, Cursor: pendingReq.Cursor, Next: pending.Next}
	for _, rec := range append(pending.Records, decided.Records...) {
		v := viewApproval(rec, s, now)
		switch {
		case v.Now == approvals.StatusPending && v.MayDecide:
			d.Pending = append(d.Pending, v)
		case v.Now == approvals.StatusPending:
			d.Others++
		case v.MayDecide || v.Mine:
			if !slices.ContainsFunc(d.Decided, func(o approvalView) bool { return o.ID == v.ID }) {
				d.Decided = append(d.Decided, v)
			}
		}
	}
	slices.SortFunc(d.Decided, func(a, b approvalView) int { return decidedAt(b).Compare(decidedAt(a)) })
	if len(d.Decided) > recentDecisions {
		d.Decided = d.Decided[:recentDecisions]
	}
	c.render(w, r, s, "approvals", d)
}

// mayReadApprovals answers Forbidden, and false, when the session's
// principal may not read approvals.
func (c *Console) mayReadApprovals(w http.ResponseWriter, r *http.Request, s *session) bool {
	if s.approvals == nil {
		c.fail(w, r, s, http.StatusForbidden, "Your principal (%s) may not read approvals: %v", s.p.Name, s.approvalsErr)
		return false
	}
	return true
}

func decidedAt(v approvalView) time.Time {
	if v.Decision != nil {
		return v.Decision.DecidedAt
	}
	if v.Now == approvals.StatusExpired {
		return v.ExpiresAt
	}
	return v.RequestedAt
}

func (c *Console) approval(w http.ResponseWriter, r *http.Request, s *session) {
	if !c.mayReadApprovals(w, r, s) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	rec, err := s.approvals.Get(ctx, r.PathValue("id"))
	if errors.Is(err, approvals.ErrNotFound) {
		c.fail(w, r, s, http.StatusNotFound, "No approval %q: it never existed or its record has expired.", r.PathValue("id"))
		return
	}
	if err != nil {
		c.fail(w, r, s, http.StatusBadGateway, "reading the approval: %v", err)
		return
	}
	c.render(w, r, s, "approval", viewApproval(rec, s, time.Now()))
}

// decide records the signed-in principal's decision and says plainly what
// happened, a refusal included.
func (c *Console) decide(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	approve := r.PostFormValue("decision") == "approve"
	comment := strings.TrimSpace(r.PostFormValue("comment"))
	back := safeNext(r.PostFormValue("next"))
	defer http.Redirect(w, r, back, http.StatusSeeOther)
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if s.approvals == nil {
		s.setFlash("error", "Your principal (%s) may not read approvals, nor decide them.", s.p.Name)
		return
	}
	if rec, err := s.approvals.Get(ctx, id); err == nil && !s.p.MayDecide(rec) {
		s.setFlash("error", "FORBIDDEN: approval %s needs a %s approver; you may decide %s.", shortID(id), strings.Join(rec.Types, " or "), strings.Join(s.p.Types, ", "))
		return
	}
	rec, err := s.decide(ctx, id, approve, comment)
	verb := "Rejected"
	if approve {
		verb = "Approved"
	}
	switch {
	case err == nil:
		s.setFlash("ok", "%s %s for %s (approval %s).", verb, rec.CapabilityID, rec.Actor.String(), shortID(rec.ID))
	case errors.Is(err, audit.ErrUnavailable) && rec != nil:
		s.setFlash("warn", "%s %s, but its audit event was not stored: %v", verb, shortID(rec.ID), err)
	default:
		s.setFlash("error", "%s", decisionRefusal(err, rec, s))
	}
}

// decisionRefusal says why a decision was refused, with its code.
func decisionRefusal(err error, rec *approvals.Record, s *session) string {
	code := approvalstore.Code(err)
	switch {
	case errors.Is(err, approvals.ErrSelfApproval):
		return fmt.Sprintf("%s: you (%s) requested this call; someone else must decide it.", code, s.p.Name)
	case errors.Is(err, approvals.ErrForbidden):
		return fmt.Sprintf("FORBIDDEN: your grant does not cover this approval (%s).", strings.TrimPrefix(err.Error(), "capstan: "))
	case errors.Is(err, approvals.ErrAlreadyDecided) && rec != nil && rec.Decision != nil:
		return fmt.Sprintf("%s: this approval was already %s by %s at %s.", code, rec.Decision.Status, rec.Decision.Approver.String(), rec.Decision.DecidedAt.UTC().Format(time.TimeOnly))
	case errors.Is(err, approvals.ErrAlreadyDecided) && rec != nil:
		return fmt.Sprintf("%s: this approval is already %s.", code, rec.StatusAt(time.Now()))
	case errors.Is(err, approvals.ErrExpired):
		return fmt.Sprintf("%s: this approval expired before it was decided.", code)
	case errors.Is(err, approvals.ErrNotFound):
		return "No such approval: it never existed or its record has expired."
	case code != "":
		return fmt.Sprintf("%s: %v", code, strings.TrimPrefix(err.Error(), "capstan: "))
	}
	return fmt.Sprintf("The decision was not recorded: %v", err)
}

// resume opens the new execution of an approved call, as its requester, and
// shows it.
func (c *Console) resume(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	id, err := s.resume(ctx, r.PathValue("id"))
	if err != nil {
		s.setFlash("error", "Resume refused: %v", strings.TrimPrefix(err.Error(), "capstan: "))
		http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
		return
	}
	s.setFlash("ok", "Resumed approval %s as execution %s.", shortID(r.PathValue("id")), id)
	http.Redirect(w, r, "/executions/"+id, http.StatusSeeOther)
}
