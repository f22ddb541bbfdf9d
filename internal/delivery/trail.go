package delivery

import (
	"context"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
)

// trail files an execution's audit events (DESIGN §8). While it holds them,
// they are kept and published together, as one message: before the claim
// (they are dropped if the claim finds another record, whose execution has
// its own trail), and for a short while after the attempt starts, so that an
// execution that ends quickly is one message on the trail (DESIGN §14).
// Events reach the emitter under the trail's lock, so that they reach the
// stream in the order they were filed, whoever flushes.
type trail struct {
	audit  *audit.Emitter
	worker string

	mu      sync.Mutex
	held    []*audit.Event
	holding bool
	timer   *time.Timer
}

// holdEvents is how long an attempt's first events wait for its end, to be
// published with it as one message.
const holdEvents = 20 * time.Millisecond

// publish files ev: kept while the trail holds its events, published at
// once otherwise.
func (t *trail) publish(ev *audit.Event) {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding {
		t.held = append(t.held, ev)
		return
	}
	t.audit.Emit(ev)
}

// hold starts keeping the events.
func (t *trail) hold() {
	t.mu.Lock()
	t.holding = true
	t.mu.Unlock()
}

// flush ends holding: what was kept is published as one message, then
// every later event at once.
func (t *trail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := t.held
	t.held, t.holding = nil, false
	if t.timer != nil {
		t.timer.Stop()
	}
	if len(evs) > 0 {
		t.audit.EmitAll(evs...)
	}
}

// flushSync is flush with ev added, acknowledged by JetStream before it
// returns (strict audit).
func (t *trail) flushSync(ctx context.Context, ev *audit.Event) error {
	ev.Worker = t.worker
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := append(t.held, ev)
	t.held, t.holding = nil, false
	if t.timer != nil {
		t.timer.Stop()
	}
	return t.audit.EmitAllSync(ctx, evs...)
}

// drop forgets what is held: the claim found another record.
func (t *trail) drop() {
	t.mu.Lock()
	t.held, t.holding = nil, false
	t.mu.Unlock()
}

// flushSoon publishes what is held after holdEvents, unless the execution
// ends first and publishes it with its terminal event.
func (t *trail) flushSoon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holding && t.timer == nil {
		t.timer = time.AfterFunc(holdEvents, t.flush)
	}
}
