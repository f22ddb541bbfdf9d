package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
)

// PublishGrants writes every principal's grant to the grants bucket (creating
// it when missing) and removes grants of principals the setup no longer has.
// Only an admin's connection may: workers read the bucket, nobody else sees it.
// A new bucket gets replicas copies (0: broker.DetectReplicas' choice).
func PublishGrants(ctx context.Context, js jetstream.JetStream, s *Setup, replicas int) error {
	n := s.Names()
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
	want := map[string]bool{}
	for _, g := range s.Principals {
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

// Grants is a worker's view of the grants bucket, kept current by one watcher.
// Without a grants bucket the server runs open: every request comes from the
// anonymous principal, and Check lets it through.
type Grants struct {
	mu    sync.RWMutex
	open  bool
	m     map[string]Grant
	watch jetstream.KeyWatcher
}

// WatchGrants reads the grants bucket and follows its changes until ctx ends.
func WatchGrants(ctx context.Context, js jetstream.JetStream, n broker.Names) (*Grants, error) {
	g := &Grants{m: map[string]Grant{}}
	kv, err := js.KeyValue(ctx, n.GrantsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		g.open = true
		return g, nil
	}
	if err != nil {
		return nil, fmt.Errorf("capstan: grants bucket: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("capstan: watch grants: %w", err)
	}
	g.watch = w
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
			g.apply(e)
		}
		if initial {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		_ = w.Stop()
		return nil, ctx.Err()
	}
	return g, nil
}

func (g *Grants) apply(e jetstream.KeyValueEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
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

// Stop ends the watcher.
func (g *Grants) Stop() {
	if g.watch != nil {
		_ = g.watch.Stop()
	}
}

// Open reports whether the server runs without grants (open mode).
func (g *Grants) Open() bool { return g.open }

// Lookup returns principal's grant.
func (g *Grants) Lookup(principal string) (Grant, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	gr, ok := g.m[principal]
	return gr, ok
}

// CheckRequest decides stage 6 for a request that arrived under principal's
// subject: nil, or a CapabilityError UNAUTHENTICATED (no grant for the
// principal) or FORBIDDEN (the actor, surface or capability exceeds it), whose
// cause names the missing right. Actor well-formedness is checked before.
func (g *Grants) CheckRequest(principal string, actor envelope.Actor, surface, capabilityID string) error {
	if principal == broker.Anonymous {
		if g.open {
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
		{"this actor", gr.CheckActor(actor)},
		{"this surface", gr.CheckSurface(surface)},
		{"this capability", gr.CheckCapability(capabilityID)},
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
// approvals of types (see Grant.CheckTypes). On an open server the decision
// names its own approver.
func (g *Grants) Approver(principal string, types []string) (envelope.Actor, bool, error) {
	if principal == broker.Anonymous && g.open {
		return envelope.Actor{}, true, nil
	}
	gr, ok := g.Lookup(principal)
	if !ok {
		return envelope.Actor{}, false, fmt.Errorf("principal %q has no grant", principal)
	}
	if err := gr.CheckTypes(types); err != nil {
		return envelope.Actor{}, false, err
	}
	return gr.Identity(), false, nil
}
