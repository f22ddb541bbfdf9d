package console_test

import (
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
)

// A web page of another site whose name its DNS turns to the console's
// loopback address (DNS rebinding) reaches an open console as a same-origin
// page: its requests carry the site's name in Host. The console must refuse
// them, or that page signs in, reads the form token and approves.
func TestConsole_RefusesRequestsForAnotherHost(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", refund(900), alice)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	rebound := "rebound.attacker.example:" + port
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequest(method, r.base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = rebound
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}

	status, _ := do(http.MethodPost, "/signin", url.Values{"name": {"user:mallory"}, "types": {""}, "admin": {"1"}})
	if status == http.StatusSeeOther {
		t.Errorf("sign-in from a page of %s: %d, signed in", rebound, status)
	}
	status, page := do(http.MethodGet, "/approvals", nil)
	if strings.Contains(page, `id="a-`+env.Approval.ID) {
		t.Errorf("a page of %s read the inbox (%d) and the approval's input", rebound, status)
	}
	const mark = `name="csrf" value="`
	if i := strings.Index(page, mark); i >= 0 {
		rest := page[i+len(mark):]
		token := rest[:strings.IndexByte(rest, '"')]
		do(http.MethodPost, "/approvals/"+env.Approval.ID+"/decide", url.Values{"csrf": {token}, "decision": {"approve"}, "next": {"/approvals"}})
	}
	rec, err := r.client.Approval(testCtx(t), env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != approvals.StatusPending {
		t.Fatalf("a page of %s had the approval %s by %v", rebound, rec.Status, rec.Decision.Approver)
	}
}

// The page a sign-in returns to stays inside the console: a browser drops
// tabs and newlines from a Location, so "/<TAB>/evil.example" is
// "//evil.example", another site.
func TestSignIn_ReturnsOnlyToAPageOfTheConsole(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	base, err := url.Parse(r.base)
	if err != nil {
		t.Fatal(err)
	}
	// A transport, not a client: a client refuses to read such a Location
	// at all, where a browser follows it.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	for _, next := range []string{"/\t/evil.example/signin", "/\n/evil.example/signin", "/\r\n/evil.example", "//evil.example", "/\\evil.example"} {
		req, err := http.NewRequest(http.MethodPost, r.base+"/signin", strings.NewReader(url.Values{"name": {"user:bob"}, "next": {next}}.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("sign-in with next %q: %d", next, resp.StatusCode)
		}
		// As a browser reads it (the URL standard removes every tab and
		// newline, and a backslash is a slash in an http URL).
		asRead := strings.NewReplacer("\t", "", "\n", "", "\r", "", "\\", "/").Replace(strings.TrimSpace(loc))
		u, err := url.Parse(asRead)
		if err != nil {
			t.Fatalf("sign-in with next %q: Location %q: %v", next, loc, err)
		}
		if to := base.ResolveReference(u); to.Host != base.Host {
			t.Errorf("sign-in with next %q returns to %s (Location %q), outside the console", next, to.Host, loc)
		}
	}
}

// A sign-in form posted by a page of another site (login CSRF) signs the
// browser in as whoever that site names: its approver then decides as that
// name without knowing it.
func TestSignIn_RefusedFromAPageOfAnotherSite(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	c := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodPost, r.base+"/signin", strings.NewReader(url.Values{"name": {"user:mallory"}, "admin": {"1"}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	// What a browser sends with a form another site's page submits.
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Sec-Fetch-Mode", "navigate")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Value != "" && ck.MaxAge >= 0 {
			t.Fatalf("a sign-in posted by a page of http://evil.example: %d, sets session cookie %s", resp.StatusCode, ck.Name)
		}
	}
}

// The input is shown as it is bound: a string the model wrote may not
// reorder what the approver reads. A right-to-left override (U+202E) in a
// value displays what follows it reversed, up to a pop (U+202C) or the end
// of the line: the order id "o-<RLO>1234-5678<PDF>" reads as "o-8765-4321",
// and a JSON line can be made to look like another field.
func TestApprovals_InputShownWithoutBidiControls(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", demo.RefundInput{OrderID: "o-\u202e1234-5678\u202c", Amount: 900}, alice)
	w := signInOpen(t, r.base, "user:bob", "")
	for _, path := range []string{"/approvals", "/approvals/" + env.Approval.ID, "/approvals?part=list"} {
		_, _, body := w.get(path)
		if !strings.Contains(body, `id="a-`+env.Approval.ID) {
			t.Fatalf("%s does not show the approval", path)
		}
		for _, ctl := range []rune{'\u202a', '\u202b', '\u202c', '\u202d', '\u202e', '\u2066', '\u2067', '\u2068', '\u2069', '\u200e', '\u200f'} {
			if strings.ContainsRune(body, ctl) {
				t.Errorf("%s shows the input with the bidirectional control %U unescaped", path, ctl)
			}
		}
	}
}

// An approver reads no executions: a cancel it posts (with its own form
// token) is refused with a page, not a crash of the request.
func TestCancel_ByAnApproverIsRefusedNotACrash(t *testing.T) {
	t.Parallel()
	env, setup := secured(t)
	workerCreds := setup.CredsPath(auth.WorkerPrincipal)
	r := startRig(t, env.URL, console.Config{},
		nats.UserCredentials(workerCreds), nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix(auth.WorkerPrincipal)))
	bob := newWeb(t, r.base)
	if _, path, body := bob.post("/signin", url.Values{"creds": {credsOf(t, setup, "bob")}, "next": {"/approvals"}}); path != "/approvals" {
		t.Fatalf("bob's sign-in ended at %s:\n%s", path, body)
	}
	form := url.Values{"csrf": {bob.csrf}}
	resp, err := bob.c.PostForm(r.base+"/executions/"+envelope.NewExecutionID()+"/cancel", form)
	if err != nil {
		t.Fatalf("an approver's cancel: %v", err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("an approver's cancel: %v", err)
	}
}

// A live stream belongs to its session: once the session signs out, the
// stream ends instead of telling a signed-out browser of every change (and
// holding its connection for as long as the tab stays open).
func TestLive_StreamEndsWhenItsSessionSignsOut(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	w := signInOpen(t, r.base, "user:bob", "")
	w.get("/approvals")
	lines, closeFn := openStream(t, w, "/live/approvals")
	defer closeFn()
	waitFor(t, lines, "event: changed") // the look the stream takes when it opens
	if status, path, _ := w.post("/signout", url.Values{}); status != http.StatusOK || path != "/signin" {
		t.Fatalf("sign-out: %d at %s", status, path)
	}
	r.call(t, "orders.refund", refund(900), alice)
	for ctx := testCtx(t); ; {
		select {
		case l, ok := <-lines:
			if !ok {
				return // ended
			}
			if strings.Contains(l, "event: changed") {
				t.Fatalf("the live stream of a signed-out session still reports changes")
			}
		case <-ctx.Done():
			t.Fatalf("the live stream of a signed-out session never ended")
		}
	}
}

// A sign-in form is a few fields and a credentials file: a larger body is
// refused before anyone is signed in, not read or spooled to disk.
func TestSignIn_RefusesALargeBody(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	form := url.Values{"name": {"user:bob"}, "next": {"/approvals"}, "pad": {strings.Repeat("x", 1<<20)}}
	c := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(r.base+"/signin", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a sign-in of 1 MiB: %d, want %d", resp.StatusCode, http.StatusRequestEntityTooLarge)
	}
	for _, ck := range resp.Cookies() {
		if ck.Value != "" && ck.MaxAge >= 0 {
			t.Fatalf("a sign-in of 1 MiB set the session cookie %s", ck.Name)
		}
	}
}

// What a client writes besides the input (here an approver's comment) shows
// its bidirectional controls by name instead of acting on the text.
func TestApprovals_CommentShownWithItsBidiControlsNamed(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	env := r.call(t, "orders.refund", refund(900), alice)
	w := signInOpen(t, r.base, "user:bob", "")
	w.get("/approvals")
	_, _, body := w.post("/approvals/"+env.Approval.ID+"/decide", url.Values{"decision": {"approve"}, "comment": {"ok \u202erefund 900\u202c"}, "next": {"/approvals/" + env.Approval.ID}})
	if !strings.Contains(body, "Approved") {
		t.Fatalf("bob's decision was not recorded:\n%s", body)
	}
	if strings.ContainsRune(body, '\u202e') || strings.ContainsRune(body, '\u202c') {
		t.Errorf("the comment is shown with its bidirectional controls unescaped")
	}
	if !strings.Contains(html.UnescapeString(body), "ok <U+202E>refund 900<U+202C>") {
		t.Errorf("the comment's bidirectional controls are not named:\n%s", body)
	}
}
