package executor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
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
		// No control quota: the reads below ask the workers about sixty
		// times in a moment, and a refusal's wait and second ask would be
		// counted in the messages of the last status.
		q := auth.DefaultQuotas
		q.ControlPerSecond = -1
		if err := setup.Add(auth.Grant{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}, Quotas: &q}); err != nil {
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
	hold := holdUntil(release)
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
	for _, queued := range []bool{false, true} {
		// The record's direct get and the envelope's, then the leader's
		// reads of each on an open server, the workers asked by a producer;
		// unless the caller takes absence for queued (the MCP bridge's
		// polls): then a producer asks no worker, and spends none of its
		// principal's control quota.
		sctx, reads := ctx, 4
		switch {
		case secured && queued:
			sctx, reads = execrpc.TakeAbsenceAsQueued(ctx), 2
		case secured:
			reads = 3
		}
		before := nc.Stats().OutMsgs
		if _, err := reader.Status(sctx, envelope.NewExecutionID()); !errors.Is(err, executor.ErrNoSuchExecution) {
			t.Fatalf("status of an id never submitted (absence taken as queued: %v): %v, want ErrNoSuchExecution", queued, err)
		}
		if sent := nc.Stats().OutMsgs - before; sent != uint64(reads) {
			t.Errorf("status of an id never submitted (absence taken as queued: %v) sent %d messages, want %d", queued, sent, reads)
		}
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

// A producer's Status of another principal's execution on a cluster, where
// its reads find nothing and it asks the workers, reveals nothing of it,
// however often alice asks; bob's own Status, Await and listing answer as
// before, and his execution runs once.
func TestTenant_StatusOfAnotherPrincipalsExecutionOnAClusterRevealsNothing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"alice", "bob"} {
		if err := setup.Add(auth.Grant{Principal: p, Role: auth.RoleProducer, Actors: []string{"user:" + p}, Capabilities: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
	c := testenv.StartCluster(t, 3, testenv.Auth(setup))
	admin, err := broker.Provision(ctx, c.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var runs atomic.Int64
	hold := executor.Define("test.hold", executor.Meta{Description: "Holds until the test lets it end.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			runs.Add(1)
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		})
	startWorker(t, c.ConnectAs(t, auth.WorkerPrincipal), executor.WorkerConfig{Lease: 30 * time.Second}, hold)
	client := func(p string) *executor.Client {
		cl, err := executor.NewClient(c.Nodes[1].ConnectAs(t, p), executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: p}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	alice, bob := client("alice"), client("bob")
	id, err := bob.Submit(ctx, "test.hold", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bob's record", func() bool {
		_, _, err := broker.LoadFromLeader[struct{}](ctx, admin.NC, admin.Executions, broker.Key("bob", id))
		return err == nil
	})
	for i := range 10 {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := alice.StatusOf(rctx, "bob", id)
		cancel()
		if err == nil || st != nil {
			t.Fatalf("alice's status %d of bob's execution: %+v, %v; want a refusal and nothing of it", i, st, err)
		}
	}
	ctx = ctxT(t) // alice's reads wait out their timeouts: a fresh bound for bob's
	if st, err := bob.Status(ctx, id); err != nil || st.Record == nil {
		t.Fatalf("bob's status after alice's: %+v, %v; want his record", st, err)
	}
	if page, err := bob.Executions(ctx, executor.ExecutionsRequest{}); err != nil || len(page.Entries) == 0 {
		t.Fatalf("bob's listing after alice's: %+v, %v; want his execution", page, err)
	}
	close(release)
	if env, err := bob.Await(ctx, id); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob's await: %+v, %v", env, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("bob's execution ran %d times, want once", n)
	}
}

// TestHelperProcess_ReplicaBehind is a helper process, not a test of its
// own: the TypeScript client's tests (clients/typescript/test/cluster.test.ts)
// run the compiled test binary with CAPSTAN_HELPER_PROCESS=replica-behind, as
// a cluster where one node's direct gets are answered by a replica behind.
// It prints a JSON line naming that node's URL and executions that are
// running, whose records the replica behind lacks; once a line comes on
// its standard input, it lets them end and prints another, of the same
// executions ended, whose envelopes a replica behind lacks; it stops when
// its standard input closes, or after five minutes.
func TestHelperProcess_ReplicaBehind(t *testing.T) {
	if os.Getenv("CAPSTAN_HELPER_PROCESS") != "replica-behind" {
		t.Skip("a helper process of the TypeScript client's tests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := testenv.StartCluster(t, 3)
	admin, err := broker.Provision(ctx, c.Connect(t), broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	hold := holdUntil(release)
	startWorker(t, c.Connect(t), executor.WorkerConfig{Concurrency: 32, Lease: 5 * time.Minute}, hold)
	submitter, err := executor.NewClient(c.Nodes[0].Connect(t), executor.ClientConfig{Actor: envelope.Actor{Kind: "user", ID: "ada"}})
	if err != nil {
		t.Fatal(err)
	}
	defer submitter.Close()
	ids := make([]string, 8)
	for i := range ids {
		if ids[i], err = submitter.Submit(ctx, "test.hold", struct{}{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		waitUntil(t, "the record of "+id, func() bool {
			_, _, err := broker.LoadFromLeader[struct{}](ctx, admin.NC, admin.Executions, broker.Key(broker.Anonymous, id))
			return err == nil
		})
	}
	say := func(phase, bucket string) {
		node := c.StaleCopy(t, "KV_"+bucket, "$KV."+bucket+"."+broker.Key(broker.Anonymous, ids[0]))
		line, _ := json.Marshal(map[string]any{"phase": phase, "url": c.URLs[node], "ids": ids[1:]})
		fmt.Println(string(line))
	}
	in := bufio.NewScanner(os.Stdin)
	say("running", admin.Names.ExecutionsBucket())
	if !in.Scan() {
		return
	}
	close(release)
	for _, id := range ids {
		if env, err := submitter.Await(ctx, id); err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("await %s: %+v, %v", id, env, err)
		}
	}
	say("ended", admin.Names.EnvelopesBucket())
	go func() {
		for in.Scan() {
		}
		cancel()
	}()
	<-ctx.Done()
}

// holdUntil is test.hold, a write whose runs end when release closes.
func holdUntil(release <-chan struct{}) executor.Capability {
	return executor.Define("test.hold", executor.Meta{Description: "Holds until the test lets it end.",
		Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite},
		func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		})
}
