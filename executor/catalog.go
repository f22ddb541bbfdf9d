package executor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/inputcheck"
	"github.com/nats-io/nats.go/jetstream"
)

// Descriptor is a capability as the catalog and discovery show it.
type Descriptor struct {
	V                int            `json:"v"`
	ID               string         `json:"id"`
	Pool             string         `json:"pool"`
	Description      string         `json:"description"`
	SideEffect       SideEffect     `json:"sideEffect"`
	Risk             Risk           `json:"risk,omitempty"`
	Tags             []string       `json:"tags,omitempty"`
	Expose           []Surface      `json:"expose,omitempty"`
	Idempotent       bool           `json:"idempotent,omitempty"`
	TimeoutMs        int64          `json:"timeoutMs"`
	RetryMaxAttempts int            `json:"retryMaxAttempts,omitempty"`
	RequiresApproval bool           `json:"requiresApproval,omitempty"`
	InputSchema      map[string]any `json:"inputSchema,omitempty"`
}

func describe(b *binding, pool string) Descriptor {
	m := b.meta
	return Descriptor{
		V: envelope.Version, ID: b.id, Pool: pool, Description: m.Description, SideEffect: m.SideEffect,
		Risk: m.Risk, Tags: m.Tags, Expose: m.Expose, Idempotent: m.Idempotent,
		TimeoutMs: m.timeout().Milliseconds(), RetryMaxAttempts: m.maxAttempts(),
		RequiresApproval: m.Approval != nil && m.Approval.Required,
		InputSchema:      inputSchema(b),
	}
}

// inputSchema is the JSON Schema of the capability's input type.
func inputSchema(b *binding) map[string]any { return inputcheck.JSONSchema(b.inShape) }

// publishCatalog writes this worker's capabilities, refusing to take over a
// capability another pool serves.
func (w *Worker) publishCatalog(ctx context.Context) error {
	for _, id := range w.reg.ids {
		d := describe(w.reg.get(id), w.cfg.Pool)
		have, _, err := broker.Load[Descriptor](ctx, w.b.Catalog, id)
		switch {
		case err == nil && have.Pool != w.cfg.Pool:
			return fmt.Errorf("%w: capability %s is served by pool %q; this worker is in pool %q",
				broker.ErrConfigConflict, id, have.Pool, w.cfg.Pool)
		case err != nil && !errors.Is(err, broker.ErrNotFound):
			return fmt.Errorf("capstan: read catalog: %w", err)
		}
		b, err := envelope.Marshal(&d)
		if err != nil {
			return err
		}
		if _, err := w.b.Catalog.Put(ctx, id, b); err != nil {
			return fmt.Errorf("capstan: write catalog: %w", err)
		}
		// The watcher will see the write too; the worker must not wait for it.
		w.cat.set(d)
	}
	return nil
}

func (c *catalog) set(d Descriptor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[d.ID] = d
}

// catalog is a live copy of the catalog bucket, kept by one watcher.
type catalog struct {
	mu      sync.RWMutex
	entries map[string]Descriptor
	w       jetstream.KeyWatcher
}

func watchCatalog(ctx context.Context, b *broker.Broker) (*catalog, error) {
	w, err := b.Catalog.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: watch catalog: %w", err)
	}
	c := &catalog{entries: map[string]Descriptor{}, w: w}
	ready := make(chan struct{})
	go func() {
		initial := true
		for e := range w.Updates() {
			if e == nil {
				if initial {
					initial = false
					close(ready)
				}
				continue
			}
			c.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				var d Descriptor
				if envelope.Unmarshal(e.Value(), &d) == nil {
					c.entries[e.Key()] = d
				}
			} else {
				delete(c.entries, e.Key())
			}
			c.mu.Unlock()
		}
		if initial {
			close(ready)
		}
	}()
	select {
	case <-ready:
		return c, nil
	case <-time.After(30 * time.Second):
		_ = w.Stop()
		return nil, errors.New("capstan: the catalog did not load within 30s")
	}
}

func (c *catalog) lookup(id string) (Descriptor, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	d, ok := c.entries[id]
	return d, ok
}

func (c *catalog) all() []Descriptor {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Descriptor, 0, len(c.entries))
	for _, d := range c.entries {
		out = append(out, d)
	}
	return out
}

func (c *catalog) stop() { _ = c.w.Stop() }

func sortDescriptors(d []Descriptor) {
	sort.Slice(d, func(i, j int) bool { return d[i].ID < d[j].ID })
}

// listed reports whether the catalog lists id (some pool serves it): a
// request for one it does not list goes to _unrouted.
func (c *Client) listed(id string) bool {
	if c.cat != nil {
		_, ok := c.cat.lookup(id)
		return ok
	}
	return c.probe.listed(id)
}

// catalogProbe reads catalog entries one key at a time and remembers the
// ones it found for a while: one read per capability every catalogProbeTTL.
type catalogProbe struct {
	kv   jetstream.KeyValue
	mu   sync.Mutex
	seen map[string]time.Time
}

const catalogProbeTTL = 10 * time.Second

func (p *catalogProbe) listed(id string) bool {
	p.mu.Lock()
	at, ok := p.seen[id]
	p.mu.Unlock()
	if ok && time.Since(at) < catalogProbeTTL {
		return true
	}
	if envelope.ValidCapabilityID(id) != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.kv.Get(ctx, id); err != nil {
		return false // absent, or unknown: _unrouted, where a worker decides
	}
	p.mu.Lock()
	p.seen[id] = time.Now()
	p.mu.Unlock()
	return true
}
