package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/natsserver"
)

// readyTimeout bounds how long StartCluster waits for JetStream to elect a meta
// leader and learn of every node.
const readyTimeout = 30 * time.Second

// Cluster is a JetStream cluster of embedded servers routed on loopback.
type Cluster struct {
	// Nodes are the servers, one Env each.
	Nodes []*Env
	// URLs are their client URLs, in the order of Nodes.
	URLs []string
}

// StartCluster starts n JetStream servers that route to each other, each with its
// own store directory, and returns once JetStream can place a stream replicated
// on all of them. All nodes are shut down when the test ends.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartCluster needs at least one node, got %d", n)
	}
	// Every node must list every other node's route, so all ports are chosen first.
	clientPorts := FreePorts(t, n)
	clusterPorts := FreePorts(t, n)
	c := &Cluster{}
	for i := range n {
		var routes []string
		for j, p := range clusterPorts {
			if j != i {
				routes = append(routes, routeURL(p))
			}
		}
		node := &Env{opts: natsserver.Options{
			StoreDir:    t.TempDir(),
			Port:        clientPorts[i],
			Name:        fmt.Sprintf("node-%d", i),
			ClusterPort: clusterPorts[i],
			Routes:      routes,
		}}
		for _, o := range opts {
			o(&node.opts)
		}
		c.Nodes = append(c.Nodes, node)
	}
	// Registered after the first t.TempDir, so it runs before the store
	// directories are removed: a node left running keeps writing there.
	t.Cleanup(c.stopAll)
	for _, node := range c.Nodes {
		node.start(t)
		c.URLs = append(c.URLs, node.URL)
	}
	c.waitReady(t)
	c.PushAccounts(t)
	return c
}

// PushAccounts sends the accounts of the cluster's auth setup (see Auth) to
// every node, as Env.PushAccounts does.
func (c *Cluster) PushAccounts(t testing.TB) { t.Helper(); pushAccounts(t, c.URL(), c.Nodes[0].opts) }

// URL returns the client URLs of all nodes, comma-separated, as nats.Connect takes them.
func (c *Cluster) URL() string { return strings.Join(c.URLs, ",") }

// Connect connects to any node of the cluster, with the same test options as
// Env.Connect. The connection is closed when the test ends.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URL(), append(adminCreds(t, c.Nodes[0].opts), opts...))
}

// ConnectAs connects to any node as principal of the cluster's auth setup.
func (c *Cluster) ConnectAs(t testing.TB, principal string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URL(), append(principalCreds(t, c.Nodes[0].opts, principal), opts...))
}

// StopNode shuts node i down now, as if it were lost.
func (c *Cluster) StopNode(i int) { c.Nodes[i].Stop() }

// RestartNode starts node i again on its store directory and ports; it rejoins
// the cluster.
func (c *Cluster) RestartNode(t testing.TB, i int) {
	t.Helper()
	c.Nodes[i].Restart(t)
}

func (c *Cluster) stopAll() {
	for _, node := range c.Nodes {
		node.Stop()
	}
}

// waitReady polls until JetStream can place a stream on every node. A meta
// leader answers the API before it has heard from all the other nodes, and a
// replicated create then fails with "no suitable peers for placement".
func (c *Cluster) waitReady(t testing.TB) {
	t.Helper()
	nc, err := nats.Connect(c.URL(), append(adminCreds(t, c.Nodes[0].opts),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))...)
	if err != nil {
		t.Fatalf("testenv: connect to cluster: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	probe := jetstream.StreamConfig{
		Name:     "TESTENV_READY",
		Subjects: []string{"_testenv.ready"},
		Storage:  jetstream.MemoryStorage,
		Replicas: len(c.Nodes),
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.CreateStream(reqCtx, probe)
		if err == nil {
			err = js.DeleteStream(reqCtx, probe.Name)
		}
		reqCancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: cluster cannot place a stream on all %d nodes after %s: %v", len(c.Nodes), readyTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StaleCopy makes the cluster's direct gets of stream answered, on one node,
// by a replica left behind as well as by the stream's own: a mirror that
// takes part in the stream's direct gets (MirrorDirect) holding only the
// message of subject, which the stream must hold, and nothing written
// since. A server hands a direct get to one of its own responders first,
// so a client of that node, whose index it returns, is answered "no such
// message" about every other subject about half the time, as by a replica
// that has not applied the last writes.
func (c *Cluster) StaleCopy(t testing.TB, stream, subject string) int {
	t.Helper()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	cfg := jetstream.StreamConfig{Name: stream + "_STALE", Storage: jetstream.MemoryStorage, Replicas: 1,
		Mirror: &jetstream.StreamSource{Name: stream, FilterSubject: subject}, MirrorDirect: true}
	var m jetstream.Stream
	for {
		// A cluster can drop the answer to a create: asked again, the same
		// configuration is no conflict.
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		m, err = js.CreateOrUpdateStream(tctx, cfg)
		tcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: stale copy of %s: %v", stream, err)
		}
	}
	// The mirror answers direct gets once it has copied a message.
	for {
		info, err := m.Info(ctx)
		if err == nil && info.State.Msgs > 0 {
			for i, node := range c.Nodes {
				if node.Server.Name() == info.Cluster.Leader {
					return i
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: stale copy of %s never copied %s: %v", stream, subject, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
