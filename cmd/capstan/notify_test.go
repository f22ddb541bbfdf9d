package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/notifier"
	"github.com/capstan-dev/capstan/internal/notifystatus"
	"github.com/capstan-dev/capstan/notify"
)

// hookDelivery is one POST the test's receiver got.
type hookDelivery struct {
	key      string
	verified error
	payload  notify.Payload
}

// hookReceiver is a webhook receiver on loopback. While hang is set, it
// holds every request it gets until its client goes away.
type hookReceiver struct {
	url    string
	secret string

	mu   sync.Mutex
	got  []hookDelivery
	hang bool
}

func startHookReceiver(t *testing.T, secret string) *hookReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hookReceiver{url: "http://" + l.Addr().String() + "/hooks/finance/tok-7f3a9c", secret: secret}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d := hookDelivery{key: r.Header.Get(notify.IdempotencyHeader),
			verified: notify.Verify([]byte(secret), r.Header.Get(notify.SignatureHeader), body, time.Now(), 0)}
		_ = json.Unmarshal(body, &d.payload)
		h.mu.Lock()
		h.got = append(h.got, d)
		hang := h.hang
		h.mu.Unlock()
		if hang {
			<-r.Context().Done() // the notifier is killed while it waits
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h
}

func (h *hookReceiver) deliveries() []hookDelivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookDelivery(nil), h.got...)
}

