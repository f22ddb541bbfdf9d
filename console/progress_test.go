package console_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
)

// progressEvent is a progress event's data, as the page's script reads it.
type progressEvent struct {
	Attempt int     `json:"attempt"`
	Done    float64 `json:"done"`
	Total   float64 `json:"total"`
	Text    string  `json:"text"`
	At      string  `json:"at"`
}

// nextProgress reads a live stream until its next progress event.
func nextProgress(t *testing.T, lines <-chan string) progressEvent {
	t.Helper()
	waitFor(t, lines, "event: progress")
	ctx := testCtx(t)
	select {
	case l, ok := <-lines:
		if !ok || !strings.HasPrefix(l, "data: ") {
			t.Fatalf("a progress event without its data: %q", l)
		}
		var p progressEvent
		if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &p); err != nil {
			t.Fatalf("progress data %q: %v", l, err)
		}
		return p
	case <-ctx.Done():
		t.Fatal("no data after a progress event")
	}
	return progressEvent{}
}

// An execution's page shows how far its handler has got, live: the stream
// of its page carries each report the worker publishes, which the page's
// script shows in the progress card; once the execution has ended, the page
// shows its outcome and no progress.
func TestExecutionPage_ShowsItsHandlersProgressLive(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	ctx := testCtx(t)
	id, err := r.client.Submit(ctx, "demo.report", demo.ReportInput{Pages: 2000, PageMs: 20}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	w := signInOpen(t, r.base, "user:ops", "")
	page := w.waitPage("/executions/"+id, `id="exec-progress"`)
	contains(t, "the running report's page", page, `<progress id="exec-progress-bar"`)

	lines, closeFn := openStream(t, w, "/live/executions/"+id+"?after=0")
	defer closeFn()
	first := nextProgress(t, lines)
	second := nextProgress(t, lines)
	for _, p := range []progressEvent{first, second} {
		if p.Attempt != 1 || p.Total != 2000 || !strings.Contains(p.Text, "of 2000 rendered") || p.At == "" {
			t.Fatalf("progress event %+v", p)
		}
	}
	if second.Done < first.Done {
		t.Fatalf("progress went back: %v then %v", first.Done, second.Done)
	}

	// A report some other process forged on an open server (which keeps no
	// one out) reaches the page as one line of text in JSON, which the
	// script shows as text. Its execution reports once, then only every ten
	// seconds: the forged report is not folded into a real one.
	slow, err := r.client.Submit(ctx, "demo.report", demo.ReportInput{Pages: 3, PageMs: 10_000}, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	w.waitPage("/executions/"+slow, `id="exec-progress"`)
	slowLines, closeSlow := openStream(t, w, "/live/executions/"+slow+"?after=0")
	defer closeSlow()
	forged, _ := envelope.Marshal(&envelope.Progress{V: envelope.Version, ExecutionID: slow, Attempt: 1, Done: 0.5, Total: 3,
		Message: "<script>alert(1)</script>\x1b]0;title\x07\nnext line"})
	nc, err := nats.Connect(r.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Published until the page shows it: the console's subscription may
	// reach the server after the first publish.
	seen := make(chan struct{})
	defer close(seen)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = nc.Publish("capstan.progress."+"_anon."+slow, forged)
			select {
			case <-seen:
				return
			case <-tick.C:
			}
		}
	}()
	for {
		p := nextProgress(t, slowLines)
		if p.Done != 0.5 {
			continue
		}
		if strings.ContainsAny(p.Text, "\x1b\x07\n") || !strings.Contains(p.Text, "<script>") {
			t.Fatalf("forged report shown as %q", p.Text)
		}
		break
	}
	if _, err := r.client.Cancel(ctx, slow); err != nil {
		t.Fatal(err)
	}

	if _, err := r.client.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	env, err := r.client.Await(ctx, id)
	if err != nil || env.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, env)
	}
	page = w.waitPage("/executions/"+id, `id="envelope"`)
	if strings.Contains(page, `id="exec-progress"`) {
		t.Fatal("an ended execution's page still shows its progress")
	}
}

// Under authentication a producer's page follows its own executions'
// progress, with its own credentials, and so does an admin's; an
// approver's page of the same execution receives none of it.
func TestExecutionPage_ProgressReachesItsPrincipalAlone(t *testing.T) {
	t.Parallel()
	env, setup := secured(t)
	workerCreds := setup.CredsPath(auth.WorkerPrincipal)
	r := startRig(t, env.URL, console.Config{},
		nats.UserCredentials(workerCreds), nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(auth.WorkerPrincipal)))
	alice, err := executor.NewClient(env.ConnectAs(t, "alice"), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	ctx := testCtx(t)
	id, err := alice.Submit(ctx, "demo.report", demo.ReportInput{Pages: 2000, PageMs: 20}, executor.As(aliceActor))
	if err != nil {
		t.Fatal(err)
	}

	signIn := func(principal string) *web {
		w := newWeb(t, r.base)
		if _, path, body := w.post("/signin", url.Values{"creds": {credsOf(t, setup, principal)}, "next": {"/executions"}}); path == "/signin" {
			t.Fatalf("%s's sign-in failed:\n%s", principal, body)
		}
		return w
	}
	aliceWeb, bobWeb := signIn("alice"), signIn("bob")
	aliceWeb.waitPage("/executions/"+id, `id="exec-progress"`)
	bobLines, closeBob := openStream(t, bobWeb, "/live/executions/"+id+"?after=0&owner=alice")
	defer closeBob()
	aliceLines, closeAlice := openStream(t, aliceWeb, "/live/executions/"+id+"?after=0&owner=alice")
	defer closeAlice()
	for range 3 {
		if p := nextProgress(t, aliceLines); p.Total != 2000 || !strings.Contains(p.Text, "rendered") {
			t.Fatalf("alice's progress: %+v", p)
		}
	}
	adminLines, closeAdmin := openStream(t, signIn(auth.AdminPrincipal), "/live/executions/"+id+"?after=0&owner=alice")
	defer closeAdmin()
	if p := nextProgress(t, adminLines); p.Total != 2000 || !strings.Contains(p.Text, "rendered") {
		t.Fatalf("the admin's page of alice's execution: %+v", p)
	}
	// While alice's page received three reports and the admin's one, bob's
	// received none.
	for {
		select {
		case l, ok := <-bobLines:
			if ok && strings.Contains(l, "progress") {
				t.Fatalf("bob's page of alice's execution received %q", l)
			}
			if ok {
				continue
			}
		default:
		}
		break
	}
	if _, err := alice.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	if e, err := alice.Await(ctx, id); err != nil || e.Status != envelope.StatusCancelled {
		t.Fatalf("%v %+v", err, e)
	}
}
