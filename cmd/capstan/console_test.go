package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// `capstan dev` serves an open console on loopback and prints its address.
func TestDev_ServesTheConsoleAndPrintsIt(t *testing.T) {
	t.Parallel()
	d, _ := startDev(t)
	m := regexp.MustCompile(`console: (http://127\.0\.0\.1:\d+)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("the banner has no console address:\n%s", d.out.String())
	}
	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar, Timeout: guard}
	resp, err := web.PostForm(m[1]+"/signin", url.Values{"name": {"user:bob"}, "next": {"/capabilities"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/capabilities" || !strings.Contains(string(body), "orders.refund") {
		t.Fatalf("signed in, /capabilities: %d at %s:\n%s", resp.StatusCode, resp.Request.URL.Path, body)
	}
	if code := d.stop(t); code != exitOK {
		t.Fatalf("dev exited %d after SIGTERM, want 0", code)
	}
}

// An open console (no credentials at sign-in) listens on loopback only.
func TestConsole_OpenRefusedBeyondLoopback(t *testing.T) {
	t.Parallel()
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "console", "--open", "--listen", "0.0.0.0:0")
	if code != exitUsage || !strings.Contains(stderr, "listens only on loopback") {
		t.Fatalf("exit %d, stderr %q; want %d and a refusal", code, stderr, exitUsage)
	}
}

// Beyond loopback, a console with sign-in serves HTTPS only.
func TestConsole_PlainHTTPRefusedBeyondLoopback(t *testing.T) {
	t.Parallel()
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "console", "--listen", "0.0.0.0:0")
	if code != exitUsage || !strings.Contains(stderr, "serves HTTPS only") {
		t.Fatalf("exit %d, stderr %q; want %d and a refusal", code, stderr, exitUsage)
	}
}

// Without --open, the console asks for credentials before anything.
func TestConsole_AsksForCredentials(t *testing.T) {
	t.Parallel()
	_, natsURL := startDev(t)
	port := freePort(t)
	startDaemon(t, "capstan console on", []string{"CAPSTAN_NATS_URL=" + natsURL}, "console", "--listen", "127.0.0.1:"+strconv.Itoa(port))
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/approvals")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Request.URL.Path != "/signin" || !strings.Contains(string(body), `name="credsfile"`) {
		t.Fatalf("/approvals before sign-in: %d at %s:\n%s", resp.StatusCode, resp.Request.URL.Path, body)
	}
	// The dev server authenticates nobody: a password there proves nothing.
	resp, err = http.PostForm("http://127.0.0.1:"+strconv.Itoa(port)+"/signin", url.Values{"user": {"bob"}, "password": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "does not authenticate its clients") {
		t.Fatalf("sign-in against a server without authentication: %d:\n%s", resp.StatusCode, body)
	}
}

// With a certificate the console serves HTTPS, and its session cookie is
// marked Secure. It answers under the certificate's names and those of
// --allow-hosts, and refuses any other (421).
func TestConsole_ServesHTTPS(t *testing.T) {
	t.Parallel()
	_, natsURL := startDev(t)
	certFile, keyFile, der := selfSigned(t, "console.test")

	port := strconv.Itoa(freePort(t))
	startDaemon(t, "capstan console on https://", []string{"CAPSTAN_NATS_URL=" + natsURL},
		"console", "--open", "--listen", "127.0.0.1:"+port, "--https-cert", certFile, "--https-key", keyFile, "--allow-hosts", "ops.test")
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	web := &http.Client{Timeout: guard, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := web.PostForm("https://127.0.0.1:"+port+"/signin", url.Values{"name": {"user:bob"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly {
		t.Fatalf("sign-in over HTTPS: %d, cookies %+v; want a redirect and one Secure, HttpOnly cookie", resp.StatusCode, cookies)
	}
	for host, want := range map[string]int{"console.test": http.StatusOK, "ops.test": http.StatusOK, "rebound.test": http.StatusMisdirectedRequest} {
		req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:"+port+"/signin", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host + ":" + port
		resp, err := web.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /signin for host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// `capstan dev --auth` serves a console that asks for credentials: an
// approver signs in with its .creds and reads the approvals; a name alone
// signs nobody in.
func TestDevWithAuth_ConsoleAsksForCredentials(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "secrets")
	for _, args := range [][]string{
		{"auth", "init", dir},
		{"auth", "add", dir, "carol", "--role", "approver", "--actor", "user:carol", "--types", "finance"},
	} {
		if _, stderr, code := capstan(t, "", args...); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	d := startDaemon(t, "capstan call demo.echo", nil, "dev", "--auth", dir, "--store", t.TempDir(),
		"--listen", "127.0.0.1:"+strconv.Itoa(freePort(t)), "--console", "127.0.0.1:0", "--grace", "5s")
	m := regexp.MustCompile(`console: (http://127\.0\.0\.1:\d+)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("the banner has no console address:\n%s", d.out.String())
	}
	natsURL := regexp.MustCompile(`listening on (nats://\S+)`).FindStringSubmatch(d.out.String())
	if natsURL == nil {
		t.Fatalf("the banner has no NATS address:\n%s", d.out.String())
	}
	// An open console would lend its own credentials to whoever names themselves.
	if _, stderr, code := capstan(t, natsURL[1], "console", "--open", "--listen", "127.0.0.1:0",
		"--creds", filepath.Join(dir, "admin.creds")); code != exitUsage || !strings.Contains(stderr, "--open is for servers without authentication") {
		t.Fatalf("an open console on a server with authentication: exit %d: %s", code, stderr)
	}
	resp, err := http.PostForm(m[1]+"/signin", url.Values{"name": {"user:carol"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "paste or upload a .creds file") {
		t.Fatalf("a name alone: %d:\n%s", resp.StatusCode, body)
	}
	creds, err := os.ReadFile(filepath.Join(dir, "carol.creds"))
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar, Timeout: guard}
	resp, err = web.PostForm(m[1]+"/signin", url.Values{"creds": {string(creds)}, "next": {"/approvals"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/approvals" || !strings.Contains(string(body), "Nothing waits for your decision.") {
		t.Fatalf("carol's sign-in: %d at %s:\n%s", resp.StatusCode, resp.Request.URL.Path, body)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and name, and its key, and
// returns their files and the certificate.
func selfSigned(t *testing.T, name string) (certFile, keyFile string, der []byte) {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile, der
}
