package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// `capstan dev` serves an open console on loopback and prints its address.
func TestDev_ServesTheConsoleAndPrintsIt(t *testing.T) {
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
	_, stderr, code := capstan(t, "nats://127.0.0.1:1", "console", "--open", "--listen", "0.0.0.0:0")
	if code != exitUsage || !strings.Contains(stderr, "listens only on loopback") {
		t.Fatalf("exit %d, stderr %q; want %d and a refusal", code, stderr, exitUsage)
	}
}

// Without --open, the console asks for credentials before anything.
func TestConsole_AsksForCredentials(t *testing.T) {
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
