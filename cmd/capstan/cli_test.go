package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/execution"

	"github.com/nats-io/nats.go"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
)

// printedEnvelope is the envelope as the CLI prints it.
type printedEnvelope struct {
	ExecutionID string `json:"executionId"`
	Status      string `json:"status"`
	Output      any    `json:"output"`
	Error       *struct {
		Code string `json:"code"`
	} `json:"error"`
	Attempts    int    `json:"attempts"`
	FinalizedBy string `json:"finalizedBy"`
}

func TestDev_CallEchoPrintsCompletedEnvelope(t *testing.T) {
	t.Parallel()
	dev, url := startDev(t)

	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"world"}`)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	env := decode[printedEnvelope](t, stdout)
	if env.Status != "completed" || !reflect.DeepEqual(env.Output, map[string]any{"hello": "world"}) {
		t.Fatalf("envelope %+v", env)
	}
	if code := dev.stop(t); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}

// capstan dev prints its ready line once the demo worker serves, and names
// what it serves: a call typed the moment the line shows completes. Started
// again on the store the first run left, whose catalog lists the first run's
// capabilities from the start, it still waits for its own worker, and names
// only what that worker serves (the line used to be printed as soon as the
// catalog listed demo.echo, and to name every capability it listed).
func TestDev_ReadyLineOnceTheDemoWorkerServes(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	for _, run := range []struct {
		flags   []string
		serving string
	}{
		{nil, "serving demo.echo, demo.flaky, demo.report, demo.sleep, email.send, orders.refund\n"},
		{[]string{"--capabilities", "demo.echo"}, "serving demo.echo\n"},
		// "off" turns the MCP bridge off as it does the console.
		{[]string{"--capabilities", "demo.echo", "--mcp", "off"}, "serving demo.echo\n"},
	} {
		port := freePort(t)
		dev := startDaemon(t, "capstan call demo.echo", nil, append([]string{"dev", "--store", store,
			"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--console", "off", "--grace", "5s"}, run.flags...)...)
		url := fmt.Sprintf("nats://127.0.0.1:%d", port)
		stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"at once"}`)
		if code != exitOK {
			t.Fatalf("%v: exit %d, stderr %s", run.flags, code, stderr)
		}
		if env := decode[printedEnvelope](t, stdout); env.Status != "completed" || env.Attempts != 1 {
			t.Fatalf("%v: envelope %+v", run.flags, env)
		}
		if out := dev.out.String(); !strings.Contains(out, run.serving) {
			t.Fatalf("%v: the ready line does not say %q:\n%s", run.flags, run.serving, out)
		}
		if code := dev.stop(t); code != 0 {
			t.Fatalf("%v: dev exited %d after SIGTERM", run.flags, code)
		}
	}
}

