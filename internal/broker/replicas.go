package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxReplicas is the largest replica count JetStream accepts.
const MaxReplicas = 5

// clusterReplicas is what auto chooses on a cluster of at least that many
// JetStream servers: one node may be lost (or restarted) without losing
// availability or an acknowledged write.
const clusterReplicas = 3

// detectWait bounds how long DetectReplicas waits for servers to answer.
const detectWait = time.Second

func checkReplicas(n int, autoAllowed bool) error {
	if n == 0 && autoAllowed {
		return nil
	}
	if n < 1 || n > MaxReplicas {
		return fmt.Errorf("capstan: replicas %d: want 1 to %d", n, MaxReplicas)
	}
	return nil
}

// DetectReplicas returns the replica count that auto provisioning gives new
// resources on the deployment nc is connected to: 3 when the server reports
// a cluster of three or more JetStream servers, else 1.
//
// The servers are counted two ways, and the larger count wins: those that
// answer the account's STATZ ping (every JetStream server of the cluster that
// is up answers it), and those the connection knows (the URLs it was given and
// the ones the cluster advertised to it), so that a node that is down at this
// moment still counts when its URL was given.
func DetectReplicas(ctx context.Context, nc *nats.Conn) int {
	cluster := nc.ConnectedClusterName()
	if cluster == "" {
		return 1 // a server without a cluster: R1 is all it can hold
	}
	n := len(nc.Servers())
	if n < clusterReplicas {
		n = max(n, liveJetStreamServers(ctx, nc, cluster, clusterReplicas))
	}
	if n >= clusterReplicas {
		return clusterReplicas
	}
	return 1
}

// statzPing is the account-scoped ping every server of the cluster answers,
// with its name, cluster and whether it runs JetStream.
const statzPing = "$SYS.REQ.ACCOUNT.PING.STATZ"

// liveJetStreamServers counts the JetStream servers of cluster that answer
// the STATZ ping, returning as soon as enough have answered. A deployment
// without a system account, or a user not allowed to ping, counts 0.
func liveJetStreamServers(ctx context.Context, nc *nats.Conn, cluster string, enough int) int {
	ctx, cancel := context.WithTimeout(ctx, detectWait)
	defer cancel()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(statzPing, inbox, []byte(`{"include_unused":true}`)); err != nil {
		return 0
	}
	seen := map[string]bool{}
	for len(seen) < enough {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break
		}
		var r struct {
			Server struct {
				Name      string `json:"name"`
				Cluster   string `json:"cluster"`
				JetStream bool   `json:"jetstream"`
			} `json:"server"`
		}
		if json.Unmarshal(m.Data, &r) == nil && r.Server.JetStream && r.Server.Cluster == cluster && r.Server.Name != "" {
			seen[r.Server.Name] = true
		}
	}
	return len(seen)
}

// replicaChoice is Config.Replicas during one provisioning: an explicit
// count, or auto, which keeps what exists and detects once for what is new.
// Resources are created first and checked when they exist, so auto detects
// once per provisioning (at no cost on a single server).
type replicaChoice struct {
	nc          *nats.Conn
	explicit    int
	clusterSize int
	found       int // replicas of the first existing resource seen
	detected    int
}

// against returns the count an existing resource with have replicas must
// have: its own under auto, the explicit count otherwise.
func (rc *replicaChoice) against(have int) int {
	if rc.found == 0 {
		rc.found = have
	}
	if rc.explicit > 0 {
		return rc.explicit
	}
	return have
}

// forNew returns the count a resource that does not exist yet is created
// with. Under auto, new resources of an existing deployment follow it.
func (rc *replicaChoice) forNew(ctx context.Context) int {
	switch {
	case rc.explicit > 0:
		return rc.explicit
	case rc.found > 0:
		return rc.found
	case rc.detected == 0 && rc.clusterSize >= clusterReplicas:
		rc.detected = clusterReplicas
	case rc.detected == 0 && rc.clusterSize > 0:
		rc.detected = 1
	case rc.detected == 0:
		rc.detected = DetectReplicas(ctx, rc.nc)
	}
	return rc.detected
}

func replicasDiff(have, want int) string {
	return fmt.Sprintf("Replicas is %d, capstan needs %d (provisioning never changes replicas: "+
		"change them with 'capstan admin replicas %d', or leave replicas on auto)", have, want, want)
}

// Streams names the JetStream stream behind every stream and bucket of the
// design: the exec, audit and index streams, and the streams of the executions,
// envelopes, approvals, catalog, pools, limits and trail buckets, and the
// checkpoints'.
func (n Names) Streams() []string {
	return []string{
		n.ExecStream(), n.AuditStream(), n.IndexStream(),
		"KV_" + n.ExecutionsBucket(), "KV_" + n.EnvelopesBucket(),
		"KV_" + n.ApprovalsBucket(), "KV_" + n.CatalogBucket(), "KV_" + n.PoolsBucket(),
		"KV_" + n.LimitsBucket(), "KV_" + n.TrailBucket(), n.CheckpointStream(),
	}
}

