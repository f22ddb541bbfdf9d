package notifier

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/notify"
)

// guard bounds how long a test waits for an effect before it fails.
const guard = time.Minute

var (
	alice = envelope.Actor{Kind: "user", ID: "alice"}
	carol = envelope.Actor{Kind: "user", ID: "carol"}
)

// RefundIn is the test refund's input.
type RefundIn struct {
	OrderID string `json:"orderId"`
	Amount  int    `json:"amount"`
}

// refund needs a finance approval above 500, as the demo's orders.refund.
func refund() executor.Capability {
	return executor.Define("orders.refund", executor.Meta{
		Description: "Refunds an order.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectWrite, Risk: executor.RiskHigh,
		Policies: []executor.Policy{{Name: "refund-approval-above-500",
			Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
				if in, ok := r.Input.(*RefundIn); ok && in.Amount > 500 {
					return executor.Decision{Stance: executor.StanceRequireApproval, ApprovalTypes: []string{"finance"},
						Reason: "refunds above 500 need a finance approval"}, nil
				}
				return executor.Decision{Stance: executor.StanceAllow}, nil
			}}},
	}, func(ctx context.Context, c executor.Call[RefundIn]) (string, error) {
		return "refunded " + c.Input.OrderID, nil
	})
}

// ChargeIn is the test card charge's input; its card number is never shown
// to approvers.
type ChargeIn struct {
	Card   string `json:"card"`
	Amount int    `json:"amount"`
	Note   string `json:"note,omitempty"`
}

// cardNumber is the input a capability redacts: no notification may carry it.
const cardNumber = "4111111111111111"

func charge() executor.Capability {
	return executor.Define("cards.charge", executor.Meta{
		Description: "Charges a card.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectExternal, Risk: executor.RiskHigh,
		Approval: &executor.ApprovalRule{Required: true, Reason: "every charge is approved"},
		Policies: []executor.Policy{{Name: "payments",
			Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
				return executor.Decision{Stance: executor.StanceRequireApproval, ApprovalTypes: []string{"payments"}, Reason: "a card is charged"}, nil
			}}},
		RedactApprovalInput: func(in any) any {
			c := in.(*ChargeIn)
			return map[string]any{"card": "•••• " + c.Card[len(c.Card)-4:], "amount": c.Amount, "note": c.Note}
		},
	}, func(ctx context.Context, c executor.Call[ChargeIn]) (string, error) { return "charged", nil })
}

// brief needs an approval that expires after ttl.
func brief(ttl time.Duration) executor.Capability {
	return executor.Define("ops.restart", executor.Meta{
		Description: "Restarts a service.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectExternal, Approval: &executor.ApprovalRule{Required: true, Reason: "restarts are approved", TTL: ttl},
	}, func(ctx context.Context, c executor.Call[struct{}]) (string, error) { return "restarted", nil })
}

// rig is a real embedded JetStream, a worker serving caps, and a client.
type rig struct {
	env    *testenv.Env
	nc     *nats.Conn
	client *executor.Client
	names  broker.Names
}

