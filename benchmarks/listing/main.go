// Command listing measures how fast executions are listed (DESIGN §3,
// "Listing executions") on a store that holds many of them: it starts an
// embedded JetStream server on loopback, provisions capstan's resources,
// fills the store with N executions as workers write them (each execution's
// trail and index entry through auditemit.Emitter, its envelope in the envelopes
// bucket), then times pages of the listing, newest first, straight from the
// index (audit.List) and through a worker (executor.Client.Executions, what
// the CLI and the console ask), each read several times.
//
// The executions are spread as a deployment's might be: 10 principals, 1,000
// actors, 20 capabilities of which one is rare (one execution in 10,000),
// 2% failed, 0.5% waiting for an approval, 0.1% still running.
//
//	go run ./listing -n 1000000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
)

func main() {
	n := flag.Int("n", 1_000_000, "executions to fill the store with")
	reads := flag.Int("reads", 5, "times each page is read")
	dir := flag.String("store", "", "store directory (default a temporary one, removed at the end)")
	flag.Parse()
	if err := run(*n, *reads, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "listing:", err)
		os.Exit(1)
	}
}

func run(n, reads int, dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "capstan-listing-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true,
		JetStreamMaxMemory: 1 << 30, JetStreamMaxStore: 64 << 30})
	if err != nil {
		return err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("server not ready")
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx := context.Background()
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := fill(ctx, b, n); err != nil {
		return err
	}
	fmt.Printf("filled %d executions in %v (%s)\n", n, time.Since(start).Round(time.Second), load())
	info, err := b.Index.Info(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("index: %d entries, %d subjects, %.1f MB; %s\n", info.State.Msgs, info.State.NumSubjects,
		float64(info.State.Bytes)/1e6, load())

	w, stop, err := worker(nc)
	if err != nil {
		return err
	}
	defer stop()
	_ = w

	for _, c := range []struct {
		name string
		q    audit.Query
	}{
		{"first page, no filter", audit.Query{}},
		{"status failed (2%)", audit.Query{Status: audit.EntryFailed}},
		{"one principal (10%)", audit.Query{Principal: "p3"}},
		{"one actor (0.1%)", audit.Query{Actor: "user:u0007"}},
		{"a rare capability (0.01%)", audit.Query{CapabilityID: "rare.cap"}},
		{"a rare capability, failed", audit.Query{CapabilityID: "rare.cap", Status: audit.EntryFailed}},
		{"running (0.1%)", audit.Query{Status: audit.EntryRunning}},
		{"capability prefix inside a token (orders*)", audit.Query{CapabilityID: "orders*"}},
		{"nothing matches", audit.Query{CapabilityID: "nobody.calls"}},
	} {
		if err := measure(ctx, b, nc, c.name, c.q, reads); err != nil {
			return err
		}
	}
	fmt.Println(load())
	return nil
}

func load() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "load average unknown"
	}
	s := strings.TrimSpace(string(out))
	if i := strings.Index(s, "load average"); i >= 0 {
		return s[i:]
	}
	return s
}

var capabilities = []string{"demo.echo", "orders.refund", "orders.lookup", "email.send", "crm.contact.get",
	"crm.contact.update", "search.web", "search.docs", "files.read", "files.write", "calendar.list",
	"calendar.create", "tickets.open", "tickets.close", "billing.invoice", "billing.charge",
	"deploy.status", "deploy.rollback", "reports.daily"}

