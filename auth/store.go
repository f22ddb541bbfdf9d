package auth

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
)

// PublishGrants gives every producer and admin its queue, bounded by its
// quotas (broker.ProvisionQueues: once the deployment is provisioned), then
// writes every principal's grant to the grants bucket (creating it when
// missing) and removes grants of principals the setup no longer has. Only an
// admin's connection may: workers read the bucket, nobody else sees it. It
// makes the operators' pauses and policies buckets too, when missing. A
// new bucket gets replicas copies (0: broker.DetectReplicas' choice).
func PublishGrants(ctx context.Context, js jetstream.JetStream, s *Setup, replicas int) error {
	n := s.names()
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
	if err := broker.ForbidRollups(ctx, js, n.GrantsBucket()); err != nil {
		return fmt.Errorf("capstan auth: grants bucket: refuse rollups: %w", err)
	}
	// The operators' buckets (DESIGN §18), empty until an admin pauses or
	// applies a policy set, are made here by an admin: a stream of a
	// worker's own on their subjects would otherwise keep them from ever
	// being made, and the emergency stop with them.
	for _, b := range []string{n.PausesBucket(), n.PoliciesBucket()} {
		if _, err := broker.OperatorBucket(ctx, js, b, true); err != nil {
			return fmt.Errorf("capstan auth: bucket %s: %w", b, err)
		}
		if err := broker.ForbidRollups(ctx, js, b); err != nil {
			return fmt.Errorf("capstan auth: bucket %s: refuse rollups: %w", b, err)
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