func (h *hookReceiver) waitFor(t *testing.T, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for {
		count := 0
		for _, d := range h.deliveries() {
			if d.key == key {
				count++
			}
		}
		if count >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries of %s, want %d: %+v", count, key, n, h.deliveries())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A capstan notify process killed (SIGKILL) while its receiver holds the
// request's notification is restarted: the notification arrives again,
// with the same idempotency key, and nothing else is sent twice. The
// notifier runs with its own least-privilege credentials; its output, its
// status and its metrics hold no secret.
func TestNotify_KilledMidDelivery_RestartedSendsItAgainWithTheSameKey(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "orders.refund"},
		{"auth", "add", dir, "carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
		{"auth", "add", dir, "notifier", "--role", "notifier"},
	} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	port := freePort(t)
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--console", "off", "--grace", "5s")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	creds := func(p string) string { return "--creds=" + filepath.Join(dir, p+".creds") }

	const secret = "whsec-finance-5b1d0c2e9a"
	hook := startHookReceiver(t, secret)
	config := filepath.Join(t.TempDir(), "notify.json")
	doc := fmt.Sprintf(`{"consoleUrl": "https://capstan.example.com", "retry": {"attempts": 5, "initial": "50ms", "max": "200ms"},
		"channels": [{"name": "finance-hook", "kind": "webhook", "types": ["finance"], "url": %q, "secretEnv": "FINANCE_HOOK_SECRET"}]}`, hook.url)
	if err := os.WriteFile(config, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"CAPSTAN_NATS_URL=" + url, "FINANCE_HOOK_SECRET=" + secret}

	// Refused: a configuration others may read; a notifier without its
	// consumer, which its credentials may not create.
	_, stderr, code := capstanEnv(t, env, "notify", "--config", config, creds("notifier"))
	if code != exitUsage || !strings.Contains(stderr, "chmod 600") {
		t.Fatalf("a 0644 configuration: exit %d: %s", code, stderr)
	}
	if err := os.Chmod(config, 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = capstanEnv(t, env, "notify", "--config", config, creds("notifier"))
	if code != exitUsage || !strings.Contains(stderr, "capstan notify --init") {
		t.Fatalf("no consumer: exit %d: %s", code, stderr)
	}
	if _, stderr, code := capstanEnv(t, env, "notify", "--init", "--config", config, creds("notifier")); code == exitOK {
		t.Fatalf("the notifier created its own consumer: %s", stderr)
	}
	// The consumer as --init makes it, with a short AckWait (an operator's
	// `nats consumer edit`) so that the killed notifier's delivery comes back
	// within the test; --init then accepts it as it is.
	js, err := jetstream.New(connectAs(t, url, filepath.Join(dir, "admin.creds")))
	if err != nil {
		t.Fatal(err)
	}
	names := broker.NewNames("")
	ccfg := jetstream.ConsumerConfig{Durable: names.NotifyConsumer("finance-hook"), AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 2 * time.Second, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubject: "$KV." + names.ApprovalsBucket() + ".>"}
	if _, err := js.CreateConsumer(context.Background(), "KV_"+names.ApprovalsBucket(), ccfg); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := capstanEnv(t, env, "notify", "--init", "--config", config, creds("admin")); code != exitOK || !strings.Contains(stdout, "channel finance-hook: consumer notify-finance-hook, notifications since") {
		t.Fatalf("--init: exit %d: %s %s", code, stdout, stderr)
	}

	hook.mu.Lock()
	hook.hang = true
	hook.mu.Unlock()
	first := startDaemon(t, "notifier started", env, "notify", "--config", config, creds("notifier"), "--id", "first")
	stdout, stderr, code := capstanEnv(t, env, "call", "orders.refund", creds("alice"), "-o", "json", "--input", `{"orderId":"o1","amount":900}`)
	if code != exitApproval {
		t.Fatalf("refund: exit %d: %s %s", code, stdout, stderr)
	}
	id := decode[struct {
		Approval struct{ ID string } `json:"approval"`
	}](t, stdout).Approval.ID
	requested := notifier.Key(id, notify.EventRequested)
	hook.waitFor(t, requested, 1)
	if err := first.cmd.Process.Kill(); err != nil { // mid-delivery: the receiver holds the request
		t.Fatal(err)
	}
	<-first.exited

	hook.mu.Lock()
	hook.hang = false
	hook.mu.Unlock()
	second := startDaemon(t, "notifier started", env, "notify", "--config", config, creds("notifier"), "--id", "second", "--metrics", "127.0.0.1:0")
	hook.waitFor(t, requested, 2)
	if _, stderr, code := capstanEnv(t, env, "approvals", "approve", id, creds("carol"), "--comment", "ok"); code != exitOK {
		t.Fatalf("approve: exit %d: %s", code, stderr)
	}
	approved := notifier.Key(id, notify.EventApproved)
	hook.waitFor(t, approved, 1)

	// Done when the queue is: nothing waiting, nothing in flight.
	deadline := time.Now().Add(guard)
	type statusReport struct {
		Notifiers []notifier.Stats     `json:"notifiers"`
		Queues    []notifystatus.Queue `json:"queues"`
	}
	var report statusReport
	var statusOut string
	for {
		statusOut, stderr, code = capstanEnv(t, env, "notify", "--status", "--status-wait", "300ms", creds("notifier"), "--json")
		report = decode[statusReport](t, statusOut)
		if code == exitOK && len(report.Queues) == 1 && report.Queues[0].Channel == "finance-hook" &&
			report.Queues[0].Waiting == 0 && report.Queues[0].InFlight == 0 &&
			len(report.Notifiers) == 1 && report.Notifiers[0].InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status: exit %d: %s %s", code, statusOut, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := map[string]int{}
	for _, d := range hook.deliveries() {
		got[d.key]++
		if d.verified != nil || d.payload.IdempotencyKey != d.key || d.payload.Approval.ID != id {
			t.Errorf("delivery %s: signature %v, payload %+v", d.key, d.verified, d.payload)
		}
	}
	if len(got) != 2 || got[requested] != 2 || got[approved] != 1 {
		t.Fatalf("deliveries by key %v: want the request twice (the first unacknowledged when its notifier was killed) and the decision once", got)
	}
	s := report.Notifiers[0]
	if s.ID != "second" || len(s.Channels) != 1 || s.Channels[0].Sent != 2 || s.Channels[0].Failed != 0 || s.Channels[0].Where != "127.0.0.1" {
		t.Fatalf("status %+v", s)
	}

	m := regexp.MustCompile(`url=(http://[^ ]+/metrics)`).FindStringSubmatch(second.out.String())
	if m == nil {
		t.Fatalf("no metrics URL in:\n%s", second.out.String())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `capstan_notifications_sent_total{channel="finance-hook",kind="webhook"} 2`) {
		t.Errorf("metrics:\n%s", metrics)
	}
	human, _, _ := capstanEnv(t, env, "notify", "--status", "--status-wait", "300ms", creds("notifier"))
	for where, text := range map[string]string{"the first notifier's output": first.out.String(), "the second's": second.out.String(),
		"the status": statusOut + human, "the metrics": string(metrics)} {
		for _, s := range []string{secret, "tok-7f3a9c", hook.url} {
			if strings.Contains(text, s) {
				t.Errorf("%s holds the secret %q:\n%s", where, s, text)
			}
		}
	}
	if !strings.Contains(human, "finance-hook") || !strings.Contains(human, "QUEUE") {
		t.Errorf("status:\n%s", human)
	}
}

// capstanEnv runs one short command with env added to its environment (the
// command's own, not the test process's: the tests run in parallel).
func capstanEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return capstanNoWait(t, env, args...)
}

func connectAs(t *testing.T, url, credsPath string) *nats.Conn {
	t.Helper()
	nc, err := broker.Connect(broker.ConnectOptions{URL: url, Creds: credsPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// capstan dev --notify runs a notifier beside its worker, with the worker's
// rights (it creates the consumer), its messages linking to dev's console.
func TestDev_Notify_RunsBesideTheWorker(t *testing.T) {
	t.Parallel()
	const secret = "whsec-dev-0123456789abcdef"
	hook := startHookReceiver(t, secret)
	config := filepath.Join(t.TempDir(), "notify.json")
	doc := fmt.Sprintf(`{"channels": [{"name": "hook", "kind": "webhook", "types": ["*"], "url": %q, "secret": %q}]}`, hook.url, secret)
	if err := os.WriteFile(config, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	d := startDaemon(t, "notifier started", nil, "dev", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--console", "127.0.0.1:0", "--grace", "5s", "--notify", config)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	id := refundNeedingApproval(t, url)
	hook.waitFor(t, notifier.Key(id, notify.EventRequested), 1)
	p := hook.deliveries()[0].payload
	console := regexp.MustCompile(`console: (http://\S+)`).FindStringSubmatch(d.out.String())
	if console == nil || p.URL != console[1]+"/approvals/"+id || hook.deliveries()[0].verified != nil {
		t.Fatalf("payload url %q, console %v, signature %v", p.URL, console, hook.deliveries()[0].verified)
	}
	if code := d.stop(t); code != exitOK {
		t.Fatalf("dev exited %d:\n%s", code, d.out.String())
	}
}