func newRig(t *testing.T, caps ...executor.Capability) *rig {
	t.Helper()
	env := testenv.Start(t)
	r := &rig{env: env, nc: env.Connect(t), names: broker.NewNames("")}
	startWorker(t, env.Connect(t), caps...)
	c, err := executor.NewClient(r.nc, executor.ClientConfig{Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r.client = c
	return r
}

func startWorker(t *testing.T, nc *nats.Conn, caps ...executor.Capability) {
	t.Helper()
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(executor.WorkerConfig{Logger: quiet()}))
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// eventually waits until cond holds, failing the test after guard.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// request calls capabilityID, which must end approval-required, and returns
// the approval's id.
func (r *rig) request(t *testing.T, capabilityID string, input any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	env, err := r.client.Call(ctx, capabilityID, input)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("%s: %s %+v, want approval-required", capabilityID, env.Status, env.Error)
	}
	return env.Approval.ID
}

// decide records carol's decision through the workers (an open server
// names the approver in the request).
func (r *rig) decide(t *testing.T, id string, approve bool, comment string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := approvalsrpc.Decide(ctx, r.nc, r.names, approvalsrpc.DecideRequest{
		ApprovalID: id, Approve: approve, Comment: comment, Approver: carol}); err != nil {
		t.Fatal(err)
	}
}

// run starts a notifier of cfg on a connection of its own until the test
// ends (or stop is called).
func (r *rig) run(t *testing.T, cfg Config) (n *Notifier, stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	cfg.Provision = true
	n, err := New(r.env.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("notifier: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	eventually(t, "the notifier started", func() bool { return !n.Stats().Started.IsZero() })
	return n, stop
}

// delivery is one request a receiver got.
type delivery struct {
	key       string
	signature string
	event     string
	body      []byte
	// verified: the signature checked out under the receiver's secret.
	verified error
}

// receiver is a real HTTP server on loopback taking webhook (or Slack)
// posts. answer decides each request's status (nil: 200).
type receiver struct {
	srv    *http.Server
	url    string
	secret []byte

	mu     sync.Mutex
	got    []delivery
	answer func(n int, d delivery) int
}

func newReceiver(t *testing.T, secret string) *receiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveReceiver(t, l, secret)
}

func serveReceiver(t *testing.T, l net.Listener, secret string) *receiver {
	t.Helper()
	rc := &receiver{url: "http://" + l.Addr().String() + "/hooks/T0001/B0002/xoxsecretpath", secret: []byte(secret)}
	rc.srv = &http.Server{Handler: http.HandlerFunc(rc.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = rc.srv.Serve(l) }()
	t.Cleanup(func() { _ = rc.srv.Close() })
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	d := delivery{key: req.Header.Get(notify.IdempotencyHeader), signature: req.Header.Get(notify.SignatureHeader),
		event: req.Header.Get("Capstan-Event"), body: body}
	if len(rc.secret) > 0 {
		d.verified = notify.Verify(rc.secret, d.signature, body, time.Now(), 0)
	}
	rc.mu.Lock()
	rc.got = append(rc.got, d)
	n, answer := len(rc.got), rc.answer
	rc.mu.Unlock()
	code := http.StatusOK
	if answer != nil {
		code = answer(n, d)
	}
	w.WriteHeader(code)
}

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

// byKey counts the deliveries of each idempotency key answered 200 (every
// one, when no answer function is set).
func (rc *receiver) keys() map[string]int {
	out := map[string]int{}
	for _, d := range rc.deliveries() {
		out[d.key]++
	}
	return out
}

// waitKey waits until a delivery of key arrived and returns the first.
func (rc *receiver) waitKey(t *testing.T, key string) delivery {
	t.Helper()
	var found delivery
	eventually(t, "a delivery of "+key, func() bool {
		for _, d := range rc.deliveries() {
			if d.key == key {
				found = d
				return true
			}
		}
		return false
	})
	return found
}

// idle waits until n has nothing left to do: every channel's consumer has
// handed out every change, n finished with each one, and waiting of them on
// each channel wait for their approval's expiry.
func (r *rig) idle(t *testing.T, n *Notifier, waiting int) {
	t.Helper()
	want := map[string]int{}
	for _, c := range n.chans {
		want[c.Name] = waiting
	}
	r.idleAll(t, want, n)
}

// idleAll waits until the notifiers ns, sharing their consumers, have
// nothing left to do, waiting[channel] changes of each channel waiting for
// their approval's expiry.
func (r *rig) idleAll(t *testing.T, waiting map[string]int, ns ...*Notifier) {
	t.Helper()
	js := r.env.JetStream(t)
	eventually(t, fmt.Sprintf("the notifiers idle with %v approvals waiting for their expiry", waiting), func() bool {
		for _, c := range ns[0].chans {
			cons, err := js.Consumer(context.Background(), "KV_"+r.names.ApprovalsBucket(), r.names.NotifyConsumer(c.Name))
			if err != nil {
				return false
			}
			q := cons.CachedInfo()
			if q.NumPending != 0 || q.NumAckPending != waiting[c.Name] {
				return false
			}
			var handled uint64
			for _, n := range ns {
				for _, nc := range n.chans {
					if nc.Name == c.Name {
						handled += nc.handled.Load()
					}
				}
			}
			if handled != q.Delivered.Consumer {
				return false
			}
		}
		return true
	})
}

func decodePayload(t *testing.T, b []byte) notify.Payload {
	t.Helper()
	var p notify.Payload
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("payload: %v\n%s", err, b)
	}
	return p
}

// mustNotContain fails when any of texts contains a secret.
func mustNotContain(t *testing.T, where string, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s contains the secret %q:\n%s", where, s, text)
		}
	}
}

// logBuffer keeps a notifier's log lines, safe to read while it writes.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
