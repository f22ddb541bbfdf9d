package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
)

// The operators' emergency stop (DESIGN §18): pause, unpause, pauses. Only
// an admin may write the pauses bucket; the server refuses anyone else, and
// the command says so before it sends anything.

// scopeFlags are what a pause or an unpause names.
type scopeFlags struct {
	principal, actor, reason string
	all                      bool
}

func addScopeFlags(fs *flag.FlagSet, verb string) *scopeFlags {
	s := &scopeFlags{}
	fs.StringVar(&s.principal, "principal", "", verb+" the calls of this `principal` (with a capability: of it alone)")
	fs.StringVar(&s.actor, "actor", "", verb+" the calls made as this actor, `kind:id` (user:alice, agent:refund-bot)")
	fs.BoolVar(&s.all, "all", false, verb+" every call of the deployment")
	fs.StringVar(&s.reason, "reason", "", "why, in words: on the trail (required)")
	return s
}

// scope is what the positional capability and the flags name; exactly one
// of a scope and --all.
func (s *scopeFlags) scope(pos []string) (pauses.Scope, error) {
	sc := pauses.Scope{Principal: s.principal, Actor: s.actor}
	if len(pos) > 1 {
		return sc, fmt.Errorf("want one capability, got %d: %s", len(pos), strings.Join(pos, " "))
	}
	if len(pos) == 1 {
		sc.Capability = pos[0]
	}
	switch {
	case s.all && !sc.Everything():
		return sc, errors.New("--all is everything: name no capability, principal or actor with it")
	case !s.all && sc.Everything():
		return sc, errors.New("say what: a capability, --principal, --actor, or --all for every call")
	}
	if strings.TrimSpace(s.reason) == "" {
		return sc, errors.New("say why: --reason TEXT (it goes on the trail, and to every caller a pause refuses)")
	}
	return sc, sc.Validate()
}

// operator is the person at the keyboard, as the shell names them.
func operator() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return os.Getenv("USERNAME")
}

// principalName is who the credentials name (the anonymous principal of an
// open server without them).
func principalName(conn *connFlags) string {
	if p := conn.principal(); p.known() {
		return p.name
	}
	return broker.Anonymous
}

// needAdmin refuses, before anything is sent, credentials that may not
// write the pauses bucket.
func needAdmin(conn *connFlags, right, bucket string) error {
	return conn.need(right, func(string) string { return "$KV." + bucket + ".all" }, "only an admin may")
}

// scopeChange is a pause or an unpause about to be made: the scope its
// arguments name, and an admin's connection, with time for the workers'
// confirmations; done closes it.
type scopeChange struct {
	scope pauses.Scope
	js    jetstream.JetStream
	nc    *nats.Conn
	ctx   context.Context
	done  func()
}

// open parses the arguments of a pause or an unpause (the command fs
// names), checks that an admin makes the change, then connects it; without
// ok the command ends with code.
func (s *scopeFlags) open(fs *flag.FlagSet, args []string, conn *connFlags, o *outputFlags) (c scopeChange, code int, ok bool) {
	command := fs.Name()
	pos, code, ok := parseOutput(fs, args, -1, o)
	if !ok {
		return c, code, false
	}
	var err error
	if c.scope, err = s.scope(pos); err != nil {
		return c, usageError("%s: %v", command, err), false
	}
	if err := needAdmin(conn, command+" calls", names.PausesBucket()); err != nil {
		return c, usageError("%v", err), false
	}
	if c.js, c.ctx, c.done, err = conn.openJS(command, submitTimeout+confirmWait); err != nil {
		return c, usageError("%v", err), false
	}
	c.nc = c.js.Conn()
	return c, exitOK, true
}

// pauseAnswer is what pause and unpause print with -o json.
type pauseAnswer struct {
	*pauses.Change
	// By is the principal that made the change.
	By string `json:"by"`
	// Workers are the workers that confirmed the change.
	Workers []oplog.AppliedReply `json:"workers"`
	// Undo is the command that undoes it.
	Undo string `json:"undo"`
}

// cancels reports whether the change is a pause that cancels what runs.
func (a *pauseAnswer) cancels() bool { return a.Pause.CancelRunning && a.Pause.AuditID == a.AuditID }

// confirmWait is how long pause and unpause wait for the workers'
// confirmations: as long as every worker takes to answer.
const confirmWait = oplog.ConfirmWithin

