package auditemit_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

// testCtx bounds each test's JetStream calls so a broken server fails the test
// instead of hanging it; it is a safety net, not a timing assertion.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func provision(t *testing.T, nc *nats.Conn, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, err := broker.Provision(testCtx(t), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newEmitter(t *testing.T, b *broker.Broker, opts auditemit.Options) *auditemit.Emitter {
	t.Helper()
	opts.Prefix, opts.Audit, opts.Index = b.Names.Prefix(), b.Audit, b.Index
	e := auditemit.New(b.NC, opts)
	t.Cleanup(func() { _ = e.Flush(context.Background()) })
	return e
}

func event(typ, executionID string) *audit.Event {
	return &audit.Event{Type: typ, ExecutionID: executionID, CapabilityID: "demo.echo",
		Actor: audit.Actor{ID: "alice", Kind: "user"}, Surface: "direct", Worker: "w1"}
}

func flush(t *testing.T, e *auditemit.Emitter) {
	t.Helper()
	if err := e.Flush(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// collect follows until n events passed the filter.
func collect(t *testing.T, b *broker.Broker, f audit.Filter, n int, opts ...audit.FollowOption) []audit.Event {
	t.Helper()
	var got []audit.Event
	stop := errors.New("enough")
	err := audit.Follow(testCtx(t), b.NC, b.Names.Prefix(), f, func(ev audit.Event) error {
		got = append(got, ev)
		if len(got) == n {
			return stop
		}
		return nil
	}, opts...)
	if !errors.Is(err, stop) {
		t.Fatalf("follow: %v", err)
	}
	return got
}

// fillAudit publishes filler on the audit stream until it refuses even the
// smallest write.
func fillAudit(t *testing.T, b *broker.Broker) {
	t.Helper()
	for _, size := range []int{256, 16, 0} {
		for i := 0; ; i++ {
			if i > 10000 {
				t.Fatal("the audit stream never refused a write")
			}
			if _, err := b.JS.Publish(testCtx(t), b.Names.AuditSubject("f"), make([]byte, size)); err != nil {
				break
			}
		}
	}
}

// recorder is a slog handler keeping every record.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

// asInt reads an integer of an event's data, whatever width msgpack chose.
func asInt(v any) int64 {
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	case uint64:
		return int64(n)
	}
	return -1
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

func (r *recorder) WithGroup(string) slog.Handler { return r }

func (r *recorder) warnings() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if rec.Level >= slog.LevelWarn {
			n++
		}
	}
	return n
}

func types(trail []audit.Event) []string {
	out := make([]string, len(trail))
	for i, ev := range trail {
		out[i] = ev.Type
	}
	return out
}

// emitExecution files one execution's trail as a worker does for a quick
// one: one message, which makes one index entry.
func emitExecution(e *auditemit.Emitter, id, principal, capID, actor, end string) {
	mk := func(typ string, data map[string]any) *audit.Event {
		return &audit.Event{Type: typ, ExecutionID: id, CapabilityID: capID, Principal: principal,
			Actor: audit.Actor{ID: actor, Kind: "user"}, Surface: "direct", Data: data}
	}
	evs := []*audit.Event{mk(audit.EventRequested, nil)}
	switch end {
	case "":
		evs = append(evs, mk(audit.EventStarted, map[string]any{"attempt": 1}))
	case audit.EventCompleted:
		evs = append(evs, mk(audit.EventStarted, map[string]any{"attempt": 1}), mk(audit.EventCompleted, map[string]any{"attempts": 1}))
	case audit.EventFailed:
		evs = append(evs, mk(audit.EventFailed, map[string]any{"code": "INPUT_INVALID"}))
	}
	e.EmitAll(evs...)
}

func ids(p *audit.Page) []string {
	out := make([]string, len(p.Entries))
	for i, e := range p.Entries {
		out[i] = e.ExecutionID
	}
	return out
}
