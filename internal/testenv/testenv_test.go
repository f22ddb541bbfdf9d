package testenv_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// parallelGiven says whether go test was given -parallel, which RaiseParallel
// leaves as it is.
var parallelGiven bool

func TestMain(m *testing.M) {
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { parallelGiven = parallelGiven || f.Name == "test.parallel" })
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

// After RaiseParallel, 4 parallel tests per CPU (2 under the race detector)
// run at once: as many subtests as that all wait for each other, which only
// ends if they all run together. (Not itself parallel: it runs before the
// parallel tests, with every slot free for its subtests.)
func TestRaiseParallel_SeveralTestsPerCPURunAtOnce(t *testing.T) {
	if parallelGiven {
		t.Skip("-parallel given: RaiseParallel leaves it")
	}
	n := 4 * runtime.GOMAXPROCS(0)
	if raceEnabled {
		n = 2 * runtime.GOMAXPROCS(0)
	}
	if got := flag.Lookup("test.parallel").Value.String(); got != strconv.Itoa(n) {
		t.Fatalf("-parallel is %s, want %d", got, n)
	}
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	for i := range n {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			arrived.Done()
			select {
			case <-all:
			case <-time.After(30 * time.Second):
				t.Fatalf("the %d parallel tests never all ran at once", n)
			}
		})
	}
}

// testCtx bounds each JetStream call so a broken server fails the test instead of
// hanging it; it is a safety net, not a timing assertion.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func createStream(t *testing.T, ctx context.Context, js jetstream.JetStream, replicas int) jetstream.Stream {
	t.Helper()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "TEST",
		Subjects: []string{"test.>"},
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	return s
}

func TestStart_PublishAndConsume(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	js := env.JetStream(t)
	stream := createStream(t, ctx, js, 1)

	if _, err := js.Publish(ctx, "test.hello", []byte("hello")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:   "reader",
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	if got := string(msg.Data()); got != "hello" || msg.Subject() != "test.hello" {
		t.Fatalf("got %q on %q, want %q on %q", got, msg.Subject(), "hello", "test.hello")
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
}

func TestRestart_KeepsStreamMessages(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	url := env.URL
	js := env.JetStream(t)
	createStream(t, ctx, js, 1)
	for i := range 3 {
		if _, err := js.Publish(ctx, "test.msg", fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	env.Stop()
	env.Restart(t)

	if env.URL != url {
		t.Fatalf("URL changed across restart: %q, then %q", url, env.URL)
	}
	// The connection made before the restart reconnects and sees the stored messages.
	// A request sent while the client reconnects may be lost with the old
	// socket: ask again, each try bounded, until the test's context ends.
	var stream jetstream.Stream
	var err error
	for {
		try, cancel := context.WithTimeout(ctx, 2*time.Second)
		stream, err = js.Stream(try, "TEST")
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 3 {
		t.Fatalf("stream has %d messages after restart, want 3", n)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		if want := fmt.Sprintf("m%d", seq-1); string(m.Data) != want {
			t.Fatalf("message %d = %q, want %q", seq, m.Data, want)
		}
	}
}

func TestCluster_R3MessageSurvivesLeaderLoss(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := testenv.StartCluster(t, 3)
	if len(c.Nodes) != 3 || len(c.URLs) != 3 {
		t.Fatalf("cluster has %d nodes and %d URLs, want 3 and 3", len(c.Nodes), len(c.URLs))
	}
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	stream := createStream(t, ctx, js, 3)
	if _, err := js.Publish(ctx, "test.durable", []byte("kept")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("R3 stream has no leader: %+v", info.Cluster)
	}
	leader := -1
	for i, node := range c.Nodes {
		if node.Server.Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("stream leader %q is not a node of the cluster", info.Cluster.Leader)
	}

	c.StopNode(leader)

	// A new client on a surviving node reads the message once the group has a new leader.
	survivor := c.Nodes[(leader+1)%len(c.Nodes)]
	js2, err := jetstream.New(survivor.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	m := getMsgEventually(t, ctx, js2, 1)
	if string(m.Data) != "kept" {
		t.Fatalf("message after leader loss = %q, want %q", m.Data, "kept")
	}

	c.RestartNode(t, leader)
	// The restarted node rejoins: the stream reports all three peers current again.
	for {
		info, err := stream.Info(ctx)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && allCurrent(info.Cluster, 2) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("restarted node did not rejoin the stream group: %v, %+v", err, info)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// allCurrent reports whether the group has want current replicas besides its leader.
func allCurrent(ci *jetstream.ClusterInfo, want int) bool {
	n := 0
	for _, r := range ci.Replicas {
		if r.Current && !r.Offline {
			n++
		}
	}
	return n == want
}

// getMsgEventually retries until the stream answers: right after losing its leader
// a replicated stream is unavailable until it elects a new one.
func getMsgEventually(t *testing.T, ctx context.Context, js jetstream.JetStream, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		stream, err := js.Stream(reqCtx, "TEST")
		var m *jetstream.RawStreamMsg
		if err == nil {
			m, err = stream.GetMsg(reqCtx, seq)
		}
		cancel()
		if err == nil {
			return m
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("message %d lost after leader loss", seq)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream unavailable after leader loss: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func TestStartCluster_URLConnectsToEveryNode(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	for i, node := range c.Nodes {
		nc := node.Connect(t)
		if got := nc.ConnectedServerName(); got != node.Server.Name() {
			t.Fatalf("node %d: connected to %q, want %q", i, got, node.Server.Name())
		}
	}
}
