package executor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/inputcheck"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
	"github.com/capstan-dev/capstan/internal/kvwatch"
)

// Descriptor is a capability as the catalog and discovery show it.
type Descriptor struct {
	V                int        `json:"v"`                          // the schema version, envelope.Version
	ID               string     `json:"id"`                         // the capability's id, its catalog key
	Pool             string     `json:"pool"`                       // the pool of the workers that serve it
	Description      string     `json:"description"`                // Meta.Description
	SideEffect       SideEffect `json:"sideEffect"`                 // Meta.SideEffect
	Risk             Risk       `json:"risk,omitempty"`             // Meta.Risk; empty when not graded
	Tags             []string   `json:"tags,omitempty"`             // Meta.Tags
	Expose           []Surface  `json:"expose,omitempty"`           // Meta.Expose: the surfaces that may see and call it
	Idempotent       bool       `json:"idempotent,omitempty"`       // Meta.Idempotent
	TimeoutMs        int64      `json:"timeoutMs"`                  // the per-attempt timeout in milliseconds, the default applied
	RetryMaxAttempts int        `json:"retryMaxAttempts,omitempty"` // retries after the first attempt (Retry.MaxAttempts); 0 for none
	RequiresApproval bool       `json:"requiresApproval,omitempty"` // every call waits for an approval (ApprovalRule.Required)
	// Unclaimed: a read that runs without a claim (Meta.Idempotent): a run
	// lost with its worker runs again rather than ending OUTCOME_UNKNOWN,
	// and status says queued until its envelope is written.
	Unclaimed bool `json:"unclaimed,omitempty"`
	// ApprovalPolicies name the capability's policies that may require an
	// approval for some inputs (Policy.MayRequireApproval).
	ApprovalPolicies []string `json:"approvalPolicies,omitempty"`
	// InputSchema is the JSON Schema of the input type, derived from it;
	// what an MCP client is shown as the tool's input schema.
	InputSchema map[string]any `json:"inputSchema,omitempty"`
	// Limits are the capability's limits (DESIGN §17), so that an agent
	// sees them before it calls.
	Limits []LimitInfo `json:"limits,omitempty"`
	// Paused is set in a description when an operator paused the
	// capability for the caller who asked (DESIGN §18); never in the
	// catalog.
	Paused *PauseInfo `json:"paused,omitempty"`
	// ExpiresAt is when the entry lapses unless a live worker of the pool
	// renews it (DESIGN §13): every worker renews its capabilities' entries
	// and its pool's own every third of the catalog TTL.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
}

// poolKey is the catalog key of a pool's liveness entry: capability ids never
// start with "_".
func poolKey(pool string) string { return "_pool." + pool }

// defaultCatalogTTL is how long a catalog entry lasts without renewal.
const defaultCatalogTTL = 30 * time.Second

func describe(b *binding, pool string) Descriptor {
	m := b.meta
	return Descriptor{
		V: envelope.Version, ID: b.id, Pool: pool, Description: m.Description, SideEffect: m.SideEffect,
		Risk: m.Risk, Tags: m.Tags, Expose: m.Expose, Idempotent: m.Idempotent,
		TimeoutMs: m.timeout().Milliseconds(), RetryMaxAttempts: m.maxAttempts(),
		RequiresApproval: m.Approval != nil && m.Approval.Required,
		Unclaimed:        b.unclaimed(),
		ApprovalPolicies: approvalPolicies(m.Policies),
		InputSchema:      inputSchema(b),
		Limits:           limitInfos(m.Limits, b.id),
	}
}

// approvalPolicies are the names of the policies that declare they may
// require an approval.
func approvalPolicies(ps []Policy) []string {
	var out []string
	for _, p := range ps {
		if p.MayRequireApproval {
			out = append(out, p.Name)
		}
	}
	return out
}

// MayRequireApproval reports whether a call may need an approval: always,
// or for some inputs.
func (d Descriptor) MayRequireApproval() bool {
	return d.RequiresApproval || len(d.ApprovalPolicies) > 0
}

