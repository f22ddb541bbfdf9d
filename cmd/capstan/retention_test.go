package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// envelopesTTL reads the envelopes bucket's TTL on the server at url.
func envelopesTTL(t *testing.T, url string) time.Duration {
	t.Helper()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	s, err := js.Stream(ctx, "KV_CAPSTAN_ENVELOPES")
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config.MaxAge
}

// `capstan server --envelope-retention` sets the envelopes bucket's TTL, and
// changes it on a store that kept another, saying so; 0 is refused.
func TestServer_EnvelopeRetentionFlag_SetsAndChangesTheBucketsTTL(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	listen := fmt.Sprintf("127.0.0.1:%d", port)

	first := startDaemon(t, serverReady, nil, "server", "--store", store, "--listen", listen)
	if got := envelopesTTL(t, url); got != 25*time.Hour {
		t.Fatalf("default retention: bucket TTL %v, want 25h", got)
	}
	if code := first.stop(t); code != exitOK {
		t.Fatalf("server exit %d", code)
	}
	second := startDaemon(t, serverReady, nil, "server", "--store", store, "--listen", listen, "--envelope-retention", "2h")
	if got := envelopesTTL(t, url); got != 2*time.Hour {
		t.Fatalf("--envelope-retention 2h over a 25h bucket: bucket TTL %v", got)
	}
	if out := second.out.String(); !strings.Contains(out, "envelope retention changed") || !strings.Contains(out, "to=2h0m0s") {
		t.Fatalf("the change is not logged:\n%s", out)
	}
	second.stop(t)

	if _, stderr, code := capstan(t, url, "server", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--envelope-retention", "0"); code != exitUsage ||
		!strings.Contains(stderr, "--envelope-retention") {
		t.Fatalf("--envelope-retention 0: exit %d, %s", code, stderr)
	}
}

// Awaiting an execution whose envelope expired (a real retention of a few
// seconds) exits 5 with a message saying so, at once; an id that is not a
// UUIDv7 is waited for as before.
func TestAwait_EnvelopeExpired_ExitsFive(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--envelope-retention", "3s")
	// A short lease: a record is not rewritten after its envelope, and says
	// the execution may be in flight until its lease runs out.
	startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker", "--lease", "1s")

	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"world"}`)
	if code != exitOK {
		t.Fatalf("call: exit %d\n%s%s", code, stdout, stderr)
	}
	id := decode[envelope.Envelope](t, stdout).ExecutionID

	// Wait until the bucket dropped the envelope.
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	kv, err := js.KeyValue(ctx, "CAPSTAN_ENVELOPES")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := kv.Get(ctx, broker.Key(broker.Anonymous, id)); errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the envelope never expired")
		case <-time.After(100 * time.Millisecond):
		}
	}

	// --wait is far longer than the test: only an answer at once passes.
	stdout, stderr, code = capstan(t, url, "await", "-o", "json", id, "--wait", "1h")
	if code != exitExpired || stdout != "" {
		t.Fatalf("await of an expired execution: exit %d, want %d\n%s%s", code, exitExpired, stdout, stderr)
	}
	for _, want := range []string{id, "expired", "3s", "never be answered", "capstan audit " + id} {
		if !strings.Contains(stderr, want) {
			t.Errorf("message %q does not say %q", stderr, want)
		}
	}
	// An id that is not a UUIDv7 cannot be aged: nothing stored of it is
	// no such execution, not an expired one.
	if _, stderr, code := capstan(t, url, "await", "-o", "json", "not-a-uuid", "--wait", "1h"); code != exitUnknown {
		t.Fatalf("await of an unknown id that is not a UUIDv7: exit %d, want %d\n%s", code, exitUnknown, stderr)
	}
}

// The server's collector target is 50 unless GOGC says otherwise.
func TestServerGC_FiftyUnlessGOGCIsSet(t *testing.T) {
	t.Setenv("GOGC", "200")
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	serverGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set, the target became %d", got)
	}
	if err := os.Unsetenv("GOGC"); err != nil { // t.Setenv restores it
		t.Fatal(err)
	}
	serverGC()
	if got := debug.SetGCPercent(100); got != 50 {
		t.Fatalf("without GOGC, the target is %d, want 50", got)
	}
}
