package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/kvwatch"
)

// PublishGrants gives every producer and admin its queue, bounded by its
// quotas (broker.ProvisionQueues: once the deployment is provisioned), then
// writes every principal's grant to the grants bucket (creating it when
// missing) and removes grants of principals the setup no longer has. Only an
// admin's connection may: workers read the bucket, nobody else sees it. It
// makes the operators' pauses and policies buckets too, when missing. A
// new bucket gets replicas copies (0: broker.DetectReplicas' choice).
func PublishGrants(ctx context.Context, js jetstream.JetStream, s *Setup, replicas int) error {
	n := s.Names()
	if err := broker.ProvisionQueues(ctx, js, n, queuesOf(s.Principals)); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	if replicas <= 0 {
		replicas = broker.DetectReplicas(ctx, js.Conn())
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: n.GrantsBucket(), History: 1, Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		if kv, err = js.KeyValue(ctx, n.GrantsBucket()); err != nil {
			return fmt.Errorf("capstan auth: grants bucket: %w", err)
		}
	}
	// The operators' buckets (DESIGN §18), empty until an admin pauses or
	// applies a policy set, are made here by an admin: a stream of a
	// worker's own on their subjects would otherwise keep them from ever
	// being made, and the emergency stop with them.
	for _, b := range []string{n.PausesBucket(), n.PoliciesBucket()} {
		if _, err := broker.OperatorBucket(ctx, js, b, true); err != nil {
			return fmt.Errorf("capstan auth: bucket %s: %w", b, err)
		}
	}
	want := map[string]bool{}
	for _, g := range s.Principals {
		g.AccountJWT = "" // the servers', not the workers'
		b, err := json.Marshal(g)
		if err != nil {
			return err
		}
		if _, err := kv.Put(ctx, g.Principal, b); err != nil {
			return fmt.Errorf("capstan auth: publish grant of %q: %w", g.Principal, err)
		}
		want[g.Principal] = true
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("capstan auth: list grants: %w", err)
	}
	for k := range keys.Keys() {
		if !want[k] {
			if err := kv.Delete(ctx, k); err != nil {
				return fmt.Errorf("capstan auth: remove grant of %q: %w", k, err)
			}
		}
	}
	return nil
}

// queuesOf are the queues grants call for (DESIGN §3): one for each producer
// and admin (who submit requests), bounded by its quotas; approvers,
// workers and notifiers submit none.
func queuesOf(grants []Grant) map[string]broker.QueueLimits {
	out := map[string]broker.QueueLimits{}
	for _, g := range grants {
		switch g.Role {
		case RoleProducer:
			q := g.Quotas.OrDefault()
			out[g.Principal] = broker.QueueLimits{Requests: q.QueuedRequests, Bytes: q.QueuedBytes}
		case RoleAdmin:
			out[g.Principal] = broker.QueueLimits{Requests: -1, Bytes: -1}
		}
	}
	return out
}

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
	m        map[string]Grant
	watch    jetstream.KeyWatcher
	lastBind time.Time
	// changed is signalled (without blocking) at every grant written or
	// removed after the first reading.
	changed chan struct{}
}

// WatchGrants reads the grants bucket and follows its changes until ctx ends.
func WatchGrants(ctx context.Context, js jetstream.JetStream, n broker.Names) (*Grants, error) {
	g := &Grants{ctx: ctx, js: js, names: n, m: map[string]Grant{}, changed: make(chan struct{}, 1)}
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
	var gr Grant
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
func (g *Grants) Lookup(principal string) (Grant, bool) {
	if g == nil {
		return Grant{}, false
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
	for _, check := range []struct {
		right string
		err   error
	}{
		{"this actor", gr.checkActor(actor)},
		{"this surface", gr.checkSurface(surface)},
		{"this capability", gr.checkCapability(capabilityID)},
	} {
		if check.err != nil {
			return &envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageActor,
				Message: "Not allowed: the caller has no grant for " + check.right + ".", ExposeToModel: true, Cause: check.err}
		}
	}
	return nil
}

func unauthenticated(cause error) error {
	return &envelope.CapabilityError{Code: envelope.CodeUnauthenticated, Stage: envelope.StageActor,
		Message: "Not authenticated: the caller has no grant.", ExposeToModel: true, Cause: cause}
}

// Approver returns the identity principal's decisions carry, if it may decide
// approvals of types (see Grant.checkTypes). On an open server the decision
// names its own approver.
func (g *Grants) Approver(principal string, types []string) (envelope.Actor, bool, error) {
	if principal == broker.Anonymous && g.Open() {
		return envelope.Actor{}, true, nil
	}
	gr, ok := g.Lookup(principal)
	if !ok {
		return envelope.Actor{}, false, fmt.Errorf("principal %q has no grant", principal)
	}
	if err := gr.checkTypes(types); err != nil {
		return envelope.Actor{}, false, err
	}
	return gr.identity(), false, nil
}