// Submitting one execution id again never runs its handler twice: not the
// second `capstan submit` (which the exec stream's dedup window absorbs), nor
// a copy of the request published under another message id while the first
// runs, nor one published after its envelope exists; both copies reach the
// worker, as the stream's emptying shows. The copy that comes while the
// first runs is delivered again a lease later: a 2 s lease, not 30 s.
func TestSubmitTwiceWithOneID_HandlerRunsOnce(t *testing.T) {
	t.Parallel()
	_, url := startDev(t, "--lease", "2s")
	id := envelope.NewExecutionID()
	input := `{"to":"ada@example.com","subject":"hello","holdMs":500}`
	submit := []string{"submit", "email.send", "--id", id, "--input", input}

	for i := 0; i < 2; i++ {
		stdout, stderr, code := capstan(t, url, submit...)
		if code != exitOK || stdout != id+"\n" {
			t.Fatalf("submit %d: exit %d, stdout %q, stderr %s", i+1, code, stdout, stderr)
		}
	}
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	publishCopy(t, js, id, "email.send", input, "while-running")
	first, stderr, code := capstan(t, url, "await", "-o", "json", id)
	if code != exitOK {
		t.Fatalf("await: exit %d, stderr %s", code, stderr)
	}
	publishCopy(t, js, id, "email.send", input, "after-the-envelope")
	waitExecStreamEmpty(t, js)

	second, _, _ := capstan(t, url, "await", "-o", "json", id)
	if first != second {
		t.Fatalf("the awaits differ:\n%s\n%s", first, second)
	}
	if env := decode[printedEnvelope](t, first); env.Status != "completed" || env.Attempts != 1 {
		t.Fatalf("envelope %+v", env)
	}

	stdout, _, code := capstan(t, url, "status", id, "--json")
	if code != exitOK {
		t.Fatalf("status: exit %d", code)
	}
	status := decode[struct {
		Record   execution.Record `json:"record"`
		Envelope printedEnvelope  `json:"envelope"`
	}](t, stdout)
	if status.Record.Attempt != 1 || status.Record.State != execution.StateFinalized || status.Envelope.Attempts != 1 {
		t.Fatalf("status %+v", status)
	}
	if n := handlerCalls(t, js, id); n != 1 {
		t.Fatalf("the handler of execution %s ran %d times, want 1", id, n)
	}
	if n := outboxMessages(t, url, id); n != 1 {
		t.Fatalf("the outbox holds %d emails of execution %s, want 1", n, id)
	}
}

