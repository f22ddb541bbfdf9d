package notifier

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"math/big"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

// smtpServer is a small SMTP server on loopback, speaking enough of RFC 5321
// for a client to deliver: EHLO, STARTTLS (RFC 3207), AUTH PLAIN (RFC 4954,
// with or without an initial response), MAIL, RCPT, DATA with dot-unstuffing,
// RSET, NOOP and QUIT. It keeps every message accepted and every command
// seen, and whether each arrived over TLS.
type smtpServer struct {
	l    net.Listener
	addr string
	// offerTLS advertises STARTTLS with cert; user and pass, when set, are
	// the one account AUTH PLAIN accepts.
	offerTLS   bool
	cert       tls.Certificate
	user, pass string

	mu       sync.Mutex
	messages []smtpMessage
	commands []smtpCommand
}

type smtpMessage struct {
	from   string
	to     []string
	data   string
	tls    bool
	authed string
}

type smtpCommand struct {
	line string
	tls  bool
}

func startSMTP(t *testing.T, offerTLS bool, user, pass string) *smtpServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &smtpServer{l: l, addr: l.Addr().String(), offerTLS: offerTLS, user: user, pass: pass}
	if offerTLS {
		s.cert = selfSigned(t)
	}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); s.session(c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return s
}

// roots trusts the server's certificate.
func (s *smtpServer) roots() *x509.CertPool {
	pool := x509.NewCertPool()
	if s.cert.Leaf != nil {
		pool.AddCert(s.cert.Leaf)
	}
	return pool
}

func (s *smtpServer) port() int { return s.l.Addr().(*net.TCPAddr).Port }

func (s *smtpServer) session(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(guard))
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	say := func(lines ...string) {
		for _, l := range lines {
			_, _ = w.WriteString(l + "\r\n")
		}
		_ = w.Flush()
	}
	isTLS, authed := false, ""
	var msg *smtpMessage
	say("220 mail.test ESMTP capstan-test")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		s.mu.Lock()
		s.commands = append(s.commands, smtpCommand{line: line, tls: isTLS})
		s.mu.Unlock()
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO", "HELO":
			ext := []string{"250-mail.test", "250-8BITMIME"}
			if s.offerTLS && !isTLS {
				ext = append(ext, "250-STARTTLS")
			}
			if s.user != "" {
				ext = append(ext, "250-AUTH PLAIN")
			}
			ext = append(ext, "250 SIZE 10485760")
			say(ext...)
		case "STARTTLS":
			if !s.offerTLS || isTLS {
				say("502 5.5.1 not offered")
				continue
			}
			say("220 2.0.0 go ahead")
			tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{s.cert}, MinVersion: tls.VersionTLS12})
			if err := tc.Handshake(); err != nil {
				return
			}
			c, isTLS = tc, true
			r, w = bufio.NewReader(tc), bufio.NewWriter(tc)
			msg, authed = nil, "" // RFC 3207: the session starts over
		case "AUTH":
			mech, initial, _ := strings.Cut(arg, " ")
			if !strings.EqualFold(mech, "PLAIN") || s.user == "" {
				say("504 5.5.4 unrecognized mechanism")
				continue
			}
			if initial == "" {
				say("334 ")
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				initial = strings.TrimRight(l, "\r\n")
			}
			b, err := base64.StdEncoding.DecodeString(initial)
			parts := strings.Split(string(b), "\x00")
			if err != nil || len(parts) != 3 || parts[1] != s.user || parts[2] != s.pass {
				say("535 5.7.8 authentication failed")
				continue
			}
			authed = parts[1]
			say("235 2.7.0 authenticated")
		case "MAIL":
			if s.user != "" && authed == "" {
				say("530 5.7.0 authentication required")
				continue
			}
			a, ok := strings.CutPrefix(strings.ToUpper(arg), "FROM:")
			if !ok {
				say("501 5.5.4 syntax")
				continue
			}
			msg = &smtpMessage{from: pathOf(arg[len(arg)-len(a):]), tls: isTLS, authed: authed}
			say("250 2.1.0 ok")
		case "RCPT":
			if msg == nil {
				say("503 5.5.1 MAIL first")
				continue
			}
			a, _ := strings.CutPrefix(strings.ToUpper(arg), "TO:")
			msg.to = append(msg.to, pathOf(arg[len(arg)-len(a):]))
			say("250 2.1.5 ok")
		case "DATA":
			if msg == nil || len(msg.to) == 0 {
				say("503 5.5.1 RCPT first")
				continue
			}
			say("354 end with <CRLF>.<CRLF>")
			var data strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				data.WriteString(strings.TrimPrefix(l, "."))
			}
			msg.data = data.String()
			s.mu.Lock()
			s.messages = append(s.messages, *msg)
			s.mu.Unlock()
			msg = nil
			say("250 2.0.0 queued")
		case "RSET":
			msg = nil
			say("250 2.0.0 ok")
		case "NOOP":
			say("250 2.0.0 ok")
		case "QUIT":
			say("221 2.0.0 bye")
			return
		default:
			say("500 5.5.2 unknown command")
		}
	}
}

// pathOf is the address of "<a@b> PARAM=...".
func pathOf(s string) string {
	s = strings.TrimSpace(s)
	a, _, _ := strings.Cut(strings.TrimPrefix(s, "<"), ">")
	return a
}

func (s *smtpServer) received() []smtpMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]smtpMessage(nil), s.messages...)
}

func (s *smtpServer) seen() []smtpCommand {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]smtpCommand(nil), s.commands...)
}

// byKey parses the messages and returns those whose idempotency key is key.
func (s *smtpServer) byKey(t *testing.T, key string) []*mail.Message {
	t.Helper()
	var out []*mail.Message
	for _, m := range s.received() {
		pm, err := mail.ReadMessage(strings.NewReader(m.data))
		if err != nil {
			t.Fatalf("a message the server accepted does not parse: %v\n%s", err, m.data)
		}
		if pm.Header.Get(notify.IdempotencyHeader) == key {
			out = append(out, pm)
		}
	}
	return out
}

// selfSigned makes a certificate for 127.0.0.1 and localhost.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mail.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost", "mail.test"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