// inputSchema is the JSON Schema of the capability's input type.
func inputSchema(b *binding) map[string]any { return inputcheck.JSONSchema(b.inShape) }

// publishCatalog writes this worker's capabilities and its pool's liveness
// entry, refusing to take over a capability another pool serves.
func (w *Worker) publishCatalog(ctx context.Context) error { return w.writeCatalog(ctx, false) }

// writeCatalog writes the worker's entries; renewing, it skips those another
// worker of the pool renewed less than a third of the TTL ago, so that a pool
// renews each entry about once a period, however many workers it has.
func (w *Worker) writeCatalog(ctx context.Context, renewing bool) error {
	now := time.Now().UTC()
	expires := now.Add(w.cfg.CatalogTTL)
	fresh := func(id string) bool {
		have, ok := w.cat.get(id)
		return renewing && ok && have.Pool == w.cfg.Pool && have.ExpiresAt.After(now.Add(w.cfg.CatalogTTL*2/3))
	}
	for _, id := range w.reg.ids {
		if fresh(id) {
			continue
		}
		d := describe(w.reg.get(id), w.cfg.Pool)
		d.ExpiresAt = expires
		have, _, err := broker.Load[Descriptor](ctx, w.b.Catalog, id)
		switch {
		case err == nil && have.Pool != w.cfg.Pool && w.cat.listed(id):
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
	if fresh(poolKey(w.cfg.Pool)) {
		return nil
	}
	return w.heartbeat(ctx, expires)
}

// heartbeat writes the pool's liveness entry.
func (w *Worker) heartbeat(ctx context.Context, expires time.Time) error {
	d := Descriptor{V: envelope.Version, ID: poolKey(w.cfg.Pool), Pool: w.cfg.Pool, ExpiresAt: expires}
	b, err := envelope.Marshal(&d)
	if err != nil {
		return err
	}
	if _, err := w.b.Catalog.Put(ctx, d.ID, b); err != nil {
		return fmt.Errorf("capstan: write catalog: %w", err)
	}
	w.cat.set(d)
	return nil
}

// renewCatalog renews the worker's catalog entries every third of the
// catalog TTL until ctx ends: a capability no live worker serves lapses.
func (w *Worker) renewCatalog(ctx context.Context) {
	t := time.NewTicker(w.cfg.CatalogTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		putCtx, cancel := context.WithTimeout(ctx, w.cfg.CatalogTTL/3)
		if err := w.writeCatalog(putCtx, true); err != nil && ctx.Err() == nil {
			w.log.Warn("catalog not renewed", "err", err)
		}
		// A retention shrunk by a server since is followed within a renewal.
		w.run.ReadEnvelopeRetention(putCtx)
		w.watchClock(putCtx)
		cancel()
	}
}

func (c *catalog) get(id string) (Descriptor, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	d, ok := c.entries[id]
	return d, ok
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
	kv      jetstream.KeyValue // the bucket, for listedNow
}

// watchCatalog follows the catalog; an entry that does not decode is
// skipped and told to skipped. lag holds back each change after the first
// load (testhooks.WorkerKnobs.CatalogLag; 0 in production).
func watchCatalog(ctx context.Context, b *broker.Broker, lag time.Duration, skipped func(key string, err error)) (*catalog, error) {
	w, err := b.Catalog.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: watch catalog: %w", err)
	}
	c := &catalog{entries: map[string]Descriptor{}, w: w, kv: b.Catalog}
	loaded := kvwatch.Follow(w, func(e jetstream.KeyValueEntry, initial bool) {
		if lag > 0 && !initial {
			select {
			case <-time.After(lag):
			case <-ctx.Done():
			}
		}
		c.mu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			var d Descriptor
			if err := envelope.Unmarshal(e.Value(), &d); err == nil {
				c.entries[e.Key()] = d
			} else {
				delete(c.entries, e.Key()) // an entry that does not decode lists nothing
				skipped(e.Key(), err)
			}
		} else {
			delete(c.entries, e.Key())
		}
		c.mu.Unlock()
	})
	select {
	case <-loaded:
		return c, nil
	case <-time.After(30 * time.Second):
		_ = w.Stop()
		return nil, errors.New("capstan: the catalog did not load within 30s")
	}
}