// publishCopy publishes a copy of the request of execution id straight to
// the exec stream, under a message id of its own that the stream's dedup
// window does not know: a second delivery, as a redelivery would be.
func publishCopy(t *testing.T, js jetstream.JetStream, id, capabilityID, input, tag string) {
	t.Helper()
	raw, err := envelope.RawFromJSON([]byte(input))
	if err != nil {
		t.Fatal(err)
	}
	b, err := envelope.Marshal(&envelope.Request{V: envelope.Version, ExecutionID: id, CapabilityID: capabilityID,
		Input: raw, Actor: envelope.Actor{Kind: "user", ID: "test"}, Surface: string(executor.SurfaceDirect),
		SubmittedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(broker.NewNames("").ExecSubject(broker.Anonymous, capabilityID))
	m.Data = b
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(broker.Key(broker.Anonymous, id)+"."+tag)); err != nil {
		t.Fatalf("publish a copy of %s: %v", id, err)
	}
}

// waitExecStreamEmpty waits until the workers have acknowledged every request.
func waitExecStreamEmpty(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	for {
		s, err := js.Stream(ctx, broker.NewNames("").ExecStream())
		if err == nil && s.CachedInfo().State.Msgs == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("requests still unacknowledged: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// handlerCalls counts the demo handler's calls of one execution, from the
// calls stream the demo appends to before every effect.
func handlerCalls(t *testing.T, js jetstream.JetStream, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	calls, err := demo.ReadCalls(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range calls {
		if c.ExecutionID == id {
			n++
		}
	}
	return n
}

// outboxMessages counts the demo outbox messages of one execution.
func outboxMessages(t *testing.T, url, id string) int {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, demo.OutboxStream)
	if err != nil {
		t.Fatal(err)
	}
	state := s.CachedInfo().State
	n := 0
	for seq := state.FirstSeq; seq <= state.LastSeq && state.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(demo.ExecutionIDHeader) == id {
			n++
		}
	}
	return n
}

func TestTwoWorkerProcesses_EachExecutionOneEnvelope(t *testing.T) {
	t.Parallel()
	const executions = 2000
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, "capstan server listening on", nil,
		"server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	workers := []string{"worker-1", "worker-2"}
	for _, id := range workers {
		startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker", "--id", id, "--concurrency", "16")
	}

	c, err := executor.NewClient(connect(t, url), executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reqs := make([]executor.Request, executions)
	for i := range reqs {
		reqs[i] = executor.Request{CapabilityID: "demo.echo", Input: map[string]any{"n": i}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*guard)
	defer cancel()
	envs, errs := c.CallMany(ctx, reqs)

	byWorker := map[string]int{}
	ids := map[string]bool{}
	for i, env := range envs {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if env.Status != envelope.StatusCompleted {
			t.Fatalf("call %d: %s %+v", i, env.Status, env.Error)
		}
		byWorker[env.FinalizedBy]++
		ids[env.ExecutionID] = true
	}
	keys, err := testhooks.Broker(c).Envelopes.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for k := range keys.Keys() {
		if _, id, _ := broker.ParseKey(k); !ids[id] {
			t.Errorf("envelope %s belongs to no call", k)
		}
		stored++
	}
	if stored != executions || len(ids) != executions {
		t.Fatalf("%d envelopes stored for %d distinct executions, want %d", stored, len(ids), executions)
	}
	for _, w := range workers {
		if byWorker[w] == 0 {
			t.Errorf("%s finalized nothing: %v", w, byWorker)
		}
	}
	if byWorker[workers[0]]+byWorker[workers[1]] != executions {
		t.Fatalf("finalized by %v", byWorker)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		s, err := js.Stream(context.Background(), "CAPSTAN_EXEC")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}

	// A wildcard names no capability: what was meant, and where the ids are.
	if _, stderr, _ := capstan(t, url, "call", "orders.*"); !strings.Contains(stderr, `capability id "orders.*" has the character '*'`) ||
		!strings.Contains(stderr, "nothing was submitted") || !strings.Contains(stderr, "'capstan describe'") {
		t.Errorf("call orders.*: %s", stderr)
	}

	// An unknown surface is named, with the ones there are.
	for _, args := range [][]string{{"call", "demo.echo", "--surface", "bogus"}, {"describe", "--surface", "bogus"}} {
		if _, stderr, _ := capstan(t, url, args...); !strings.Contains(stderr, `--surface "bogus": no such surface`) ||
			!strings.Contains(stderr, "want direct, mcp or http") {
			t.Errorf("%v: %s", args, stderr)
		}
	}

	emptyFile := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(emptyFile, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		errCode   string // the printed envelope's error code, if one is printed
		published bool
	}{
		{"unknown capability fails", []string{"call", "nope.nothing"}, exitFailed, "CAPABILITY_NOT_FOUND", true},
		// An id that can never name a capability is a usage error, with no
		// execution id printed that 'capstan status' would not know.
		{"wildcard id is refused unpublished", []string{"call", "orders.*"}, exitUsage, "", false},
		{"empty token is refused unpublished", []string{"call", "a..b"}, exitUsage, "", false},
		{"submit refuses an invalid id", []string{"submit", "orders.>"}, exitUsage, "", false},
		{"broken JSON input is a usage error", []string{"call", "demo.echo", "--input", `{"hello":`}, exitUsage, "", false},
		// An input asked for and not there (a pipe whose writer failed) is
		// not a call without input.
		{"empty stdin is a usage error", []string{"call", "email.send", "--input", "-"}, exitUsage, "", false},
		{"empty input file is a usage error", []string{"submit", "email.send", "--input", "@" + emptyFile}, exitUsage, "", false},
		{"bad actor is a usage error", []string{"call", "demo.echo", "--actor", "alice"}, exitUsage, "", false},
		{"unknown surface is a usage error", []string{"call", "demo.echo", "--surface", "bogus"}, exitUsage, "", false},
		{"submit of an unknown surface is a usage error", []string{"submit", "demo.echo", "--surface", "bogus"}, exitUsage, "", false},
		{"describe of an unknown surface is a usage error", []string{"describe", "--surface", "bogus"}, exitUsage, "", false},
		{"missing capability is a usage error", []string{"call"}, exitUsage, "", false},
		{"a call that outlives its wait", []string{"call", "demo.report", "--input", `{"pages":3,"pageMs":1000}`, "--wait", "500ms"}, exitNoEnvelope, "", true},
		// The id is made as the subtest runs (freshID): its request may be
		// on its way, so it is waited for until it is two seconds old,
		// then asked for again, long before the wait's end.
		{"await of a young id that never arrives says so once it is old enough", []string{"await", freshID, "--wait", "1h"}, exitUnknown, "", false},
		// An id nothing is stored for, made long enough ago not to be on
		// its way: answered at once.
		{"await of an unknown id says so at once", []string{"await", idMadeAgo(t, time.Minute), "--wait", "1h"}, exitUnknown, "", false},
		{"status of an unknown id says so", []string{"status", idMadeAgo(t, time.Minute)}, exitUnknown, "", false},
		{"no server is a connection error", []string{"call", "demo.echo", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))}, exitUsage, "", false},
		{"failing handler exits 1", []string{"call", "demo.flaky", "--input", `{"failTimes":5}`}, exitFailed, "EXECUTION_FAILED", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := lastSeq()
			args := slices.Clone(tc.args)
			if i := slices.Index(args, freshID); i >= 0 {
				args[i] = envelope.NewExecutionID()
			}
			if tc.errCode != "" {
				args = append(args, "-o", "json")
			}
			stdout, stderr, code := capstan(t, url, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %s stderr %s", code, tc.code, stdout, stderr)
			}
			if tc.errCode != "" {
				env := decode[printedEnvelope](t, stdout)
				if env.Status != "failed" || env.Error == nil || env.Error.Code != tc.errCode {
					t.Fatalf("envelope %s", stdout)
				}
			}
			if tc.code != exitOK && stderr == "" && tc.errCode == "" {
				t.Error("nothing on stderr says why")
			}
			if tc.code == exitUsage && stdout != "" {
				t.Errorf("a usage error printed %q", stdout)
			}
			if after := lastSeq(); !tc.published && after != before {
				t.Fatalf("the exec stream moved from %d to %d: the request was published", before, after)
			}
		})
	}
}

func TestCancel_AwaitPrintsCancelledAndExitsOne(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	id := envelope.NewExecutionID()
	if _, stderr, code := capstan(t, url, "submit", "email.send", "--id", id,
		"--input", `{"to":"ada@example.com","subject":"hello","delayMs":60000}`); code != exitOK {
		t.Fatalf("submit: exit %d, stderr %s", code, stderr)
	}
	stdout, stderr, code := capstan(t, url, "cancel", id, "--json")
	if code != exitOK {
		t.Fatalf("cancel: exit %d, stderr %s", code, stderr)
	}
	// The reply may already say finalized: the worker running it stops it as
	// soon as the request arrives, possibly before the cancel is recorded.
	if reply := decode[executor.CancelReply](t, stdout); reply.ExecutionID != id || reply.Error != "" {
		t.Fatalf("cancel reply %+v", reply)
	}
	stdout, _, code = capstan(t, url, "await", "-o", "json", id)
	env := decode[printedEnvelope](t, stdout)
	if code != exitFailed || env.Status != "cancelled" || env.Error == nil || env.Error.Code != "CANCELLED" {
		t.Fatalf("exit %d, envelope %s", code, stdout)
	}
}

// idMadeAgo is a new UUIDv7 execution id whose time is d ago.
// freshID in a test's arguments is replaced by an execution id made as the
// command starts.
const freshID = "<a fresh execution id>"

func idMadeAgo(t *testing.T, d time.Duration) string {
	t.Helper()
	u, err := uuid.Parse(envelope.NewExecutionID())
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(time.Now().Add(-d).UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// version names capstan's version and the Go that built it; a build from a
// checkout says "(devel)", one of a release its tag.
func TestVersion_NamesItselfAndItsGo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		stdout, stderr, code := capstan(t, "", args...)
		if code != exitOK || !strings.HasPrefix(stdout, "capstan ") || !strings.Contains(stdout, runtime.Version()) {
			t.Fatalf("capstan %v: exit %d, %q %q", args, code, stdout, stderr)
		}
	}
	if _, _, code := capstan(t, "", "version", "extra"); code != exitUsage {
		t.Fatalf("version with an argument: exit %d", code)
	}
}
