package notifier

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

// emailSender sends one message per notification over SMTP: STARTTLS when
// the server offers it (required beyond loopback unless the channel says
// optional), or TLS from the start; AUTH PLAIN only over TLS or on loopback.
type emailSender struct {
	ch  Channel
	now func() time.Time
	// dial connects to the mail server (tests reach a loopback server under
	// another name through it).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func newEmailSender(ch Channel, now func() time.Time) *emailSender {
	var d net.Dialer
	return &emailSender{ch: ch, now: now, dial: d.DialContext}
}

func (s *emailSender) port() int {
	switch {
	case s.ch.SMTP.Port > 0:
		return s.ch.SMTP.Port
	case s.ch.SMTP.TLS == TLSModeImplicit:
		return 465
	}
	return 587
}

func (s *emailSender) tlsConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.ch.SMTP.TLSConfig != nil {
		cfg = s.ch.SMTP.TLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = s.ch.SMTP.Host
	}
	return cfg
}

func (s *emailSender) send(ctx context.Context, n *notification) error {
	m := s.ch.SMTP
	server := net.JoinHostPort(m.Host, strconv.Itoa(s.port()))
	conn, err := s.dial(ctx, "tcp", server)
	if err != nil {
		return transient("connect to %s: %v", server, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	secure := false
	if m.TLS == TLSModeImplicit {
		tc := tls.Client(conn, s.tlsConfig())
		if err := tc.HandshakeContext(ctx); err != nil {
			return transient("TLS with %s: %v", server, err)
		}
		conn, secure = tc, true
	}
	c, err := smtp.NewClient(conn, m.Host)
	if err != nil {
		return smtpFailure(server, "greeting", err)
	}
	defer c.Close()
	if err := c.Hello("localhost"); err != nil {
		return smtpFailure(server, "EHLO", err)
	}
	if !secure {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(s.tlsConfig()); err != nil {
				return smtpFailure(server, "STARTTLS", err)
			}
			secure = true
		} else if m.TLS != TLSModeOptional && !loopback(m.Host) {
			return permanent("%s does not offer STARTTLS: approvals are not sent in clear beyond loopback (smtp.tls \"optional\" allows it)", server)
		}
	}
	if m.Username != "" {
		if ok, _ := c.Extension("AUTH"); !ok {
			return permanent("%s offers no AUTH, and the channel has a username", server)
		}
		if !secure && !loopback(m.Host) {
			return permanent("%s: AUTH PLAIN would send the password in clear: not without TLS beyond loopback", server)
		}
		if err := c.Auth(plainAuth{user: m.Username, pass: m.Password}); err != nil {
			return smtpFailure(server, "AUTH", err)
		}
	}
	from, _ := mail.ParseAddress(s.ch.From)
	if err := c.Mail(from.Address); err != nil {
		return smtpFailure(server, "MAIL FROM", err)
	}
	for _, to := range s.ch.To {
		a, _ := mail.ParseAddress(to)
		if err := c.Rcpt(a.Address); err != nil {
			return smtpFailure(server, "RCPT TO", err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return smtpFailure(server, "DATA", err)
	}
	if _, err := w.Write(emailMessage(n, s.ch, s.now())); err != nil {
		return smtpFailure(server, "DATA", err)
	}
	if err := w.Close(); err != nil {
		return smtpFailure(server, "end of DATA", err)
	}
	// The message is accepted; a failed QUIT changes nothing.
	_ = c.Quit()
	return nil
}

// smtpFailure classifies a server's answer: 5xx is permanent, anything else
// (4xx, a lost connection) may pass.
func smtpFailure(server, step string, err error) error {
	var te *textproto.Error
	if errors.As(err, &te) && te.Code >= 500 {
		return permanent("%s: %s: %v", server, step, err)
	}
	return transient("%s: %s: %v", server, step, err)
}

// plainAuth is AUTH PLAIN (RFC 4616). net/smtp's own refuses any server but
// "localhost" and two addresses in clear; send decides where clear text is
// allowed before it gets here.
type plainAuth struct {
	user string
	pass Secret
}

func (a plainAuth) Start(*smtp.ServerInfo) (string, []byte, error) {
	return "PLAIN", []byte("\x00" + a.user + "\x00" + a.pass.reveal()), nil
}

func (a plainAuth) Next(_ []byte, more bool) ([]byte, error) {
	if more {
		return nil, errors.New("unexpected server challenge")
	}
	return nil, nil
}

// emailMessage is the message: headers (the idempotency key in Message-ID
// and Capstan-Idempotency-Key; a follow-up threads under its request) and a
// plain-text, quoted-printable body.
func emailMessage(n *notification, ch Channel, now time.Time) []byte {
	r := n.rec
	domain := "capstan.invalid"
	if a, err := mail.ParseAddress(ch.From); err == nil {
		if _, d, ok := strings.Cut(a.Address, "@"); ok {
			domain = d
		}
	}
	msgID := func(key string) string { return "<" + key + "@" + domain + ">" }
	var to []string
	for _, t := range ch.To {
		a, _ := mail.ParseAddress(t)
		to = append(to, a.String())
	}
	from, _ := mail.ParseAddress(ch.From)
	subject := fmt.Sprintf("[capstan] %s: %s for %s", n.headline(), r.CapabilityID, r.Actor.String())
	var b bytes.Buffer
	header := func(k, v string) { fmt.Fprintf(&b, "%s: %s\r\n", k, v) }
	header("From", from.String())
	header("To", strings.Join(to, ", "))
	header("Subject", mime.QEncoding.Encode("utf-8", cut(subject, 200)))
	header("Date", now.Format(time.RFC1123Z))
	header("Message-ID", msgID(n.key))
	if n.event != notify.EventRequested {
		header("In-Reply-To", msgID(Key(r.ID, notify.EventRequested)))
		header("References", msgID(Key(r.ID, notify.EventRequested)))
	}
	header(notify.IdempotencyHeader, n.key)
	header("Auto-Submitted", "auto-generated")
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	qp := quotedprintable.NewWriter(&b)
	_, _ = qp.Write([]byte(emailBody(n)))
	_ = qp.Close()
	return b.Bytes()
}

func emailBody(n *notification) string {
	r := n.rec
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\r\n", a...) }
	line("%s: %s", n.headline(), r.CapabilityID)
	line("")
	line("Requested by:  %s", cut(n.describeRequester(), summaryValue))
	line("Types:         %s", cut(orNone(strings.Join(r.Types, ", ")), summaryValue))
	if r.Risk != "" || r.SideEffect != "" {
		line("Risk:          %s", strings.TrimSpace(r.Risk+" "+r.SideEffect))
	}
	for _, why := range r.Reasons {
		line("Why:           %s", cut(why, 200))
	}
	line("Requested at:  %s UTC", r.RequestedAt.UTC().Format(time.DateTime))
	switch n.event {
	case notify.EventRequested, notify.EventExpired:
		line("Expires at:    %s UTC", r.ExpiresAt.UTC().Format(time.DateTime))
	default:
		d := r.Decision
		line("Decided at:    %s UTC", d.DecidedAt.UTC().Format(time.DateTime))
		if d.Comment != "" {
			line("Comment:       %s", cut(d.Comment, 400))
		}
	}
	line("")
	if n.redacted {
		line("Input (redacted by the capability: what approvers see):")
	} else {
		line("Input:")
	}
	fields, more := n.summary()
	for _, f := range fields {
		line("  %s: %s", cut(f.name, 40), f.value)
	}
	if more > 0 {
		line("  … and %d more fields", more)
	}
	line("")
	if n.url != "" {
		line("Open it in the console: %s", n.url)
	}
	if n.event == notify.EventRequested {
		line("Or from a shell: capstan approvals show %s", r.ID)
	}
	line("")
	line("Approval %s, idempotency key %s.", r.ID, n.key)
	return b.String()
}