// listed reports whether a capability is to be routed to its pool: its entry
// is live, or its whole pool is down (no live worker renews the pool's
// entry), in which case requests wait for the pool until their start
// deadline. An entry that lapsed while its pool lives is a capability the
// pool no longer serves: CAPABILITY_NOT_FOUND.
func (c *catalog) listed(id string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.listedLocked(id, time.Now())
}

// listedNow is listed, asking the bucket itself when the copy does not list
// id: the watcher's copy may not yet have the entry a newer worker has just
// written, which the producer that routed the request here had read. A
// worker decides with it whether a request for a capability it lacks waits
// for another worker, or is forwarded to it, or ends CAPABILITY_NOT_FOUND;
// err when the bucket did not answer, which proves nothing.
func (c *catalog) listedNow(id string) (bool, error) {
	if c.listed(id) {
		return true, nil
	}
	if strings.HasPrefix(id, "_") || envelope.ValidCapabilityID(id) != nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	listed, _, err := storeListed(ctx, c.kv, id)
	return listed, err
}

func (c *catalog) listedLocked(id string, now time.Time) bool {
	d, ok := c.entries[id]
	if !ok || strings.HasPrefix(id, "_") {
		return false
	}
	if now.Before(d.ExpiresAt) {
		return true
	}
	pool, ok := c.entries[poolKey(d.Pool)]
	return !ok || !now.Before(pool.ExpiresAt)
}

// all returns the listed capabilities.
func (c *catalog) all() []Descriptor {
	c.mu.RLock()
	defer c.mu.RUnlock()
	now := time.Now()
	out := make([]Descriptor, 0, len(c.entries))
	for id, d := range c.entries {
		if c.listedLocked(id, now) {
			out = append(out, d)
		}
	}
	return out
}

func (c *catalog) stop() { _ = c.w.Stop() }

func sortDescriptors(d []Descriptor) {
	sort.Slice(d, func(i, j int) bool { return d[i].ID < d[j].ID })
}

// placement is where a request for a capability goes, and whether a live
// worker serves it, as the client tells from the catalog.
type placement struct {
	// listed: the catalog lists the capability (some pool serves it, or its
	// pool is down; see catalog.listed), and its requests go to its pool;
	// else to _unrouted, where a worker decides.
	listed bool
	// unserved is set when no live worker serves it: its pool is down, or
	// no pool lists it and no worker runs at all. Nil when a worker serves
	// it, or answers for it (an _unrouted request ends
	// CAPABILITY_NOT_FOUND), or the catalog could not be read.
	unserved *UnservedError
	// unread: the catalog could not be read, and nothing is known.
	unread bool
}

// place reads the catalog for capability id: the watched copy of an
// anonymous client, or the bucket by key for a principal's, whose live
// entries are remembered for catalogProbeTTL (the common case costs no round
// trip). Only a capability with no entry at all asks further, whether any
// worker runs: the anonymous client from its copy (a live pool), a
// principal's by a probe the workers answer (no responder: none runs).
func (c *Client) place(ctx context.Context, id string) placement {
	if envelope.ValidCapabilityID(id) != nil {
		return placement{}
	}
	if c.cat != nil {
		if p, found := c.cat.place(id, time.Now()); p.unserved == nil && found {
			return p
		}
		// The copy may lag what a worker has just written: the bucket
		// tells, on this path alone.
	} else if c.probe.fresh(id) {
		return placement{listed: true}
	}
	d, pool, err := entryAndPool(ctx, c.b.Catalog, id)
	if err != nil {
		return placement{unread: true} // unknown: _unrouted, where a worker decides
	}
	p := placeOf(id, d, pool, time.Now())
	switch {
	case p.listed && p.unserved == nil && c.probe != nil:
		c.probe.seen(id)
	case d == nil && c.anyWorker(ctx):
		p.unserved = nil // workers answer for it: CAPABILITY_NOT_FOUND
	}
	return p
}

