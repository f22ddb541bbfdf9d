// Package grantwatch is a worker's view of the grants bucket (package
// auth's grants, as an admin publishes them), kept current by one watcher:
// what decides stage 6 of every request and who may decide an approval.
package grantwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/kvwatch"
)

// Grants is a worker's view of the grants bucket, kept current by one watcher.
// Without a grants bucket the server runs open: every request comes from the
// anonymous principal, and CheckRequest lets it through. A bucket created
// later (an admin's first PublishGrants) is picked up, and from then on the
// anonymous principal is refused.
type Grants struct {
	ctx   context.Context
	js    jetstream.JetStream
	names broker.Names

	mu       sync.RWMutex
	open     bool
	m        map[string]auth.Grant
	watch    jetstream.KeyWatcher
	lastBind time.Time
	// changed is signalled (without blocking) at every grant written or
	// removed after the first reading.
	changed chan struct{}
}

// Watch reads the grants bucket and follows its changes until ctx ends.
func Watch(ctx context.Context, js jetstream.JetStream, n broker.Names) (*Grants, error) {
	g := &Grants{ctx: ctx, js: js, names: n, m: map[string]auth.Grant{}, changed: make(chan struct{}, 1)}
	if err := g.bind(); errors.Is(err, jetstream.ErrBucketNotFound) {
		g.open = true
	} else if err != nil {
		return nil, err
	}
	return g, nil
}

// bind opens the bucket and starts the watcher, returning once the current
// grants are read.
func (g *Grants) bind() error {
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	defer cancel()
	kv, err := g.js.KeyValue(ctx, g.names.GrantsBucket())
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return err
		}
		return fmt.Errorf("capstan: grants bucket: %w", err)
	}
	w, err := kv.WatchAll(g.ctx)
	if err != nil {
		return fmt.Errorf("capstan: watch grants: %w", err)
	}
	loaded := kvwatch.Follow(w, func(e jetstream.KeyValueEntry, _ bool) { g.apply(e) })
	select {
	case <-loaded:
	case <-ctx.Done():
		_ = w.Stop()
		return fmt.Errorf("capstan: read grants: %w", ctx.Err())
	}
	g.mu.Lock()
	g.watch, g.open = w, false
	g.mu.Unlock()
	return nil
}

// rebind looks for a grants bucket created since, at most once a second.
func (g *Grants) rebind() {
	g.mu.Lock()
	if !g.open || time.Since(g.lastBind) < time.Second {
		g.mu.Unlock()
		return
	}
	g.lastBind = time.Now()
	g.mu.Unlock()
	_ = g.bind()
}

func (g *Grants) apply(e jetstream.KeyValueEntry) {
	// Not an admin's: the grant held stands (none grants nothing).
	if from, err := kvwatch.Forged(g.ctx, g.js.Conn(), g.names.GrantsBucket(), e); from != "" {
		slog.Error("grant change not honoured: no admin put it", "principal", e.Key(), "stored by", from)
		return
	} else if err != nil {
		slog.Warn("grant change applied unchecked: its stored message could not be read", "principal", e.Key(), "err", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	defer func() {
		select {
		case g.changed <- struct{}{}:
		default:
		}
	}()
	if e.Operation() != jetstream.KeyValuePut {
		delete(g.m, e.Key())
		return
	}
	var gr auth.Grant
	if err := json.Unmarshal(e.Value(), &gr); err != nil || gr.Principal != e.Key() {
		delete(g.m, e.Key()) // an unreadable grant grants nothing
		return
	}
	g.m[e.Key()] = gr
}

// Changed receives a value after grants changed (one for any number of
// changes since it was last received): a worker looks for new principals'
// queues then. Never for a nil Grants.
func (g *Grants) Changed() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.changed
}

// Stop ends the watcher.
func (g *Grants) Stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	w := g.watch
	g.mu.Unlock()
	if w != nil {
		_ = w.Stop()
	}
}

// Open reports whether the server runs without grants (open mode). A nil
// Grants is open: a runtime that never looked for grants.
func (g *Grants) Open() bool {
	if g == nil {
		return true
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.open
}

// Lookup returns principal's grant.
func (g *Grants) Lookup(principal string) (auth.Grant, bool) {
	if g == nil {
		return auth.Grant{}, false
	}
	g.mu.RLock()
	gr, ok := g.m[principal]
	open := g.open
	g.mu.RUnlock()
	if !ok && open && principal != broker.Anonymous {
		g.rebind()
		g.mu.RLock()
		gr, ok = g.m[principal]
		g.mu.RUnlock()
	}
	return gr, ok
}

// CheckRequest decides stage 6 for a request that arrived under principal's
// subject: nil, or a CapabilityError UNAUTHENTICATED (no grant for the
// principal) or FORBIDDEN (the actor, surface or capability exceeds it), whose
// cause names the missing right. Actor well-formedness is checked before.
func (g *Grants) CheckRequest(principal string, actor envelope.Actor, surface, capabilityID string) error {
	if principal == broker.Anonymous {
		if g.Open() {
			return nil
		}
		return unauthenticated(fmt.Errorf("anonymous request on a server with grants"))
	}
	gr, ok := g.Lookup(principal)
	if !ok {
		return unauthenticated(fmt.Errorf("principal %q has no grant", principal))
	}
	return gr.CheckCall(actor, surface, capabilityID)
}

func unauthenticated(cause error) error {
	return &envelope.CapabilityError{Code: envelope.CodeUnauthenticated, Stage: envelope.StageActor,
		Message: "Not authenticated: the caller has no grant.", ExposeToModel: true, Cause: cause}
}

// Approver returns the identity principal's decisions carry, if it may decide
// approvals of types (see auth.Grant.ApproverFor). On an open server the decision
// names its own approver.
func (g *Grants) Approver(principal string, types []string) (envelope.Actor, bool, error) {
	if principal == broker.Anonymous && g.Open() {
		return envelope.Actor{}, true, nil
	}
	gr, ok := g.Lookup(principal)
	if !ok {
		return envelope.Actor{}, false, fmt.Errorf("principal %q has no grant", principal)
	}
	who, err := gr.ApproverFor(types)
	return who, false, err
}
