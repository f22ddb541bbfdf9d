package notifier

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/notify"
)

const hookSecret = "whsec-0123456789abcdef-test"

func hookConfig(url string, types ...string) Config {
	return Config{
		ConsoleURL: "https://console.example.com/",
		Retry:      Retry{Attempts: 8, Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Channels:   []Channel{{Name: "hook", Kind: KindWebhook, Types: types, URL: Secret(url), Secret: hookSecret}},
	}
}

// A webhook receives each event of an approval once, signed with the
// channel's secret (checked by the receiver with Verify), with the
// idempotency key <approvalId>.<event> in its header and its body.
func TestWebhook_EachEventSignedOnceWithItsIdempotencyKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	hook := newReceiver(t, hookSecret)
	n, _ := r.run(t, hookConfig(hook.url, "finance"))

	approved := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	rejected := r.request(t, "orders.refund", RefundIn{OrderID: "o2", Amount: 700})
	d := hook.waitKey(t, Key(approved, notify.EventRequested))
	hook.waitKey(t, Key(rejected, notify.EventRequested))
	r.decide(t, approved, true, "invoice checked")
	r.decide(t, rejected, false, "not ours")
	hook.waitKey(t, Key(approved, notify.EventApproved))
	hook.waitKey(t, Key(rejected, notify.EventRejected))
	r.idle(t, n, 0)

	for _, got := range hook.deliveries() {
		if got.verified != nil {
			t.Errorf("%s: signature %q: %v", got.key, got.signature, got.verified)
		}
		p := decodePayload(t, got.body)
		if p.IdempotencyKey != got.key || string(p.Event) != got.event || string(p.Event) != "approval."+strings.SplitN(got.key, ".", 2)[1] {
			t.Errorf("header key %q event %q, body key %q event %q", got.key, got.event, p.IdempotencyKey, p.Event)
		}
	}
	want := map[string]int{Key(approved, notify.EventRequested): 1, Key(rejected, notify.EventRequested): 1, Key(approved, notify.EventApproved): 1, Key(rejected, notify.EventRejected): 1}
	if got := hook.keys(); !equalCounts(got, want) {
		t.Fatalf("deliveries by key %v, want %v", got, want)
	}

	p := decodePayload(t, d.body)
	a := p.Approval
	if a.ID != approved || a.CapabilityID != "orders.refund" || a.Actor.String() != alice.String() || a.Status != approvals.StatusPending ||
		strings.Join(a.Types, ",") != "finance" || a.InputRedacted || p.V != notify.PayloadVersion {
		t.Errorf("requested payload: %+v", p)
	}
	if string(a.Input) != `{"amount":900,"orderId":"o1"}` {
		t.Errorf("input %s", a.Input)
	}
	if p.URL != "https://console.example.com/approvals/"+approved {
		t.Errorf("url %q", p.URL)
	}
	var decided notify.Payload
	for _, got := range hook.deliveries() {
		if got.key == Key(approved, notify.EventApproved) {
			decided = decodePayload(t, got.body)
		}
	}
	if dd := decided.Approval.Decision; dd == nil || dd.Approver.String() != carol.String() || dd.Comment != "invoice checked" || decided.Approval.Status != approvals.StatusApproved {
		t.Errorf("approved payload: %+v", decided.Approval)
	}
	if st := n.Stats().Channels[0]; st.Sent != 4 || st.Failed != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A channel receives only the approvals of its types; "*" receives them
// all.
func TestWebhook_OnlyTheChannelsTypes(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund(), charge())
	finance, every := newReceiver(t, hookSecret), newReceiver(t, hookSecret)
	cfg := hookConfig(finance.url, "finance")
	cfg.Channels = append(cfg.Channels, Channel{Name: "every", Kind: KindWebhook, Types: []string{"*"}, URL: Secret(every.url), Secret: hookSecret})
	n, _ := r.run(t, cfg)

	refundID := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	chargeID := r.request(t, "cards.charge", ChargeIn{Card: cardNumber, Amount: 20})
	every.waitKey(t, Key(refundID, notify.EventRequested))
	every.waitKey(t, Key(chargeID, notify.EventRequested))
	finance.waitKey(t, Key(refundID, notify.EventRequested))
	r.idleAll(t, map[string]int{"hook": 1, "every": 2}, n)
	if got := finance.keys(); !equalCounts(got, map[string]int{Key(refundID, notify.EventRequested): 1}) {
		t.Fatalf("the finance channel got %v", got)
	}
}

