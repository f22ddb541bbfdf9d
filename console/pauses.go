package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/nats-io/nats.go/jetstream"
)

// Operators' pauses (DESIGN §18) on the capabilities page: what is paused,
// and, for an admin, a form to pause and a button to unpause each. Both go
// through the session's own connection, so only a principal the server lets
// write the pauses bucket (an admin; anyone on an open server) changes
// anything; the audit event is filed under that principal, with the person
// signed in as its actor.

// pausesView is the pauses section of the capabilities page.
type pausesView struct {
	// List is every pause in force; nil with Err when they could not be read.
	List []*pauses.Pause
	Err  string
	// MayPause: the session is an admin's.
	MayPause bool
}

// readPauses reads the pauses in force through the session's connection.
func readPauses(ctx context.Context, s *session) pausesView {
	v := pausesView{MayPause: s.p.Admin}
	js, err := jetstream.New(s.nc)
	if err != nil {
		v.Err = err.Error()
		return v
	}
	kv, err := pauses.Bucket(ctx, js, s.names, false)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return v
	case err != nil:
		v.Err = err.Error()
		return v
	}
	if v.List, err = pauses.List(ctx, s.nc, kv); err != nil {
		v.Err = err.Error()
	}
	return v
}

// pausedFor returns the pauses that stop some calls of capabilityID.
func pausedFor(list []*pauses.Pause, capabilityID string) []*pauses.Pause {
	var out []*pauses.Pause
	for _, p := range list {
		if p.Scope.Capability == "" || p.Scope.Capability == capabilityID {
			out = append(out, p)
		}
	}
	return out
}

// who is the principal and the person a session's change is filed under.
func (s *session) who() (by, operator string) {
	if s.p.open {
		return broker.Anonymous, s.p.Actor.String()
	}
	return s.p.Name, s.p.Actor.ID
}

// pause puts a pause in force from the form, then says what it stopped.
func (c *Console) pause(w http.ResponseWriter, r *http.Request, s *session) {
	defer http.Redirect(w, r, "/capabilities", http.StatusSeeOther)
	if !s.p.Admin {
		s.setFlash("error", "Not paused: only an admin may pause calls.")
		return
	}
	scope := pauses.Scope{Capability: strings.TrimSpace(r.PostFormValue("capability")),
		Principal: strings.TrimSpace(r.PostFormValue("principal")), Actor: strings.TrimSpace(r.PostFormValue("actor"))}
	if scope.Everything() && r.PostFormValue("all") == "" {
		s.setFlash("error", "Not paused: name a capability, a principal or an actor, or tick “everything”.")
		return
	}
	by, operator := s.who()
	p := &pauses.Pause{Scope: scope, Mode: pauses.Hold, Reason: strings.TrimSpace(r.PostFormValue("reason")), By: by,
		Operator: operator, CancelRunning: r.PostFormValue("cancelRunning") != ""}
	if r.PostFormValue("mode") == string(pauses.Refuse) {
		p.Mode = pauses.Refuse
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	ch, err := pauses.Apply(ctx, s.nc, s.names, p)
	if err != nil {
		s.setFlash("error", "Not paused: %v", err)
		return
	}
	replies, _ := oplog.Confirm(ctx, s.nc, s.names, oplog.Pauses, ch.Revision, ch.AuditID, 3*time.Second)
	what := "calls made meanwhile wait in their queue"
	if p.Mode == pauses.Refuse {
		what = "calls made meanwhile end PAUSED"
	}
	msg := fmt.Sprintf("Paused %s: %s; %s.", scope, what, applied(replies))
	if p.CancelRunning {
		n := 0
		for _, r := range replies {
			n += r.Cancelled
		}
		msg += fmt.Sprintf(" %d running attempts cancelled.", n)
	}
	s.setFlash("ok", "%s Unpause it below.", msg)
}

// unpause lifts the pause the form names.
func (c *Console) unpause(w http.ResponseWriter, r *http.Request, s *session) {
	defer http.Redirect(w, r, "/capabilities", http.StatusSeeOther)
	if !s.p.Admin {
		s.setFlash("error", "Not unpaused: only an admin may lift a pause.")
		return
	}
	scope := pauses.Scope{Capability: r.PostFormValue("capability"), Principal: r.PostFormValue("principal"),
		Actor: r.PostFormValue("actor")}
	by, operator := s.who()
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	ch, err := pauses.Lift(ctx, s.nc, s.names, scope, by, operator, strings.TrimSpace(r.PostFormValue("reason")))
	if err != nil {
		s.setFlash("error", "Not unpaused: %v", err)
		return
	}
	replies, _ := oplog.Confirm(ctx, s.nc, s.names, oplog.Pauses, ch.Revision, "", 3*time.Second)
	s.setFlash("ok", "Unpaused %s: the calls it held run now; %s.", scope, applied(replies))
}

// applied says which workers confirmed a change.
func applied(replies []oplog.AppliedReply) string {
	n := 0
	for _, r := range replies {
		if r.Applied {
			n++
		}
	}
	if n == 0 {
		return "no worker answered yet (each applies it as it starts or reconnects)"
	}
	if n == 1 {
		return "applied by 1 worker"
	}
	return fmt.Sprintf("applied by %d workers", n)
}
