package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// On a cluster, a replica behind its stream's leader answers direct gets
// of what it has not applied "not found" (here a copy left behind takes part
// in the executions bucket's direct gets on one node). An execution that
// was accepted is never unknown to Status, read from every node, while it
// runs and after; Await answers its envelope; an id never submitted is still
// unknown. On an open server the client asks the bucket's leader; a
// producer of a secured one, which may send only direct gets, asks the
// workers.
func TestStatus_AReplicaBehindNeverMakesAnAcceptedExecutionUnknown(t *testing.T) {
	t.Parallel()
	for _, secured := range []bool{false, true} {
		name := map[bool]string{false: "Open", true: "Producer"}[secured]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			replicaBehind(t, secured)
		})
	}
}

func replicaBehind(t *testing.T, secured bool) {
	ctx := ctxT(t)
	var opts []testenv.Option
	principal := broker.Anonymous
	var setup *auth.Setup
	if secured {
		var err error
		if setup, err = auth.Init(t.TempDir(), ""); err != nil {
			t.Fatal(err)
		}
		if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
		opts, principal = append(opts, testenv.Auth(setup)), "alice"
	}
	c := testenv.StartCluster(t, 3, opts...)
	admin, err := broker.Provision(ctx, c.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wc := c.Connect(t)
	if secured {
		if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
			t.Fatal(err)
		}
		wc = c.ConnectAs(t, auth.WorkerPrincipal)
	}
	release := make(chan struct{})
	hold := executor.Define("test.hold", executor.Meta{Description: "Holds until the test lets it end.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		})
	startWorker(t, wc, executor.WorkerConfig{Concurrency: 32, Lease: 30 * time.Second}, hold)
	connect := func(node int) *nats.Conn {
		if secured {
			return c.Nodes[node].ConnectAs(t, principal)
		}
		return c.Nodes[node].Connect(t)
	}
	client := func(nc *nats.Conn) *executor.Client {
		cl, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "alice"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	submitter := client(connect(0))
	const n = 16
	ids := make([]string, n)
	for i := range ids {
		if ids[i], err = submitter.Submit(ctx, "test.hold", struct{}{}); err != nil {
			t.Fatal(err)
		}
	}
	// Every execution claimed (its record written) before a replica is left
	// behind: the copy holds the first's record alone.
	for _, id := range ids {
		waitUntil(t, "the record of "+id, func() bool {
			_, _, err := broker.LoadFromLeader[struct{}](ctx, admin.NC, admin.Executions, broker.Key(principal, id))
			return err == nil
		})
	}
	bucket := admin.Names.ExecutionsBucket()
	behind := c.StaleCopy(t, "KV_"+bucket, "$KV."+bucket+"."+broker.Key(principal, ids[0]))
	nc := connect(behind)
	reader := client(nc)
	raw, err := broker.Open(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	missed := 0
	for range 8 {
		for _, id := range ids[1:] {
			if _, _, err := broker.Load[struct{}](ctx, raw.Executions, broker.Key(principal, id)); errors.Is(err, broker.ErrNotFound) {
				missed++
			}
			st, err := reader.Status(ctx, id)
			if err != nil || st.Record == nil {
				t.Fatalf("status of %s, running: %+v, %v; want its record", id, st, err)
			}
		}
	}
	if missed == 0 {
		t.Fatal("no direct get was answered by the replica behind: the test proves nothing")
	}
	t.Logf("a direct get called %d of %d records absent", missed, 8*(n-1))
	if _, err := reader.Status(ctx, envelope.NewExecutionID()); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Fatalf("status of an id never submitted: %v, want ErrNoSuchExecution", err)
	}
	close(release)
	for _, id := range ids {
		if env, err := submitter.Await(ctx, id); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("await %s: %+v, %v", id, env, err)
		}
	}
	// Ended, with a replica of the envelopes bucket left behind: Await
	// answers each envelope, which no subscription will bring again.
	bucket = admin.Names.EnvelopesBucket()
	behind = c.StaleCopy(t, "KV_"+bucket, "$KV."+bucket+"."+broker.Key(principal, ids[0]))
	reader = client(connect(behind))
	for _, id := range ids[1:] {
		env, err := reader.Await(ctx, id)
		if err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("await %s, ended: %+v, %v", id, env, err)
		}
		st, err := reader.Status(ctx, id)
		if err != nil || st.Record == nil && st.Envelope == nil {
			t.Fatalf("status of %s, ended: %+v, %v", id, st, err)
		}
	}
}