// A receiver that is down (nothing listens on its port) gets the
// notification once it comes up: retried with backoff, delivered once.
func TestWebhook_ReceiverDownThenUp_DeliveredOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // down: connections are refused
	url := "http://" + addr + "/hooks/T0001/B0002/xoxsecretpath"
	cfg := hookConfig(url, "finance")
	cfg.Retry = Retry{Attempts: 1000, Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	n, _ := r.run(t, cfg)

	id := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	eventually(t, "a retry", func() bool { return n.Stats().Channels[0].Retries >= 2 })
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hook := serveReceiver(t, l, hookSecret)
	hook.waitKey(t, Key(id, notify.EventRequested))
	r.idle(t, n, 1)
	if got := hook.keys(); !equalCounts(got, map[string]int{Key(id, notify.EventRequested): 1}) {
		t.Fatalf("deliveries %v, want one", got)
	}
	st := n.Stats().Channels[0]
	if st.Sent != 1 || st.Failed != 0 || st.Retries < 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A receiver that keeps failing is retried up to the bound, then the
// notification is given up: counted, listed in Stats, and nothing in the
// failure, the status or the log lines holds the URL's secret path or the
// signing key.
func TestWebhook_FailingReceiver_GivenUpCountedWithoutSecrets(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	hook := newReceiver(t, hookSecret)
	hook.answer = func(int, delivery) int { return 503 }
	var logs logBuffer
	cfg := hookConfig(hook.url, "finance")
	cfg.Retry = Retry{Attempts: 3, Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}
	cfg.Logger = logs.logger()
	n, _ := r.run(t, cfg)

	id := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	r.idle(t, n, 1)
	st := n.Stats()
	if c := st.Channels[0]; c.Failed != 1 || c.Sent != 0 || c.Retries != 2 || c.LastFailure.IsZero() {
		t.Fatalf("stats %+v", c)
	}
	if len(hook.deliveries()) != 3 {
		t.Fatalf("%d attempts, want 3", len(hook.deliveries()))
	}
	f := st.Failures
	if len(f) != 1 || f[0].Key != Key(id, notify.EventRequested) || f[0].Attempts != 3 || !strings.Contains(f[0].Error, "503") {
		t.Fatalf("failures %+v", f)
	}
	status, _ := json.Marshal(st)
	for where, text := range map[string]string{"the status": string(status), "the log": logs.String()} {
		mustNotContain(t, where, text, "xoxsecretpath", hookSecret, hook.url)
	}
	if !strings.Contains(logs.String(), "given up") {
		t.Errorf("no log line says the notification was given up:\n%s", logs.String())
	}
	reg := prometheus.NewRegistry()
	if err := n.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := n.Register(reg); err == nil {
		t.Error("a notifier's metrics registered twice on one registry")
	}
	got := scrape(t, reg)
	for name, want := range map[string]float64{
		`capstan_notifications_sent_total{channel="hook",kind="webhook"}`:   0,
		`capstan_notifications_failed_total{channel="hook",kind="webhook"}`: 1,
		`capstan_notification_retries_total{channel="hook",kind="webhook"}`: 2,
		`capstan_notifications_in_flight`:                                   0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (scraped: %t), want %v", name, v, ok, want)
		}
	}
}

// scrape gathers reg into "name{label="value",…}" → value.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetCounter().GetValue()
			if m.GetGauge() != nil {
				v = m.GetGauge().GetValue()
			}
			out[name] = v
		}
	}
	return out
}

// A 4xx answer (a revoked hook) is not retried.
func TestWebhook_Refused_NotRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	hook := newReceiver(t, hookSecret)
	hook.answer = func(int, delivery) int { return 404 }
	n, _ := r.run(t, hookConfig(hook.url, "finance"))
	r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	r.idle(t, n, 1)
	if c := n.Stats().Channels[0]; c.Failed != 1 || c.Retries != 0 || len(hook.deliveries()) != 1 {
		t.Fatalf("stats %+v after %d attempts", c, len(hook.deliveries()))
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
