package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/pauses"
)

// submitTimeout bounds publishing one request.
const submitTimeout = 10 * time.Second

// requestFlags shape one request; call and submit share them.
type requestFlags struct {
	input, actor, surface, id string
	startWithin               time.Duration
	ifUnserved                string
}

func addRequestFlags(fs *flag.FlagSet) *requestFlags {
	r := &requestFlags{}
	fs.StringVar(&r.input, "input", "", "the input: JSON text, @file, or - for stdin")
	fs.StringVar(&r.actor, "actor", "", "who the call runs for, as kind:id (default user:<principal> with --creds, else user:$USER)")
	fs.StringVar(&r.surface, "surface", string(executor.SurfaceDirect), "the surface the call comes from: direct, mcp or http")
	fs.StringVar(&r.id, "id", "", "the execution id (default a new UUIDv7); submitting one id twice runs it once")
	fs.DurationVar(&r.startWithin, "start-within", 0, "how long the request may wait for a worker to start it (default 24h, less when envelopes are kept less than 25h); past it, it ends NOT_STARTED")
	fs.StringVar(&r.ifUnserved, "if-unserved", "queue", "when no live worker serves the capability: queue (say so at once, exit 7, the request stays queued), refuse (submit nothing, exit 7), or wait")
	return r
}

// parseUnserved reads --if-unserved: "queue", "refuse" or "wait".
func parseUnserved(s string) (executor.Unserved, error) {
	for _, u := range []executor.Unserved{executor.UnservedQueue, executor.UnservedRefuse, executor.UnservedWait} {
		if s == u.String() {
			return u, nil
		}
	}
	return 0, fmt.Errorf("%q: want queue, refuse or wait", s)
}

// surfaces are where a call may come from; a capability is exposed on some.
var surfaces = []executor.Surface{executor.SurfaceDirect, executor.SurfaceMCP, executor.SurfaceHTTP}

// parseSurface reads --surface: one of surfaces. Another would see and call
// nothing, as if no capability existed.
func parseSurface(s string) (executor.Surface, error) {
	if slices.Contains(surfaces, executor.Surface(s)) {
		return executor.Surface(s), nil
	}
	want := make([]string, len(surfaces))
	for i, x := range surfaces {
		want[i] = string(x)
	}
	last := len(want) - 1
	return "", fmt.Errorf("--surface %q: no such surface, so no capability is exposed on it; want %s or %s", s, strings.Join(want[:last], ", "), want[last])
}

// execSubject is where a principal's requests for capID go; an id that can
// never name a capability is refused before it reaches a subject.
func execSubject(capID string) func(string) string {
	return func(p string) string {
		if envelope.ValidCapabilityID(capID) != nil {
			return broker.NewNames("").UnroutedSubject(p)
		}
		return broker.NewNames("").ExecSubject(p, capID)
	}
}

// capabilityArg refuses an id that can never name a capability (a wildcard,
// an empty token) before anything is made or published for it: no execution
// id is printed that no execution has.
func capabilityArg(id string) error {
	if err := envelope.ValidCapabilityID(id); err != nil {
		return fmt.Errorf("%v: nothing was submitted; name one capability exactly, as 'capstan describe' lists them", err)
	}
	return nil
}

// defaultActor is the actor of a call that names none: the principal's user
// with credentials (whose grant then decides), else the shell's user.
func defaultActor(conn *connFlags) string {
	if cr, err := conn.credentials(); err == nil && cr != nil && cr.Principal != "" {
		return envelope.ActorUser + ":" + cr.Principal
	}
	if u := os.Getenv("USER"); u != "" {
		return envelope.ActorUser + ":" + u
	}
	return envelope.ActorUser + ":cli"
}

// request is a request as the flags describe it.
type request struct {
	client executor.ClientConfig
	input  envelope.Raw
	id     string
}

func (r *requestFlags) parse(conn *connFlags) (request, error) {
	if r.actor == "" {
		r.actor = defaultActor(conn)
	}
	kind, id, ok := strings.Cut(r.actor, ":")
	if !ok || kind == "" || id == "" {
		return request{}, fmt.Errorf("--actor %q: want kind:id, e.g. user:alice", r.actor)
	}
	surface, err := parseSurface(r.surface)
	if err != nil {
		return request{}, err
	}
	in, err := readInput(r.input)
	if err != nil {
		return request{}, err
	}
	execID := r.id
	if execID == "" {
		execID = envelope.NewExecutionID()
	}
	if err := envelope.ValidExecutionID(execID); err != nil {
		return request{}, fmt.Errorf("--id: %v", err)
	}
	if r.startWithin < 0 {
		return request{}, errors.New("--start-within must not be negative (0: the default)")
	}
	unserved, err := parseUnserved(r.ifUnserved)
	if err != nil {
		return request{}, fmt.Errorf("--if-unserved %v", err)
	}
	return request{
		client: executor.ClientConfig{Surface: surface, Actor: envelope.Actor{Kind: kind, ID: id},
			StartWithin: r.startWithin, Unserved: unserved},
		input: in,
		id:    execID,
	}, nil
}