// placeOf decides from id's catalog entry d and its pool's liveness entry
// (nil when absent); an absent entry is unserved here, which the caller
// takes back when any worker runs.
func placeOf(id string, d, pool *Descriptor, now time.Time) placement {
	switch {
	case d == nil:
		return placement{unserved: &UnservedError{CapabilityID: id}}
	case now.Before(d.ExpiresAt):
		return placement{listed: true}
	case pool != nil && now.Before(pool.ExpiresAt):
		return placement{} // a capability its pool no longer serves: CAPABILITY_NOT_FOUND
	}
	u := &UnservedError{CapabilityID: id, Pool: d.Pool}
	if pool != nil {
		u.LapsedAt = pool.ExpiresAt
	}
	return placement{listed: true, unserved: u}
}

// anyWorker reports whether a worker of any pool runs, from a request only
// workers answer (none subscribed: no responder, at once); yes when it
// cannot be told.
func (c *Client) anyWorker(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	_, err := execrpc.Ask[ExecutionView](pctx, c.b.NC, c.b.Names, c.b.Names.ExecutionSubject, &ExecutionRequest{V: envelope.Version, ExecutionID: envelope.NewExecutionID(), Owner: c.principal, Probe: true}, "probe the workers")
	return !errors.Is(err, ErrNoWorkers)
}

// place is placeOf id's entry and its pool's liveness entry in the watched
// copy, and whether the copy has id's entry. It copies no entry to the heap:
// a client places every call.
func (c *catalog) place(id string, now time.Time) (p placement, found bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.entries[id]
	if !ok {
		return placeOf(id, nil, nil, now), false
	}
	var pool *Descriptor
	if pe, ok := c.entries[poolKey(e.Pool)]; ok {
		pool = &pe
	}
	return placeOf(id, &e, pool, now), true
}

// catalogProbe reads catalog entries one key at a time and remembers the
// live ones it found for a while: one read per capability every
// catalogProbeTTL.
type catalogProbe struct {
	mu   sync.Mutex
	live map[string]time.Time
}

const catalogProbeTTL = 10 * time.Second

// fresh reports whether id's entry was found live less than catalogProbeTTL ago.
func (p *catalogProbe) fresh(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.live[id]
	return ok && time.Since(at) < catalogProbeTTL
}

func (p *catalogProbe) seen(id string) {
	p.mu.Lock()
	p.live[id] = time.Now()
	p.mu.Unlock()
}

// entryAndPool reads id's entry from the bucket, and its pool's liveness
// entry when id's has lapsed; err when the bucket did not answer.
func entryAndPool(ctx context.Context, kv jetstream.KeyValue, id string) (d, pool *Descriptor, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d, err = loadEntry(ctx, kv, id); err != nil || d == nil || time.Now().Before(d.ExpiresAt) {
		return d, nil, err
	}
	pool, err = loadEntry(ctx, kv, poolKey(d.Pool))
	return d, pool, err
}

// storeListed reads from the catalog bucket itself whether it lists id, by
// catalog.listed's rule, and whether its entry is live; err when the bucket
// did not answer. An entry that does not decode lists nothing, as in the
// watcher's copy.
func storeListed(ctx context.Context, kv jetstream.KeyValue, id string) (listed, live bool, err error) {
	d, err := loadEntry(ctx, kv, id)
	if err != nil || d == nil {
		return false, false, err
	}
	now := time.Now()
	if now.Before(d.ExpiresAt) {
		return true, true, nil
	}
	// Lapsed: listed only while its whole pool is down.
	pool, err := loadEntry(ctx, kv, poolKey(d.Pool))
	if err != nil {
		return false, false, err
	}
	return pool == nil || !now.Before(pool.ExpiresAt), false, nil
}

// loadEntry reads one catalog entry: nil when there is none, or it does not
// decode; err when the bucket did not answer.
func loadEntry(ctx context.Context, kv jetstream.KeyValue, key string) (*Descriptor, error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, nil
	case err != nil:
		return nil, err
	}
	var d Descriptor
	if envelope.Unmarshal(e.Value(), &d) != nil {
		return nil, nil
	}
	return &d, nil
}
