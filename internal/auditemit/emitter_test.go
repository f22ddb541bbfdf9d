package auditemit_test

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestEmitSync_FailsUnavailableWhenTheStreamRefuses(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{AuditMaxBytes: 16 << 10, AuditDiscardNew: true})
	e := newEmitter(t, b, auditemit.Options{})
	if err := e.EmitSync(testCtx(t), event(audit.EventStarted, "before")); err != nil {
		t.Fatalf("with room: %v", err)
	}
	fillAudit(t, b)
	err := e.EmitSync(testCtx(t), event(audit.EventStarted, "after"))
	if !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("err %v, want audit.ErrUnavailable", err)
	}
	if e.Failed() != 1 {
		t.Fatalf("failed %d, want 1", e.Failed())
	}
}

func TestEmit_RefusedEventIsCountedAndLogged(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{AuditMaxBytes: 16 << 10, AuditDiscardNew: true})
	log := &recorder{}
	e := newEmitter(t, b, auditemit.Options{Logger: slog.New(log)})
	fillAudit(t, b)
	e.Emit(event(audit.EventRequested, "refused"))
	flush(t, e)
	if e.Failed() != 1 || log.warnings() != 1 {
		t.Fatalf("failed %d, warnings %d; want 1 and 1", e.Failed(), log.warnings())
	}
}

// Events of each execution stay in emission order on the stream, whatever
// the other executions emitting at once do.
func TestEmit_EachExecutionsEventsKeepTheirOrder(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	const executions, perExecution = 200, 20
	var wg sync.WaitGroup
	for i := 0; i < executions; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < perExecution; n++ {
				ev := event(audit.EventRetried, fmt.Sprintf("exec-%d", i))
				ev.Data = map[string]any{"attempt": n}
				e.Emit(ev)
			}
		}()
	}
	wg.Wait()
	flush(t, e)
	if e.Failed() != 0 {
		t.Fatalf("%d events failed", e.Failed())
	}
	next := map[string]int64{}
	for _, ev := range collect(t, b, audit.Filter{}, executions*perExecution, audit.FromStart()) {
		n := asInt(ev.Data["attempt"])
		if n != next[ev.ExecutionID] {
			t.Fatalf("%s: event %d arrived when %d was due", ev.ExecutionID, n, next[ev.ExecutionID])
		}
		next[ev.ExecutionID]++
	}
	if len(next) != executions {
		t.Fatalf("%d executions on the stream, want %d", len(next), executions)
	}
}
