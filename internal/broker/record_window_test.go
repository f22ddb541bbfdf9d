package broker_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A deployment has one record window (DESIGN §16): its first worker records
// its own; a later one set to another is refused, one set to none adopts it;
// and provisioning that changes the envelope retention keeps it.
func TestRecordWindow_OnePerDeployment(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	provision := func(cfg broker.Config) *broker.Broker {
		t.Helper()
		cfg.Logger = slog.New(slog.DiscardHandler)
		b, err := broker.Provision(ctx, nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if w, err := provision(broker.Config{}).RecordWindow(ctx); err != nil || w != 0 {
		t.Fatalf("a deployment no worker started: window %v (%v), want none", w, err)
	}

	first := provision(broker.Config{RecordWindow: 2 * time.Second})
	if err := first.AgreeRecordWindow(ctx, true); err != nil || first.Config.RecordWindow != 2*time.Second {
		t.Fatalf("first worker: %v, window %v", err, first.Config.RecordWindow)
	}
	other := provision(broker.Config{RecordWindow: 5 * time.Second})
	err := other.AgreeRecordWindow(ctx, true)
	if !errors.Is(err, broker.ErrRecordWindow) || !errors.Is(err, broker.ErrConfigConflict) {
		t.Fatalf("a worker set to another window: %v, want ErrRecordWindow (an ErrConfigConflict)", err)
	}
	t.Logf("refused: %v", err)
	unset := provision(broker.Config{})
	if err := unset.AgreeRecordWindow(ctx, false); err != nil || unset.Config.RecordWindow != 2*time.Second {
		t.Fatalf("a worker set to none: %v, window %v, want the deployment's 2s", err, unset.Config.RecordWindow)
	}
	same := provision(broker.Config{RecordWindow: 2 * time.Second})
	if err := same.AgreeRecordWindow(ctx, true); err != nil {
		t.Fatalf("a worker set to the deployment's window: %v", err)
	}

	// A server changing the envelope retention rewrites the resources'
	// record: the window stays.
	provision(broker.Config{EnvelopeRetention: 3 * time.Hour})
	if w, err := first.RecordWindow(ctx); err != nil || w != 2*time.Second {
		t.Fatalf("after a retention change: window %v (%v), want 2s", w, err)
	}
	if r, err := first.EnvelopeRetention(ctx); err != nil || r != 3*time.Hour {
		t.Fatalf("envelope retention %v (%v), want 3h", r, err)
	}
	if err := provision(broker.Config{RecordWindow: 5 * time.Second}).AgreeRecordWindow(ctx, true); !errors.Is(err, broker.ErrRecordWindow) {
		t.Fatalf("after a retention change, a worker set to another window: %v", err)
	}
}

// Workers that start at once with different windows on a new deployment:
// exactly one window is recorded, and only the workers set to it start.
func TestRecordWindow_RacingFirstWorkersAgreeOnOne(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	nc := env.Connect(t)
	windows := []time.Duration{time.Second, 3 * time.Second, time.Second, 3 * time.Second, time.Second, 3 * time.Second}
	brokers := make([]*broker.Broker, len(windows))
	for i, w := range windows {
		b, err := broker.Provision(ctx, nc, broker.Config{RecordWindow: w, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		brokers[i] = b
	}
	errs := make([]error, len(windows))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, b := range brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = b.AgreeRecordWindow(context.Background(), true)
		}()
	}
	close(start)
	wg.Wait()
	deployed, err := brokers[0].RecordWindow(ctx)
	if err != nil || (deployed != time.Second && deployed != 3*time.Second) {
		t.Fatalf("recorded window %v (%v)", deployed, err)
	}
	for i, w := range windows {
		switch {
		case w == deployed && errs[i] != nil:
			t.Errorf("worker %d, set to the recorded %v: refused: %v", i, w, errs[i])
		case w != deployed && !errors.Is(errs[i], broker.ErrRecordWindow):
			t.Errorf("worker %d, set to %v beside the recorded %v: %v, want ErrRecordWindow", i, w, deployed, errs[i])
		}
	}
}