// ReplicaChange reports one stream's replica count before and after SetReplicas.
type ReplicaChange struct {
	// Stream is the stream (a bucket's is KV_<bucket>).
	Stream string `json:"stream"`
	// From and To are its replica counts before and after.
	From, To int
}

// SetReplicas changes the replica count of every stream and bucket of the
// design (the principals' queues included), and of the extra streams named (those that do not exist are
// skipped), to n. It is the one way replicas change on an existing
// deployment: provisioning never changes them. Missing resources are
// provisioned first. It returns once every stream has a leader and, when
// scaling up, n current replicas, or when ctx ends.
//
// Consumers follow their stream's replica count.
func SetReplicas(ctx context.Context, nc *nats.Conn, cfg Config, n int, extraStreams ...string) ([]ReplicaChange, error) {
	if err := checkReplicas(n, false); err != nil {
		return nil, err
	}
	cfg.Replicas = 0 // auto: accept what exists, only create what is missing
	b, err := Provision(ctx, nc, cfg)
	if err != nil {
		return nil, err
	}
	names := append(b.Names.Streams(), extraStreams...)
	// The principals' queues follow the deployment's replicas too.
	queues, err := b.QueueNames(ctx)
	if err != nil {
		return nil, err
	}
	for _, q := range queues {
		if q != b.Names.ExecStream() {
			names = append(names, q)
		}
	}
	changes := make([]ReplicaChange, 0, len(names))
	for i, name := range names {
		s, err := b.JS.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) && i >= len(b.Names.Streams()) {
			continue
		}
		if err != nil {
			return changes, fmt.Errorf("capstan: read stream %s: %w", name, err)
		}
		sc := s.CachedInfo().Config
		change := ReplicaChange{Stream: name, From: sc.Replicas, To: n}
		if sc.Replicas != n {
			sc.Replicas = n
			if _, err := b.JS.UpdateStream(ctx, sc); err != nil {
				return changes, fmt.Errorf("capstan: stream %s: replicas %d to %d: %w", name, change.From, n, err)
			}
		}
		changes = append(changes, change)
	}
	for _, c := range changes {
		if err := waitReplicas(ctx, b.JS, c.Stream, n); err != nil {
			return changes, err
		}
	}
	return changes, nil
}

// waitReplicas waits until the stream reports n peers, a leader, and every
// follower current.
func waitReplicas(ctx context.Context, js jetstream.JetStream, name string, n int) error {
	var last string
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := js.Stream(reqCtx, name)
		cancel()
		if err == nil {
			info := s.CachedInfo()
			if settled(info, n) {
				return nil
			}
			last = describeGroup(info)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("capstan: stream %s did not settle at %d replicas (%s): %w", name, n, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func settled(info *jetstream.StreamInfo, n int) bool {
	if info.Config.Replicas != n {
		return false
	}
	ci := info.Cluster
	if ci == nil {
		return n == 1 // a server without a cluster
	}
	if ci.Leader == "" || len(ci.Replicas) != n-1 {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}

func describeGroup(info *jetstream.StreamInfo) string {
	ci := info.Cluster
	if ci == nil {
		return fmt.Sprintf("replicas %d, no cluster", info.Config.Replicas)
	}
	current := 0
	for _, r := range ci.Replicas {
		if r.Current && !r.Offline {
			current++
		}
	}
	return fmt.Sprintf("replicas %d, leader %q, %d of %d followers current", info.Config.Replicas, ci.Leader, current, len(ci.Replicas))
}

// ForbidRollups makes bucket's stream refuse a rollup: a message that
// would purge the bucket's other keys (or its own history) as it is
// stored. Only admins write the buckets this is for, and they never purge
// them; a worker could otherwise have a stream of its own republish one
// into them (see kvwatch.Republished).
func ForbidRollups(ctx context.Context, js jetstream.JetStream, bucket string) error {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowRollup {
		return nil
	}
	cfg.AllowRollup = false
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// OperatorBucket opens one of the buckets of operators' controls that only
// admins write (DESIGN §18: the pauses, the policy sets); with create, a
// missing one is made: one value per key, on file, replicated as the
// deployment is (auth.PublishGrants, which makes them, has them refuse
// rollups: ForbidRollups). Without create, a missing bucket is
// jetstream.ErrBucketNotFound.
func OperatorBucket(ctx context.Context, js jetstream.JetStream, bucket string, create bool) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if create && errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
			Storage: jetstream.FileStorage, Replicas: DetectReplicas(ctx, js.Conn())})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	return kv, err
}