func runPause(args []string) int {
	fs, conn, o := newConnFlags("pause", "[CAPABILITY] [--principal P] [--actor KIND:ID] [--all] --reason TEXT [--refuse] [--cancel-running]")
	sf := addScopeFlags(fs, "pause")
	refuse := fs.Bool("refuse", false, "end the calls made meanwhile at once, PAUSED with the reason (default: hold them in their queue until unpaused)")
	cancelRunning := fs.Bool("cancel-running", false, "also cancel the attempts running now, as their callers' cancels do")
	c, code, ok := sf.open(fs, args, conn, o)
	if !ok {
		return code
	}
	defer c.done()
	p := &pauses.Pause{Scope: c.scope, Mode: pauses.Hold, Reason: sf.reason, By: principalName(conn), Operator: operator(),
		CancelRunning: *cancelRunning}
	if *refuse {
		p.Mode = pauses.Refuse
	}
	ch, err := pauses.Apply(c.ctx, c.nc, names, p)
	if err != nil {
		return fail(exitFailed, "pause %s: %v", c.scope, err)
	}
	if c.scope.Capability != "" && !inCatalog(c.ctx, c.js, c.scope.Capability) {
		// A typo stops nothing: say so, loudly, rather than let a pause of
		// nothing look like a stop.
		fmt.Fprintf(os.Stderr, "capstan pause: warning: no worker serves %s (the catalog does not list it): this pause stops nothing until one does; check the id ('capstan describe' lists them)\n",
			c.scope.Capability)
	}
	answer := c.confirm(ch, p.By, "capstan unpause "+c.scope.Flags()+" --reason TEXT")
	return o.print(answer, func(w io.Writer, st style) { writePaused(w, st, answer) })
}

func runUnpause(args []string) int {
	fs, conn, o := newConnFlags("unpause", "[CAPABILITY] [--principal P] [--actor KIND:ID] [--all] --reason TEXT")
	sf := addScopeFlags(fs, "unpause")
	c, code, ok := sf.open(fs, args, conn, o)
	if !ok {
		return code
	}
	defer c.done()
	ch, err := pauses.Lift(c.ctx, c.nc, names, c.scope, principalName(conn), operator(), sf.reason)
	if errors.Is(err, pauses.ErrNotPaused) {
		return fail(exitFailed, "unpause: nothing is paused for %s; 'capstan pauses' lists what is", c.scope)
	}
	if err != nil {
		return fail(exitFailed, "unpause %s: %v", c.scope, err)
	}
	redo := "capstan pause " + c.scope.Flags() + " --reason TEXT"
	if ch.Pause.Mode == pauses.Refuse {
		redo += " --refuse"
	}
	answer := c.confirm(ch, principalName(conn), redo)
	return o.print(answer, func(w io.Writer, st style) { writeUnpaused(w, st, answer) })
}

// confirm gathers the workers' confirmations of the change made, ch.
func (c scopeChange) confirm(ch *pauses.Change, by, undo string) *pauseAnswer {
	a := &pauseAnswer{Change: ch, By: by, Undo: undo}
	auditID := ""
	if a.cancels() {
		auditID = ch.AuditID
	}
	stop := waiting("the workers' confirmations", confirmWait)
	a.Workers, _ = oplog.Confirm(c.ctx, c.nc, names, oplog.Pauses, ch.Revision, auditID, confirmWait)
	stop()
	if a.Workers == nil {
		a.Workers = []oplog.AppliedReply{}
	}
	return a
}

// workersLine says which workers applied the change.
func workersLine(w io.Writer, a *pauseAnswer) {
	var ok, late []string
	cancelled := 0
	for _, r := range a.Workers {
		if r.Applied {
			ok = append(ok, r.Worker)
		} else {
			late = append(late, r.Worker)
		}
		cancelled += r.Cancelled
	}
	switch {
	case len(a.Workers) == 0:
		fmt.Fprintf(w, "  No worker answered within %v: the change is in the bucket, and every worker applies it as it (re)connects or starts.\n", confirmWait)
	default:
		fmt.Fprintf(w, "  Applied by %s: %s.\n", plural(len(ok), "worker", "workers"), strings.Join(ok, ", "))
	}
	if len(late) > 0 {
		fmt.Fprintf(w, "  Not yet applied by %s (%s): it applies it as soon as its copy catches up.\n", strings.Join(late, ", "),
			plural(len(late), "worker", "workers"))
	}
	if a.cancels() {
		fmt.Fprintf(w, "  Cancelled %s, as their callers' cancels would.\n", plural(cancelled, "running attempt", "running attempts"))
	}
}