// fill writes n executions as workers write them: one audit message of
// each execution's events (which files its index entry), and its envelope.
func fill(ctx context.Context, b *broker.Broker, n int) error {
	em := auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, AckTimeout: time.Minute})
	js, err := jetstream.New(b.NC, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		return err
	}
	for i := range n {
		id := envelope.NewExecutionID()
		principal := fmt.Sprintf("p%d", i%10)
		capID := capabilities[(i/7)%len(capabilities)]
		if i%10_000 == 4_321 {
			capID = "rare.cap"
		}
		actor := audit.Actor{Kind: "user", ID: fmt.Sprintf("u%04d", (i*7919)%1000)}
		ev := func(typ string, data map[string]any) *audit.Event {
			return &audit.Event{Type: typ, ExecutionID: id, CapabilityID: capID, Principal: principal, Actor: actor,
				Surface: "mcp", Worker: "w1", Data: data}
		}
		env := &envelope.Envelope{V: envelope.Version, ExecutionID: id, CapabilityID: capID, Status: envelope.StatusCompleted,
			Attempts: 1, DurationMs: 3, FinalizedBy: "w1", FinalizedAt: time.Now().UTC(), Output: envelope.Raw{0x80}}
		evs := []*audit.Event{ev(audit.EventRequested, nil), ev(audit.EventStarted, map[string]any{"attempt": 1})}
		switch {
		case i%1000 == 999: // running: no end, no envelope
			env = nil
		case i%200 == 100:
			evs = append(evs[:1], ev(audit.EventApprovalRequested, map[string]any{"approvalId": "ap-" + id}))
			env.Status, env.Attempts, env.Output = envelope.StatusApprovalRequired, 0, nil
			env.Approval = &envelope.ApprovalRef{ID: "ap-" + id}
		case i%50 == 25:
			evs = append(evs, ev(audit.EventFailed, map[string]any{"code": "EXECUTION_FAILED", "attempts": 1}))
			env.Status, env.Output = envelope.StatusFailed, nil
			env.Error = &envelope.Error{Code: envelope.CodeExecutionFailed, Message: "The operation failed."}
		default:
			evs = append(evs, ev(audit.EventCompleted, map[string]any{"attempts": 1, "durationMs": 3}))
		}
		em.EmitAll(evs...)
		if env != nil {
			data, err := envelope.Marshal(env)
			if err != nil {
				return err
			}
			subj := "$KV." + b.Names.EnvelopesBucket() + "." + broker.Key(principal, id)
			for {
				_, err := js.PublishAsync(subj, data, jetstream.WithStallWait(time.Minute))
				if err == nil {
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					return err
				}
			}
		}
		if i%100_000 == 99_999 {
			fmt.Printf("  %d written (%s)\n", i+1, load())
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := em.Flush(fctx); err != nil {
		return err
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-fctx.Done():
		return fctx.Err()
	}
	if f, ix := em.Failed(), em.IndexFailed(); f+ix > 0 {
		return fmt.Errorf("%d audit events and %d index entries not stored", f, ix)
	}
	return nil
}

// worker serves the listings as a worker does, with one capability.
func worker(nc *nats.Conn) (*executor.Worker, func(), error) {
	reg, err := executor.NewRegistry(executor.Define("demo.echo", executor.Meta{
		Description: "Returns its input.", SideEffect: executor.SideEffectNone, Expose: []executor.Surface{executor.SurfaceDirect}},
		func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
			return c.Input, nil
		}))
	if err != nil {
		return nil, nil, err
	}
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{SweepInterval: -1})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// Ready once it answers a listing.
	for start := time.Now(); ; {
		rctx, c := context.WithTimeout(context.Background(), time.Second)
		_, err := requestExecutions(rctx, nc, broker.NewNames(""), executor.ExecutionsRequest{Query: audit.Query{Limit: 1}})
		c()
		if err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			cancel()
			return nil, nil, fmt.Errorf("worker not serving: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return w, func() { cancel(); <-done }, nil
}

// measure reads the first page of q, and the page after it, reads times
// each, from the index and through the worker, and prints the first read
// and the median.
func measure(ctx context.Context, b *broker.Broker, nc *nats.Conn, name string, q audit.Query, reads int) error {
	var direct, viaWorker, second []time.Duration
	var got, scanned int
	var next string
	for range reads {
		t := time.Now()
		p, err := audit.List(ctx, b.NC, b.Names.Prefix(), q)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		direct = append(direct, time.Since(t))
		got, scanned, next = len(p.Entries), p.Scanned, p.Cursor()
		t = time.Now()
		if _, err := requestExecutions(ctx, nc, b.Names, executor.ExecutionsRequest{Query: q}); err != nil {
			return fmt.Errorf("%s via the worker: %w", name, err)
		}
		viaWorker = append(viaWorker, time.Since(t))
		if next != "" {
			q2 := q
			if err := q2.SetCursor(next); err != nil {
				return fmt.Errorf("%s, second page: %w", name, err)
			}
			t = time.Now()
			if _, err := audit.List(ctx, b.NC, b.Names.Prefix(), q2); err != nil {
				return fmt.Errorf("%s, second page: %w", name, err)
			}
			second = append(second, time.Since(t))
		}
	}
	fmt.Printf("%-45s %3d entries (%6d read)  index: first %8v median %8v  worker: first %8v median %8v  next page: median %8v\n",
		name, got, scanned, round(direct[0]), round(median(direct)), round(viaWorker[0]), round(median(viaWorker)), round(median(second)))
	return nil
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Second:
		return d.Round(10 * time.Millisecond)
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// requestExecutions asks the workers for a page as the connection's
// principal, as a Client's Executions does.
func requestExecutions(ctx context.Context, nc *nats.Conn, n broker.Names, req executor.ExecutionsRequest) (*executor.ExecutionsPage, error) {
	req.V = envelope.Version
	return execrpc.Ask[executor.ExecutionsPage](ctx, nc, n, n.ListExecutionsSubject, &req, "list executions")
}
