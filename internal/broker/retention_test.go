package broker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// envelopesBucket reads the envelopes bucket's stream.
func envelopesBucket(t *testing.T, ctx context.Context, js jetstream.JetStream) *jetstream.StreamInfo {
	t.Helper()
	return streamInfo(t, ctx, js, "CAPSTAN_ENVELOPES")
}

// A set envelope retention is the bucket's TTL: an existing bucket with
// another TTL (an earlier version's seven days) is shrunk to it, grown again,
// and each change is logged; what it holds stays.
func TestEnvelopeRetention_SetUpdatesAnExistingBucketAndLogsIt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	js := env.JetStream(t)
	kv, err := js.CreateKeyValue(ctx, capstanBucket("CAPSTAN_ENVELOPES", broker.DefaultRecordTTL, func(*jetstream.KeyValueConfig) {}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broker.Create(ctx, kv, "anonymous.e1", map[string]string{"status": "completed"}); err != nil {
		t.Fatal(err)
	}
	created := envelopesBucket(t, ctx, js).Created
	nc := env.Connect(t)

	for _, retention := range []time.Duration{2 * time.Hour, 30 * time.Hour, 3 * time.Second} {
		var logs logBuffer
		b := provision(t, nc, broker.Config{EnvelopeRetention: retention, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		info := envelopesBucket(t, ctx, js)
		if info.Config.MaxAge != retention || b.Config.EnvelopeRetention != retention {
			t.Fatalf("retention %v: bucket MaxAge %v, Config.EnvelopeRetention %v", retention, info.Config.MaxAge, b.Config.EnvelopeRetention)
		}
		if want := min(broker.DefaultDedupWindow, retention); info.Config.Duplicates != want {
			t.Errorf("retention %v: duplicate window %v, want %v", retention, info.Config.Duplicates, want)
		}
		if !info.Created.Equal(created) {
			t.Fatalf("retention %v: the bucket was made again (created %v, was %v)", retention, info.Created, created)
		}
		if line := logs.String(); !strings.Contains(line, "envelope retention changed") || !strings.Contains(line, "to="+retention.String()) {
			t.Errorf("retention %v: the change is not logged: %q", retention, line)
		}
		if retention > time.Minute {
			if _, _, err := broker.Load[map[string]string](ctx, b.Envelopes, "anonymous.e1"); err != nil {
				t.Fatalf("retention %v: the stored envelope is gone: %v", retention, err)
			}
		}
		// The same retention again changes nothing and logs nothing.
		logs = logBuffer{}
		provision(t, nc, broker.Config{EnvelopeRetention: retention, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if again := envelopesBucket(t, ctx, js); again.Config.MaxAge != retention || logs.String() != "" {
			t.Fatalf("retention %v provisioned again: MaxAge %v, logs %q", retention, again.Config.MaxAge, logs.String())
		}
	}
}

// Unset, the retention of an existing bucket is kept and read back: a worker
// that does not know it never undoes the server's setting.
func TestEnvelopeRetention_UnsetKeepsTheBucketsOwn(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	provision(t, nc, broker.Config{EnvelopeRetention: 2 * time.Hour})
	b := provision(t, nc, broker.Config{})
	if got := envelopesBucket(t, ctx, env.JetStream(t)).Config.MaxAge; got != 2*time.Hour || b.Config.EnvelopeRetention != 2*time.Hour {
		t.Fatalf("unset retention over a 2h bucket: MaxAge %v, Config.EnvelopeRetention %v; want both 2h", got, b.Config.EnvelopeRetention)
	}
	// A new bucket gets the default.
	fresh := testenv.Start(t)
	b = provision(t, fresh.Connect(t), broker.Config{})
	if got := envelopesBucket(t, ctx, fresh.JetStream(t)).Config.MaxAge; got != broker.DefaultEnvelopeRetention ||
		b.Config.EnvelopeRetention != broker.DefaultEnvelopeRetention {
		t.Fatalf("new bucket: MaxAge %v, Config.EnvelopeRetention %v; want %v", got, b.Config.EnvelopeRetention, broker.DefaultEnvelopeRetention)
	}
}

// A bucket that differs in anything but its TTL is still a conflict, whatever
// the retention asked for, and is left as it was; the error does not blame
// the TTL.
func TestEnvelopeRetention_OtherDifferencesStillConflict(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	js := env.JetStream(t)
	if _, err := js.CreateKeyValue(ctx, capstanBucket("CAPSTAN_ENVELOPES", time.Hour, func(c *jetstream.KeyValueConfig) { c.History = 5 })); err != nil {
		t.Fatal(err)
	}
	before := envelopesBucket(t, ctx, js)
	for _, retention := range []time.Duration{0, 2 * time.Hour} {
		_, err := broker.Provision(ctx, env.Connect(t), broker.Config{EnvelopeRetention: retention})
		if !errors.Is(err, broker.ErrConfigConflict) || !strings.Contains(err.Error(), "History") || strings.Contains(err.Error(), "TTL") {
			t.Fatalf("retention %v over a bucket with history 5: %v, want ErrConfigConflict naming History only", retention, err)
		}
		if after := envelopesBucket(t, ctx, js); after.Config.MaxAge != before.Config.MaxAge || after.Config.MaxMsgsPerSubject != 5 {
			t.Fatalf("retention %v: the conflicting bucket changed: %+v", retention, after.Config)
		}
	}
}