// readInput reads --input: JSON text, @file or - for stdin. An empty stdin
// or file is refused: an input asked for and missing (a pipe whose writer
// failed) is not a call without input, which leaves --input out.
func readInput(s string) (envelope.Raw, error) {
	b := []byte(s)
	var err error
	from := ""
	switch {
	case s == "-":
		b, err = io.ReadAll(os.Stdin)
		from = "stdin"
	case strings.HasPrefix(s, "@"):
		b, err = os.ReadFile(s[1:])
		from = s[1:]
	}
	if err != nil {
		return nil, fmt.Errorf("--input: %v", err)
	}
	if from != "" && len(bytes.TrimSpace(b)) == 0 {
		return nil, fmt.Errorf("--input %s: %s is empty; leave --input out for a call without input", s, from)
	}
	raw, err := envelope.RawFromJSON(b)
	if err != nil {
		return nil, fmt.Errorf("--input: %v", err)
	}
	return raw, nil
}

func runCall(args []string) int {
	fs, conn, o := newConnFlags("call", "CAP [--input JSON|@file|-] [--actor kind:id] [--surface S] [--id ID] [--start-within D] [--if-unserved queue|refuse|wait] [--wait D] [--follow] [-o json]")
	rf := addRequestFlags(fs)
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the envelope")
	pf := addProgressFlags(fs)
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	capID := pos[0]
	if err := capabilityArg(capID); err != nil {
		return usageError("%v", err)
	}
	req, err := rf.parse(conn)
	if err != nil {
		return usageError("%v", err)
	}
	if *wait <= 0 {
		return usageError("--wait must be positive")
	}
	if err := conn.need("call "+capID, execSubject(capID), ""); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("call", req.client)
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, interrupted, cancel := waitContext(*wait)
	defer cancel()
	show := newProgressShow(o, pf)
	stopWaiting := waitingFor("the envelope of "+req.id, *wait, show)
	env, err := c.Call(show.context(ctx), capID, req.input, executor.WithID(req.id))
	stopWaiting()
	if err != nil {
		if errors.Is(err, executor.ErrUnserved) {
			return unservedError(err)
		}
		if errors.Is(err, context.DeadlineExceeded) && interrupted() == nil {
			if code, told := whyNoEnvelope(c, principalName(conn), capID, req, *wait); told {
				return code
			}
		}
		return awaitError(err, req.id, *wait, interrupted())
	}
	return printEnvelope(o, env)
}

func runSubmit(args []string) int {
	fs, conn, o := newConnFlags("submit", "CAP [--input JSON|@file|-] [--actor kind:id] [--surface S] [--id ID] [--start-within D] [--if-unserved queue|refuse|wait] [-o json]")
	rf := addRequestFlags(fs)
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	if err := capabilityArg(pos[0]); err != nil {
		return usageError("%v", err)
	}
	req, err := rf.parse(conn)
	if err != nil {
		return usageError("%v", err)
	}
	if err := conn.need("call "+pos[0], execSubject(pos[0]), ""); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("submit", req.client)
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	id, err := c.Submit(ctx, pos[0], req.input, executor.WithID(req.id))
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return fail(exitFailed, "%v", err)
	}
	if errors.Is(err, executor.ErrUnserved) {
		return unservedError(err)
	}
	if err != nil {
		return usageError("%v", err)
	}
	if req.client.Unserved == executor.UnservedQueue {
		// Stored: it waits for a worker, and the person is told there is none.
		var u *executor.UnservedError
		if errors.As(c.Serving(ctx, pos[0]), &u) {
			u.ExecutionID, u.Queued = id, true
			fmt.Fprintf(os.Stderr, "capstan: warning: %s\n", strings.TrimPrefix(u.Error(), "capstan: "))
		}
	}
	// For a person, the id alone on stdout (what a script captures too) and
	// what to do with it on a terminal's stderr.
	return o.print(map[string]string{"executionId": id}, func(w io.Writer, st style) {
		fmt.Fprintln(w, id)
		if isTerminal(os.Stderr) {
			fmt.Fprintf(os.Stderr, "%s\n", st.dim("submitted; 'capstan await "+id+"' waits for its end, 'capstan status "+id+"' shows where it is"))
		}
	})
}

