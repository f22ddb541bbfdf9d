package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Writes that race with another worker's, ordered by a hook at the moment
// between a read and the write that follows it: every write of a record is
// a compare-and-swap, so the one that loses reads again and decides from
// what it finds, never writing over the other.

// A takeover whose swap another worker beat leaves the execution to that
// worker: nothing runs, nothing is written over its claim.
func TestTakeover_SwapBeatenByAnotherWorker_LeavesIt(t *testing.T) {
	t.Parallel()
	var g *rig
	var req *envelope.Request
	var claims atomic.Int32
	var winner string
	g = newRig(t, &testCap{retry: func(int, *envelope.CapabilityError) (time.Duration, bool) { return 0, true }},
		func(c *Config) {
			c.Observer = stageHook{on: func(name string) {
				// The short path's create finds the lost worker's record;
				// the takeover's swap comes next, and another worker's
				// takeover lands just before it.
				if name == "claim" && claims.Add(1) == 2 {
					winner = g.takeOverAs(req, "w-winner")
				}
			}}
		})
	req = g.request()
	g.othersClaim(req, StateRunning, time.Now().Add(-time.Second)) // a lost worker's
	g.publish(req)
	g.handle(g.next())
	if winner == "" {
		t.Fatal("the takeover's swap was never reached")
	}
	if n := g.c.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times under the other worker's claim", n)
	}
	if rec := g.record(req); rec == nil || rec.Claim != winner || rec.Worker != "w-winner" {
		t.Fatalf("record %+v: want the winning worker's claim", rec)
	}
	if env := g.envelope(req); env != nil {
		t.Fatalf("envelope %+v written by the worker whose takeover lost", env)
	}
}

// A cancel is recorded by compare-and-swap: a worker's write that lands
// between the cancel's read and its write is kept, with the cancel.
func TestCancel_WorkersWriteMeanwhileKept(t *testing.T) {
	t.Parallel()
	var g *rig
	var armed atomic.Bool
	var mine *claim
	renewed := time.Now().UTC().Add(time.Hour).Truncate(time.Millisecond)
	g = newRig(t, &testCap{}, func(c *Config) {
		c.Now = func() time.Time {
			if armed.CompareAndSwap(true, false) {
				// The worker renews its lease after the cancel read the record.
				if err := mine.update(func(r *Record) { r.LeaseUntil = renewed }); err != nil {
					t.Error(err)
				}
			}
			return time.Now()
		}
	})
	req := g.request()
	mine = g.othersClaim(req, StateRunning, time.Now().Add(time.Minute))
	armed.Store(true)
	if _, err := g.r.RecordCancel(broker.Anonymous, req.ExecutionID, true); err != nil {
		t.Fatal(err)
	}
	if armed.Load() {
		t.Fatal("the worker's write never happened")
	}
	rec := g.record(req)
	if rec == nil || !rec.CancelRequested || !rec.LeaseUntil.Equal(renewed) || rec.Claim != mine.token {
		t.Fatalf("record %+v: want the cancel and the worker's renewal both", rec)
	}
}

// A finalized record whose envelope cannot be written yet leaves its
// delivery for a later one: acknowledged only once the envelope exists.
func TestRestoreEnvelope_NotWritten_DeliveryKept(t *testing.T) {
	t.Parallel()
	g := newRig(t, &testCap{}, nil)
	req := g.request()
	rec := g.r.w.finalizedRecord(req.ExecutionID, testOp, envelope.StatusFailed, envelope.CodeNotStarted)
	if _, err := g.b.Create(ctxT(t), g.b.Executions, g.key(req), rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The envelopes' stream still answers reads, and refuses every write.
	stream, err := g.b.JS.Stream(ctxT(t), "KV_"+g.b.Envelopes.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.Sealed = true
	if _, err := g.b.JS.UpdateStream(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	g.publish(req)
	g.handle(g.next())
	if got := g.trail(req); count(got, audit.EventDuplicateDelivery) != 0 {
		t.Fatalf("trail %v: acknowledged as a duplicate without its envelope", got)
	}
	if n := g.pending(); n != 1 {
		t.Fatalf("%d deliveries unsettled, want the request's", n)
	}
}

// A worker that lost its claim during the attempt leaves the delivery
// unacknowledged: only an envelope lets a delivery be acknowledged.
func TestFinalize_ClaimLostDuringTheAttempt_DeliveryNotAcknowledged(t *testing.T) {
	t.Parallel()
	var g *rig
	var req *envelope.Request
	g = newRig(t, &testCap{work: func(context.Context, Attempt) (any, error) {
		g.takeOverAs(req, "w-other")
		return nil, errors.New("boom") // a failure with a cause proves the claim before its envelope
	}}, nil)
	req = g.request()
	g.publish(req)
	g.handle(g.next())
	if env := g.envelope(req); env != nil {
		t.Fatalf("envelope %+v written by a worker that lost its claim", env)
	}
	if n := g.pending(); n != 1 {
		t.Fatalf("%d deliveries unsettled: the request was acknowledged without an envelope", n)
	}
}

// In strict audit, capability.started is stored before the handler runs: a
// trail that refuses it ends the execution AUDIT_UNAVAILABLE, unrun.
func TestStrictAudit_StartedNotStored_HandlerNotRun(t *testing.T) {
	t.Parallel()
	g := newRigOn(t, broker.Config{AuditMaxBytes: 64 << 10, AuditDiscardNew: true}, &testCap{},
		func(c *Config) { c.StrictAudit = true })
	for _, size := range []int{256, 16, 0} {
		for i := 0; ; i++ {
			if i > 10000 {
				t.Fatal("the audit stream never refused a write")
			}
			if _, err := g.b.JS.Publish(ctxT(t), g.b.Names.AuditSubject("f"), make([]byte, size)); err != nil {
				break
			}
		}
	}
	req := g.request()
	g.publish(req)
	g.handle(g.next())
	env := g.envelope(req)
	if env == nil || env.Error == nil || env.Error.Code != envelope.CodeAuditUnavailable || g.c.calls.Load() != 0 {
		t.Fatalf("envelope %+v, %d calls: want AUDIT_UNAVAILABLE, never run", env, g.c.calls.Load())
	}
}