func writePaused(w io.Writer, st style, a *pauseAnswer) {
	p := a.Pause
	fmt.Fprintf(w, "%s %s.\n", st.bold("Paused:"), describeScope(p.Scope))
	if p.Mode == pauses.Refuse {
		fmt.Fprintln(w, "  Calls made meanwhile end at once, failed PAUSED, with the reason (the model sees it).")
	} else {
		fmt.Fprintln(w, "  Calls made meanwhile wait in their queue (keeping their start deadline) and run once it is unpaused.")
	}
	if !p.CancelRunning {
		fmt.Fprintln(w, "  Attempts already running go on (--cancel-running would have cancelled them).")
	}
	fmt.Fprintf(w, "  Reason: %s\n", p.Reason)
	fmt.Fprintf(w, "  By %s, %s; on the trail: capstan audit %s --owner %s\n", who(p.By, p.Operator), p.At.Format(time.RFC3339), a.AuditID, p.By)
	if r := a.Replaced; r != nil {
		fmt.Fprintf(w, "  It replaces the pause of %s (%s, since %s: %s).\n", r.Scope, r.Mode, r.At.Format(time.RFC3339), r.Reason)
	}
	workersLine(w, a)
	fmt.Fprintf(w, "%s %s\n", st.bold("Undo:"), a.Undo)
}

func writeUnpaused(w io.Writer, st style, a *pauseAnswer) {
	p := a.Pause
	fmt.Fprintf(w, "%s %s.\n", st.bold("Unpaused:"), describeScope(p.Scope))
	if !p.At.IsZero() {
		fmt.Fprintf(w, "  It was paused (%s) for %s by %s: %s\n", p.Mode, short(time.Since(p.At)), who(p.By, p.Operator), p.Reason)
	}
	if p.Mode != pauses.Refuse {
		fmt.Fprintln(w, "  The calls it held run now, each within a few seconds, unless their start deadline passed.")
	}
	fmt.Fprintf(w, "  On the trail: capstan audit %s --owner %s\n", a.AuditID, a.By)
	workersLine(w, a)
	fmt.Fprintf(w, "%s %s\n", st.bold("Pause again:"), a.Undo)
}

// describeScope says a scope in full for a person.
func describeScope(s pauses.Scope) string {
	if s.Everything() {
		return "every call of the deployment (every capability, principal and actor)"
	}
	out := s.Capability
	if out == "" {
		out = "every capability"
	}
	if s.Principal != "" {
		out += ", called by principal " + s.Principal
	} else {
		out += ", whoever calls it"
	}
	if s.Actor != "" {
		out += ", as actor " + s.Actor
	}
	return out
}

func who(by, operator string) string {
	if operator == "" || operator == by {
		return by
	}
	return by + " (" + operator + ")"
}

// runPauses lists the pauses in force.
func runPauses(args []string) int {
	fs, conn, o := newConnFlags("pauses", "[-o json]")
	js, ctx, done, code := conn.readBuckets("pauses", fs, args, o)
	if done == nil {
		return code
	}
	defer done()
	var list []*pauses.Pause
	kv, err := unlessAbsent(pauses.Bucket(ctx, js, names, false))
	if err == nil && kv != nil {
		list, err = pauses.List(ctx, js.Conn(), kv)
	}
	if errors.Is(err, pauses.ErrIgnored) {
		// Said, and the pauses in force listed all the same.
		fmt.Fprintf(os.Stderr, "capstan pauses: warning: %v\n", err)
	} else if err != nil {
		return fail(exitFailed, "read the pauses: %v (an admin's command)", err)
	}
	if list == nil {
		list = []*pauses.Pause{}
	}
	return o.print(list, func(w io.Writer, st style) { writePauses(w, st, list) })
}

func writePauses(w io.Writer, st style, list []*pauses.Pause) {
	if len(list) == 0 {
		fmt.Fprintln(w, "Nothing is paused.")
		return
	}
	t := newTable(w, st, "PAUSED", "MODE", "SINCE", "BY", "REASON", "UNDO")
	for _, p := range list {
		t.row(p.Scope.String(), string(p.Mode), ago(st.now, p.At), who(p.By, p.Operator), clip(p.Reason, 60),
			"capstan unpause "+p.Scope.Flags()+" --reason TEXT")
	}
	t.flush()
}

// inCatalog reports whether the catalog lists capabilityID (true when the
// catalog cannot be read: the warning is for a typo, not for a doubt).
func inCatalog(ctx context.Context, js jetstream.JetStream, capabilityID string) bool {
	kv, err := js.KeyValue(ctx, names.CatalogBucket())
	if err != nil {
		return true
	}
	_, err = kv.Get(ctx, capabilityID)
	return !errors.Is(err, jetstream.ErrKeyNotFound)
}
