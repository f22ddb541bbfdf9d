package notifier

import (
	"context"
	"crypto/tls"
	"io"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

const smtpPassword = "smtp-pass-Zq9-secret"

func emailConfig(s *smtpServer, host string, mode TLSMode) Config {
	return Config{
		ConsoleURL: "https://console.example.com",
		Retry:      Retry{Attempts: 3, Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Channels: []Channel{{Name: "mail", Kind: KindEmail, Types: []string{"finance"},
			SMTP: SMTP{Host: host, Port: s.port(), Username: s.user, Password: Secret(s.pass), TLS: mode,
				TLSConfig: &tls.Config{RootCAs: s.roots(), MinVersion: tls.VersionTLS12}},
			From: "capstan <capstan@example.com>", To: []string{"finance@example.com", "Bob <bob@example.com>"}}},
	}
}

func bodyOf(t *testing.T, m *mail.Message) string {
	t.Helper()
	b, err := io.ReadAll(quotedprintable.NewReader(m.Body))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// An email channel upgrades with STARTTLS, authenticates with AUTH PLAIN only
// over TLS, and sends one message per event: the request with its input and
// the console's link, then the decision threaded under it.
func TestEmail_STARTTLSAuthPlain_RequestThenThreadedDecision(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	smtp := startSMTP(t, true, "capstan", smtpPassword)
	n, _ := r.run(t, emailConfig(smtp, "127.0.0.1", TLSModeStartTLS))

	id := r.request(t, "orders.refund", RefundIn{OrderID: "o-17", Amount: 900})
	eventually(t, "the request's email", func() bool { return len(smtp.byKey(t, Key(id, notify.EventRequested))) == 1 })
	r.decide(t, id, true, "invoice checked")
	eventually(t, "the decision's email", func() bool { return len(smtp.byKey(t, Key(id, notify.EventApproved))) == 1 })
	r.idle(t, n, 0)

	msgs := smtp.received()
	if len(msgs) != 2 {
		t.Fatalf("%d messages, want 2", len(msgs))
	}
	for _, m := range msgs {
		if !m.tls || m.authed != "capstan" || m.from != "capstan@example.com" ||
			strings.Join(m.to, ",") != "finance@example.com,bob@example.com" {
			t.Errorf("envelope: tls %v, authenticated as %q, from %q to %v", m.tls, m.authed, m.from, m.to)
		}
	}
	for _, c := range smtp.seen() {
		if strings.HasPrefix(strings.ToUpper(c.line), "AUTH") && !c.tls {
			t.Errorf("AUTH sent in clear: %q", c.line)
		}
	}
	req := smtp.byKey(t, Key(id, notify.EventRequested))[0]
	subject, _ := new(mime.WordDecoder).DecodeHeader(req.Header.Get("Subject"))
	if subject != "[capstan] Approval requested: orders.refund for user:alice" {
		t.Errorf("subject %q", subject)
	}
	if got := req.Header.Get("Message-ID"); got != "<"+Key(id, notify.EventRequested)+"@example.com>" {
		t.Errorf("Message-ID %q", got)
	}
	body := bodyOf(t, req)
	for _, want := range []string{"amount: 900", "orderId: o-17", "refunds above 500 need a finance approval",
		"https://console.example.com/approvals/" + id, "Types:         finance"} {
		if !strings.Contains(body, want) {
			t.Errorf("the request's body lacks %q:\n%s", want, body)
		}
	}
	dec := smtp.byKey(t, Key(id, notify.EventApproved))[0]
	if got := dec.Header.Get("In-Reply-To"); got != "<"+Key(id, notify.EventRequested)+"@example.com>" {
		t.Errorf("In-Reply-To %q", got)
	}
	if body := bodyOf(t, dec); !strings.Contains(body, "Approved by user:carol") || !strings.Contains(body, "invoice checked") {
		t.Errorf("the decision's body:\n%s", body)
	}
}

// Beyond loopback, a server that does not offer STARTTLS gets nothing: no
// AUTH, no MAIL, and the notification is given up at once (a retry cannot
// mend it), with the password in no error.
func TestEmail_NoSTARTTLSBeyondLoopback_NothingSent(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	smtp := startSMTP(t, false, "capstan", smtpPassword)
	cfg := emailConfig(smtp, "mail.example.com", TLSModeStartTLS)
	cfg.Provision, cfg.Logger = true, quiet()
	n, err := New(r.env.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// mail.example.com is reached at the loopback server.
	n.chans[0].s.(*emailSender).dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, smtp.addr)
	}
	runNotifier(t, r, n)

	r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	r.idle(t, n, 1)
	st := n.Stats()
	if c := st.Channels[0]; c.Failed != 1 || c.Retries != 0 || c.Sent != 0 {
		t.Fatalf("stats %+v", c)
	}
	if len(smtp.received()) != 0 {
		t.Fatal("a message was sent in clear")
	}
	for _, c := range smtp.seen() {
		if v := strings.ToUpper(strings.SplitN(c.line, " ", 2)[0]); v != "EHLO" && v != "QUIT" {
			t.Errorf("the client sent %q to a server without STARTTLS", c.line)
		}
	}
	if f := st.Failures; len(f) != 1 || !strings.Contains(f[0].Error, "does not offer STARTTLS") {
		t.Fatalf("failures %+v", f)
	}
	mustNotContain(t, "the failure", st.Failures[0].Error, smtpPassword)
}

// On loopback, a server without STARTTLS is spoken to in clear.
func TestEmail_OnLoopbackWithoutSTARTTLS_Sent(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	smtp := startSMTP(t, false, "", "")
	cfg := emailConfig(smtp, "127.0.0.1", TLSModeStartTLS)
	cfg.Channels[0].SMTP.TLSConfig = nil
	n, _ := r.run(t, cfg)
	id := r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	eventually(t, "the email", func() bool { return len(smtp.byKey(t, Key(id, notify.EventRequested))) == 1 })
	r.idle(t, n, 1)
	if m := smtp.received(); len(m) != 1 || m[0].tls {
		t.Fatalf("messages %+v", m)
	}
}

// A wrong password (535) is not retried, and the password is in no error.
func TestEmail_WrongPassword_GivenUpAtOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, refund())
	smtp := startSMTP(t, true, "capstan", "the-right-one")
	cfg := emailConfig(smtp, "127.0.0.1", TLSModeStartTLS)
	cfg.Channels[0].SMTP.Password = smtpPassword
	var logs logBuffer
	cfg.Logger = logs.logger()
	n, _ := r.run(t, cfg)
	r.request(t, "orders.refund", RefundIn{OrderID: "o1", Amount: 900})
	r.idle(t, n, 1)
	st := n.Stats()
	if c := st.Channels[0]; c.Failed != 1 || c.Retries != 0 {
		t.Fatalf("stats %+v", c)
	}
	if !strings.Contains(st.Failures[0].Error, "535") {
		t.Errorf("failure %q", st.Failures[0].Error)
	}
	mustNotContain(t, "the failure", st.Failures[0].Error, smtpPassword)
	mustNotContain(t, "the log", logs.String(), smtpPassword)
}

// runNotifier runs n until the test ends.
func runNotifier(t *testing.T, r *rig, n *Notifier) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("notifier: %v", err)
		}
	})
	eventually(t, "the notifier started", func() bool { return !n.Stats().Started.IsZero() })
}
