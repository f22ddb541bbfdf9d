package console_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
)

// rig is a real embedded JetStream, a worker serving the demo catalog, a
// producer's client, and the console served on loopback.
type rig struct {
	url    string // NATS
	base   string // the console
	client *executor.Client
	worker *executor.Worker
	// stopWorker stops the worker, before the test ends.
	stopWorker func()
}

var (
	alice = envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	bob   = envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}
)

// startRig starts everything on url's server (a new embedded one when url is
// empty); cfg.Conn is filled in for open mode. Everything stops when the test
// ends.
func startRig(t testing.TB, url string, cfg console.Config, opts ...nats.Option) *rig {
	t.Helper()
	if url == "" {
		url = testenv.Start(t).URL
	}
	conn := func() *nats.Conn {
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithCancel(context.Background())
	workerNC := conn()
	js, err := demo.Provision(ctx, workerNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := executor.NewRegistry(demo.Catalog(js)...)
	if err != nil {
		t.Fatal(err)
	}
	w := capstantest.Worker(t, reg, capstantest.WithConn(workerNC), capstantest.WithConfig(executor.WorkerConfig{Grace: 5 * time.Second}))
	c, err := executor.NewClient(conn(), executor.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Open {
		cfg.Conn = conn()
	}
	cfg.NATS.URL = url
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- con.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-serveDone; err != nil {
			t.Errorf("console: %v", err)
		}
		_ = c.Close()
	})
	return &rig{url: url, base: "http://" + l.Addr().String(), client: c, worker: w.Worker, stopWorker: w.Stop}
}

// testCtx ends a little before the test's own deadline.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	d := time.Now().Add(5 * time.Minute) // benchmarks have no deadline
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dd, ok := td.Deadline(); ok {
			d = dd
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), d.Add(-5*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// waitPage gets path until its body holds want.
func (w *web) waitPage(path, want string) string {
	w.t.Helper()
	ctx := testCtx(w.t)
	for {
		if _, _, body := w.get(path); strings.Contains(body, want) {
			return body
		}
		select {
		case <-ctx.Done():
			w.t.Fatalf("%s never showed %q", path, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// call runs a capability as actor and returns its envelope.
func (r *rig) call(t testing.TB, capID string, input any, actor envelope.Actor) *envelope.Envelope {
	t.Helper()
	env, err := r.client.Call(testCtx(t), capID, input, executor.As(actor))
	if err != nil {
		t.Fatalf("call %s: %v", capID, err)
	}
	return env
}

// web is one browser-less visitor of the console, with its own cookies.
type web struct {
	t    testing.TB
	base string
	c    *http.Client
	csrf string
}

func newWeb(t testing.TB, base string) *web {
	jar, _ := cookiejar.New(nil)
	return &web{t: t, base: base, c: &http.Client{Jar: jar, Timeout: time.Minute}}
}

// get returns the final status, path and body of a GET, redirects followed.
func (w *web) get(path string) (int, string, string) {
	w.t.Helper()
	resp, err := w.c.Get(w.base + path)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.read(resp)
}

// post submits a form (with the session's token) and returns like get.
func (w *web) post(path string, form url.Values) (int, string, string) {
	w.t.Helper()
	if form.Get("csrf") == "" && w.csrf != "" {
		form.Set("csrf", w.csrf)
	}
	resp, err := w.c.PostForm(w.base+path, form)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.read(resp)
}

// read keeps the session's form token from the page.
func (w *web) read(resp *http.Response) (int, string, string) {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	body := string(b)
	const mark = `name="csrf" value="`
	if i := strings.Index(body, mark); i >= 0 {
		rest := body[i+len(mark):]
		w.csrf = rest[:strings.IndexByte(rest, '"')]
	}
	return resp.StatusCode, resp.Request.URL.Path, body
}
