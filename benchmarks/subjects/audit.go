package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

// measureAudit writes n executions' trails in one of capstan's audit layouts,
// at rate executions/s (0: as fast as the server stores them), and prints the
// server's live heap per execution, with the time audit.Read takes for one
// trail.
func measureAudit(layout string, n, rate int) error {
	nc, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		return err
	}
	e := auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index})
	// The ids are made before the heap is measured: they are this process's,
	// not the server's.
	ids := make([]string, n)
	for i := range ids {
		ids[i] = envelope.NewExecutionID()
	}
	before := liveHeap()
	began := time.Now()
	for i, id := range ids {
		evs := make([]*audit.Event, 3)
		for j, typ := range []string{audit.EventRequested, audit.EventStarted, audit.EventCompleted} {
			evs[j] = &audit.Event{Type: typ, ExecutionID: id, CapabilityID: "demo.echo", Surface: "direct",
				Actor: audit.Actor{ID: "alice", Kind: "user"}, Worker: "w1", InputHash: "9f86d081884c7d659a2feaa0c55ad015",
				Data: map[string]any{"attempt": 1}}
		}
		switch layout {
		case "audit-per-id":
			for _, ev := range evs {
				ev.V, ev.Timestamp = envelope.Version, time.Now().UTC()
				data, err := envelope.Marshal(ev)
				if err != nil {
					return err
				}
				if _, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: b.Names.LegacyAuditSubject(id), Data: data}); err != nil {
					return err
				}
			}
		case "audit-sharded":
			for _, ev := range evs {
				e.Emit(ev)
			}
		case "audit-one-message":
			e.EmitAll(evs...)
		}
		if i%1024 == 1023 {
			<-b.JS.PublishAsyncComplete()
			if err := e.Flush(ctx); err != nil {
				return err
			}
		}
		if rate > 0 && i%64 == 63 {
			// Paced: a trail's window (its id's time less a minute to two
			// minutes after its end) then holds what the rate stores in it.
			time.Sleep(time.Until(began.Add(time.Duration(i+1) * time.Second / time.Duration(rate))))
		}
	}
	<-b.JS.PublishAsyncComplete()
	if err := e.Flush(ctx); err != nil {
		return err
	}
	if e.Failed() != 0 {
		return fmt.Errorf("%s: %d events not stored", layout, e.Failed())
	}
	info, err := b.Audit.Info(ctx)
	if err != nil {
		return err
	}
	written := liveHeap()
	fmt.Printf("%-17s %d executions (%.0f/s), %7d messages, %7d subjects: live heap %6.0f bytes per execution after the writes",
		layout, n, float64(n)/time.Since(began).Seconds(), info.State.Msgs, info.State.NumSubjects, float64(written-before)/float64(n))
	time.Sleep(12 * time.Second) // the block caches expire after 10 s
	fmt.Printf(", %6.0f once caches expired", (float64(liveHeap())-float64(before))/float64(n))

	// Reading one trail: the median and slowest of 50 reads of ids spread
	// over the stream.
	var took []time.Duration
	for i := 0; i < 50; i++ {
		id := ids[(i*n)/50]
		start := time.Now()
		trail, err := audit.Read(ctx, b.NC, b.Names.Prefix(), broker.Anonymous, id) // events without a principal are the anonymous one's
		took = append(took, time.Since(start))
		if err != nil {
			return err
		}
		if len(trail) != 3 {
			return fmt.Errorf("%s: the trail of %s holds %d events", layout, id, len(trail))
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	fmt.Printf("; audit.Read median %v, slowest %v\n", took[len(took)/2].Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
	return nil
}
