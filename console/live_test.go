package console_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/console"
)

// openStream opens a live stream as w's session and waits for its first line.
func openStream(t *testing.T, w *web, path string) (lines <-chan string, closeFn func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.base+path, nil)
	resp, err := (&http.Client{Jar: w.c.Jar}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	ch := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case ch <- sc.Text():
			default:
			}
		}
	}()
	return ch, func() { cancel(); resp.Body.Close(); <-done }
}

// waitFor reads lines until one holds want.
func waitFor(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	ctx := testCtx(t)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the stream ended before %q", want)
			}
			if strings.Contains(l, want) {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no %q", want)
		}
	}
}

// However many pages follow the executions live, the console reads the audit
// stream through one consumer, and none once they are closed.
func TestLive_ManyPagesShareOneAuditConsumer(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	consumers := func() int {
		t.Helper()
		info, err := testhooks.Broker(r.client).Audit.Info(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	before := consumers()
	var streams []<-chan string
	var closers []func()
	for _, name := range []string{"user:a", "user:b", "user:c"} {
		w := signInOpen(t, r.base, name, "")
		for range 2 {
			lines, closeFn := openStream(t, w, "/live/executions?after=0")
			streams, closers = append(streams, lines), append(closers, closeFn)
		}
	}
	for _, lines := range streams {
		waitFor(t, lines, ": ready")
	}
	// The feed's one consumer is made by its loop, just after the first
	// page subscribed.
	for ctx := testCtx(t); consumers()-before == 0; {
		select {
		case <-ctx.Done():
			t.Fatal("no audit consumer for six live pages")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if n := consumers() - before; n != 1 {
		t.Fatalf("%d audit consumers for six live pages, want 1", n)
	}
	r.call(t, "demo.echo", map[string]any{"n": 1}, alice)
	for _, lines := range streams {
		waitFor(t, lines, "event: changed")
	}
	for _, closeFn := range closers {
		closeFn()
	}
	for ctx := testCtx(t); consumers() != before; {
		select {
		case <-ctx.Done():
			t.Fatalf("%d audit consumers left after the pages closed", consumers()-before)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A stream opened after the page missed a change says so at once.
func TestLive_AStreamOpenedLateReportsWhatThePageMissed(t *testing.T) {
	t.Parallel()
	r := startRig(t, "", console.Config{Open: true})
	w := signInOpen(t, r.base, "user:ops", "")
	env := r.call(t, "demo.echo", map[string]any{"n": 1}, alice)
	lines, closeFn := openStream(t, w, "/live/executions/"+env.ExecutionID+"?after=0")
	defer closeFn()
	waitFor(t, lines, "event: changed")

	// A page that showed every event but not yet the envelope hears of it.
	lines2, closeFn2 := openStream(t, w, "/live/executions/"+env.ExecutionID+"?after=999999999")
	defer closeFn2()
	waitFor(t, lines2, "event: changed")
}
