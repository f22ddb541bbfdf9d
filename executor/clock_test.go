package executor_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

// A worker whose clock is further from the server's than a sixth of its
// lease would take other workers' live attempts for lost ones (ahead) or
// keep lost ones (behind): it refuses to start, saying how far off its
// clock is and what to do; one within the bound starts.
func TestClock_AWorkerWhoseClockIsOffRefusesToStart(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for _, tc := range []struct {
		off    time.Duration
		starts bool
		says   string
	}{
		{40 * time.Second, false, "ahead of the NATS server's"},
		{-40 * time.Second, false, "behind the NATS server's"},
		{2 * time.Second, true, ""}, // within 5 s, a sixth of the default lease
	} {
		reg, err := executor.NewRegistry(echoCap(new(atomic.Int64)))
		if err != nil {
			t.Fatal(err)
		}
		off := tc.off
		cfg := testhooks.Worker(executor.WorkerConfig{StartupWait: time.Second},
			testhooks.WorkerKnobs{Clock: func() time.Time { return time.Now().Add(off) }})
		w, err := executor.NewWorker(env.Connect(t), reg, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctxT(t))
		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()
		select {
		case err := <-ran:
			if tc.starts || err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "NTP") {
				t.Errorf("clock %s off: Run = %v, want it to refuse, saying %q", off, err, tc.says)
			}
		case <-w.Ready():
			if !tc.starts {
				t.Errorf("clock %s off: the worker started", off)
			}
		}
		cancel()
	}
}

// A worker whose clock drifts off once it runs says so in its log, at every
// renewal of the catalog that finds it off, and goes on.
func TestClock_AClockThatDriftsOffIsLogged(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	var off atomic.Int64
	logged := make(chan string, 16)
	log := slog.New(&recordingHandler{out: logged})
	cfg := testhooks.Worker(executor.WorkerConfig{Logger: log, CatalogTTL: 900 * time.Millisecond},
		testhooks.WorkerKnobs{Clock: func() time.Time { return time.Now().Add(time.Duration(off.Load())) }})
	startWorker(t, env.Connect(t), cfg, echoCap(new(atomic.Int64)))
	off.Store(int64(time.Minute))
	for {
		select {
		case m := <-logged:
			if strings.Contains(m, "clock off") && strings.Contains(m, "ahead of the NATS server's") {
				return
			}
		case <-ctxT(t).Done():
			t.Fatal("a clock a minute ahead was never logged")
		}
	}
}

// recordingHandler sends each error record's message and attributes to out.
type recordingHandler struct{ out chan<- string }

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	select {
	case h.out <- b.String():
	default:
	}
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }
