package executor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// TestClusterR3_WorkerCutAcrossANodeLoss_RecoveredFromReceiptsAndReconciler
// runs the demo's email.send (a receipt once sent, a reconciler against the
// outbox), and email.plain (the same send and reconciler, without the
// receipt), on a 3-node cluster with R3 resources. Two workers are cut off
// (their connections closed, as a crash leaves it: its handlers' receipts and
// publishes fail from then on) while handlers of both hold after their sends,
// an email.send's receipt recorded among them, and the node leading the
// executions bucket is stopped right after, to come back later. The other
// worker takes the cut workers' executions over on the surviving nodes: each
// ends with one envelope, completed from its receipt or its reconciler's
// finding, or run again only after a proof of absence; no email is sent twice
// (every handler call counted against the outbox) and at most 1% end
// OUTCOME_UNKNOWN.
func TestClusterR3_WorkerCutAcrossANodeLoss_RecoveredFromReceiptsAndReconciler(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster failover run")
	}
	const n = 300
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := testenv.StartCluster(t, 3)
	setup := c.Connect(t)
	b, err := broker.Provision(ctx, setup, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := demo.Provision(ctx, setup, b.Replicas); err != nil {
		t.Fatal(err)
	}
	// Longer than an election of a new leader takes on a loaded machine: the
	// staying worker keeps the leases of what it took over meanwhile.
	lease := 5 * time.Second
	// Each worker to cut holds its sends until the cut, as long as the cut
	// would strand none of its executions after a send (of the one serving
	// email.send, none whose record holds its receipt); its other sends hold
	// as the demo's do. A held handler returns only after the cut, or once
	// its context ends and it is counted no more: what the cut strands does
	// not hang on how long the machine takes to cut.
	var (
		mu        sync.Mutex // held, receipted, and the cut
		held      = map[string]map[string]bool{"cut": {}, "cut-plain": {}}
		receipted = map[string]bool{} // executions whose records hold a receipt of "cut"
		cutting   = make(chan struct{})
	)
	// strands counts what a cut now would strand (mu held): email.send held
	// with its receipt recorded, and email.plain held after its send.
	strands := func() (withReceipt, plain int) {
		for id := range held["cut"] {
			if receipted[id] {
				withReceipt++
			}
		}
		return withReceipt, len(held["cut-plain"])
	}
	holdUntilCut := func(worker string, h executor.Handler[demo.EmailInput, demo.EmailOutput]) executor.Handler[demo.EmailInput, demo.EmailOutput] {
		return func(ctx context.Context, c executor.Call[demo.EmailInput]) (demo.EmailOutput, error) {
			hold := time.Duration(c.Input.HoldMs) * time.Millisecond
			c.Input.HoldMs = 0 // the hold is below
			out, err := h(ctx, c)
			if err != nil {
				return out, err
			}
			mu.Lock()
			withReceipt, plain := strands()
			keep := worker == "cut" && withReceipt == 0 || worker == "cut-plain" && plain == 0
			if keep {
				held[worker][c.ExecutionID] = true
			}
			mu.Unlock()
			if !keep {
				select {
				case <-time.After(hold):
					return out, nil
				case <-ctx.Done():
					return demo.EmailOutput{}, ctx.Err()
				}
			}
			select {
			case <-cutting:
				return out, nil
			case <-ctx.Done():
				mu.Lock()
				delete(held[worker], c.ExecutionID)
				mu.Unlock()
				return demo.EmailOutput{}, ctx.Err()
			}
		}
	}
	worker := func(id string) (*executor.Worker, func()) {
		nc := c.Connect(t)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		email := func(capID string, h executor.Handler[demo.EmailInput, demo.EmailOutput]) executor.Capability {
			return executor.Define(capID, demo.EmailMeta, h, executor.WithRecovery(demo.EmailRecovery(js)))
		}
		// Each worker to cut serves one of the two, so that both have
		// executions in flight when it is cut.
		var caps []executor.Capability
		switch id {
		case "cut":
			caps = []executor.Capability{email("email.send", holdUntilCut(id, demo.SendEmail(js)))}
		case "cut-plain":
			caps = []executor.Capability{email("email.plain", holdUntilCut(id, demo.SendEmailWithoutReceipt(js)))}
		default:
			caps = append(demo.Catalog(js), email("email.plain", demo.SendEmailWithoutReceipt(js)))
		}
		if id != "staying" {
			runWorkerUntilCut(t, nc, executor.WorkerConfig{ID: id, Concurrency: 64, Lease: lease}, caps...)
			return nil, nc.Close
		}
		return startWorker(t, nc, executor.WorkerConfig{ID: id, Concurrency: 64, Lease: lease}, caps...), nil
	}
	// Two workers to cut off: one of each capability's executions at least.
	_, cutSend := worker("cut")
	_, cutPlain := worker("cut-plain")
	staying, _ := worker("staying")
	client := newClient(t, c.Connect(t))

	ids := make([]string, n)
	reqs := make([]executor.Request, n)
	for i := range ids {
		ids[i] = envelope.NewExecutionID()
		capID := "email.send"
		if i%2 == 1 {
			capID = "email.plain"
		}
		reqs[i] = executor.Request{CapabilityID: capID,
			Input:   demo.EmailInput{To: fmt.Sprintf("user%d@example.com", i), Subject: "hello", HoldMs: 800 + i%400},
			Options: []executor.CallOption{executor.WithID(ids[i])}}
	}
	// The executions whose records hold a receipt of the worker serving
	// email.send alone: one it holds as well is one the staying worker must
	// complete from its receipt.
	kw, err := b.Executions.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer kw.Stop()
	go func() {
		for e := range kw.Updates() {
			var r execution.Record
			if e != nil && e.Operation() == jetstream.KeyValuePut && envelope.Unmarshal(e.Value(), &r) == nil &&
				r.Worker == "cut" && len(r.Receipt) > 0 {
				mu.Lock()
				receipted[r.ExecutionID] = true
				mu.Unlock()
			}
		}
	}()
	type result struct {
		envs []*envelope.Envelope
		errs []error
	}
	got := make(chan result, 1)
	go func() {
		envs, errs := client.CallMany(ctx, reqs)
		got <- result{envs, errs}
	}()

	// Once a third of the emails are sent and both workers hold sent
	// emails, cut them off and stop the node leading the executions bucket;
	// the node comes back a few seconds later.
	readCtx, cancelRead := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelRead()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	for {
		s, err := js.Stream(readCtx, demo.OutboxStream)
		if err == nil && s.CachedInfo().State.Msgs >= n/3 {
			break
		}
		select {
		case <-readCtx.Done():
			t.Fatal("no emails sent")
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The cut, under mu, as soon as it strands both: no handler counted
	// returns before it, and after it their writes fail. The node is
	// stopped after it, however long finding and stopping it takes.
	var withReceipt, plain int
	for {
		mu.Lock()
		if withReceipt, plain = strands(); withReceipt > 0 && plain > 0 {
			cutSend()
			cutPlain()
			close(cutting)
			mu.Unlock()
			break
		}
		mu.Unlock()
		select {
		case <-readCtx.Done():
			t.Fatalf("the workers to cut never held both an email.send with its receipt recorded (%d) and an email.plain sent (%d)",
				withReceipt, plain)
		case <-time.After(5 * time.Millisecond):
		}
	}
	node := leaderOf(ctx, t, c, "KV_"+b.Names.ExecutionsBucket())
	c.StopNode(node)
	t.Logf("cut two workers holding %d email.send with a receipt and %d email.plain sent; stopped %s, leader of the executions",
		withReceipt, plain, c.Nodes[node].Server.Name())
	time.Sleep(3 * lease)
	c.RestartNode(t, node)

	res := <-got
	statuses, recovered, unknown := map[string]int{}, map[string]int{}, 0
	attempts := map[string]int{}
	for i, id := range ids {
		if res.errs[i] != nil || res.envs[i] == nil || res.envs[i].ExecutionID != id {
			t.Fatalf("call %d (%s): %v %+v", i, id, res.errs[i], res.envs[i])
		}
		e := res.envs[i]
		key := string(e.Status)
		if e.Error != nil {
			key += "/" + string(e.Error.Code)
			if e.Error.Code == envelope.CodeOutcomeUnknown {
				unknown++
			}
		}
		statuses[e.CapabilityID+":"+key]++
		if e.Recovered != nil {
			recovered[e.Recovered.How]++
		}
		attempts[id] = e.Attempts
	}

	sent, sentBy := outboxByExecution(t, readCtx, js)
	ran, ranBy := handlerCallsByExecution(t, readCtx, js)
	for i, id := range ids {
		if sent[id] > 1 {
			t.Errorf("%s sent %d emails", id, sent[id])
		}
		if ran[id] > attempts[id] || sent[id] > ran[id] {
			t.Errorf("%s: %d handler calls, %d emails, %d attempts", id, ran[id], sent[id], attempts[id])
		}
		for _, a := range ranBy[id] {
			if sentBy[id] > 0 && a > sentBy[id] {
				t.Errorf("%s: attempt %d ran after attempt %d sent its email", id, a, sentBy[id])
			}
		}
		if res.envs[i].Status == envelope.StatusCompleted {
			var out demo.EmailOutput
			if err := res.envs[i].Output.Decode(&out); err != nil || sent[id] != 1 || out.OutboxSeq == 0 {
				t.Errorf("%s completed (recovered %+v) with %+v (%v) and %d emails", id, res.envs[i].Recovered, out, err, sent[id])
			}
		}
	}
	st := staying.Stats()
	t.Logf("envelopes %v; recovered %v; taken over by the staying worker %d; OUTCOME_UNKNOWN %d of %d", statuses, recovered,
		st.TakenOver, unknown, n)
	if st.TakenOver == 0 || recovered[envelope.RecoveredByReceipt] == 0 || recovered[envelope.RecoveredByReconciler] == 0 {
		t.Errorf("nothing was taken over and recovered (taken over %d, recovered %v): the run proves nothing", st.TakenOver, recovered)
	}
	if unknown*100 > n {
		t.Errorf("%d of %d ended OUTCOME_UNKNOWN, want at most 1%%", unknown, n)
	}
}
