package executor_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/observe"
)

// skips counts what a worker's listings skipped, per bucket.
type skips struct {
	observe.NopWorker
	mu sync.Mutex
	by map[string]int
}

func (s *skips) Skipped(bucket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.by[bucket]++
}

func (s *skips) of(bucket string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.by[bucket]
}

// One approval or catalog entry that does not decode breaks nothing beyond
// itself: the workers' approval listing (which capstan approvals list, the
// console's inbox and producers read) answers with every other approval, the
// catalog serves every other capability, and each skip is counted and
// logged with its bucket and key.
func TestWorker_ListingsSkipARecordThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	nc := testenv.Start(t).Connect(t)
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	seen := &skips{by: map[string]int{}}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	startWorker(t, nc, executor.WorkerConfig{Observer: seen, Logger: log}, echoCap(nil))

	store := approvalstore.NewStore(b.Approvals, nil)
	input, hash, err := approvalstore.Canonical(envelope.MustRaw(map[string]any{"amount": 900}))
	if err != nil {
		t.Fatal(err)
	}
	good := &approvals.Record{ID: envelope.NewExecutionID(), CapabilityID: "demo.echo", Actor: alice,
		Input: input, InputHash: hash, RequestedBy: envelope.NewExecutionID()}
	if err := store.Create(ctx, good); err != nil {
		t.Fatal(err)
	}
	bad := envelope.NewExecutionID()
	if _, err := b.Approvals.Put(ctx, bad, nil); err != nil { // a header-only answer's empty value
		t.Fatal(err)
	}
	list, err := approvalsrpc.List(ctx, nc, b.Names, approvals.ListRequest{})
	if err != nil || len(list.Records) != 1 || list.Records[0].ID != good.ID {
		t.Fatalf("the workers' listing: %v %+v", err, list)
	}
	if n := seen.of(b.Names.ApprovalsBucket()); n != 1 {
		t.Fatalf("approvals skipped: %d, want 1", n)
	}
	if !strings.Contains(logs.String(), "record does not decode: skipped") || !strings.Contains(logs.String(), "key="+bad) {
		t.Fatalf("no log line names the skipped record:\n%s", logs.String())
	}

	if _, err := b.Catalog.Put(ctx, "demo.broken", []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the catalog's bad entry is counted", func() bool { return seen.of(b.Names.CatalogBucket()) >= 1 })
	c := newClient(t, nc)
	if env, err := c.Call(ctx, "demo.echo", echoIn{Hello: "still served"}); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, env)
	}
}