func runAwait(args []string) int {
	fs, conn, o := newConnFlags("await", "ID [--wait D] [--follow] [-o json]")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the envelope")
	pf := addProgressFlags(fs)
	id, code, ok := parseExecutionID(fs, args, o)
	if !ok {
		return code
	}
	if *wait <= 0 {
		return usageError("--wait must be positive")
	}
	if err := conn.need("await results", directGet(names.EnvelopesBucket()),
		"an approver reads the outcome of the executions behind its approvals with 'capstan status ID'"); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("await", executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, interrupted, cancel := waitContext(*wait)
	defer cancel()
	if id, err = resolveExecution(ctx, c.Conn(), conn, id); err != nil {
		return usageError("%v", err)
	}
	show := newProgressShow(o, pf)
	stopWaiting := waitingFor("the envelope of "+id, *wait, show)
	env, err := c.Await(show.context(ctx), id)
	stopWaiting()
	if err != nil {
		return awaitError(err, id, *wait, interrupted())
	}
	return printEnvelope(o, env)
}

// unservedError reports a call no live worker serves: what to start, and
// what became of the request (queued: 'capstan await ID' waits for it).
func unservedError(err error) int {
	var u *executor.UnservedError
	if errors.As(err, &u) && u.Queued {
		return fail(exitUnserved, "%v; 'capstan await %s' waits for it, 'capstan cancel %s' withdraws it", err, u.ExecutionID, u.ExecutionID)
	}
	return fail(exitUnserved, "%v", err)
}

// expiredError reports an execution whose envelope is no longer kept.
func expiredError(err error, id string) int {
	return fail(exitExpired, "%v: it will never be answered; its audit trail may still hold it: 'capstan audit %s'", err, id)
}

// whyNoEnvelope tells a call that got no envelope within wait why, when the
// deployment says: a pause holds its capability, or no live worker serves
// it any more (the one that served it when it was sent was lost). told is
// false when neither is so, or it cannot tell.
func whyNoEnvelope(c *executor.Client, principal, capID string, req request, wait time.Duration) (code int, told bool) {
	if p := heldBy(c.Conn(), principal, capID, req.client.Actor); p != nil {
		return fail(exitNoEnvelope, "no envelope for %s within %v: %s is paused (by %s %s ago: %q); the call waits in its queue until 'capstan unpause %s --reason TEXT' (an admin's) lifts the pause; 'capstan await %s' waits again",
			req.id, wait, p.Scope, p.By, time.Since(p.At).Round(time.Second), p.Reason, p.Scope.Flags(), req.id), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var u *executor.UnservedError
	if !errors.As(c.Serving(ctx, capID), &u) {
		return 0, false
	}
	u.ExecutionID, u.Queued = req.id, true
	return fail(exitUnserved, "no envelope for %s within %v: %s; 'capstan await %s' waits for it, 'capstan cancel %s' withdraws it",
		req.id, wait, strings.TrimPrefix(u.Error(), "capstan: "), req.id, req.id), true
}

// heldBy returns the pause that holds a call of capabilityID, when the
// caller may read the pauses: a call that got no envelope in time because an
// operator paused it is told why. Nil when none does, or it cannot tell.
func heldBy(nc *nats.Conn, principal, capabilityID string, actor envelope.Actor) *pauses.Pause {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil
	}
	kv, err := pauses.Bucket(ctx, js, names, false)
	if err != nil {
		return nil
	}
	list, _ := pauses.List(ctx, nc, kv) // the pauses honoured, whatever else the bucket holds
	return pauses.NewSet(list).Match(principal, capabilityID, actor)
}

// waitContext ends after wait, or at SIGINT or SIGTERM (a second one ends
// the process), which interrupted then returns (nil: none came).
func waitContext(wait time.Duration) (ctx context.Context, interrupted func() os.Signal, cancel context.CancelFunc) {
	sig, stop := signalContext()
	ctx, cancelWait := context.WithTimeout(sig, wait)
	return ctx, func() os.Signal { return signalOf(sig) }, func() { cancelWait(); stop() }
}

// awaitError reports a call or await that ended without an envelope; one
// a signal interrupted is told the execution goes on, and how to find it.
func awaitError(err error, id string, wait time.Duration, interrupted os.Signal) int {
	if interrupted != nil {
		code := exitInterrupted
		if interrupted == syscall.SIGTERM {
			code = exitTerminated
		}
		return fail(code, "interrupted: stopped waiting; execution %s goes on unless it was never submitted: 'capstan await %s' waits again, 'capstan cancel %s' stops it", id, id, id)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fail(exitNoEnvelope, "no envelope for %s within %v; 'capstan await %s' waits again", id, wait, id)
	}
	if errors.Is(err, executor.ErrExpired) {
		return expiredError(err, id)
	}
	if errors.Is(err, executor.ErrNoSuchExecution) {
		return fail(exitUnknown, "%v", err)
	}
	return usageError("%v", err)
}
