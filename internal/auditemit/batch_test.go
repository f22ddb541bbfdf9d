package auditemit_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// serverMsgs is how many messages the server has taken in and sent out.
func serverMsgs(t *testing.T, env *testenv.Env) int64 {
	t.Helper()
	v, err := env.Server.Varz(&server.VarzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v.InMsgs + v.OutMsgs
}

// storedEvents counts the events on the audit stream.
func storedEvents(t *testing.T, b *broker.Broker, ids []string) int {
	t.Helper()
	n := 0
	for _, id := range ids {
		trail, err := audit.Read(testCtx(t), b.NC, b.Names.Prefix(), broker.Anonymous, id)
		if errors.Is(err, broker.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("read %s: %v", id, err)
		}
		n += len(trail)
	}
	return n
}

// A worker's asynchronous events travel as one fast batch: each is one
// message to the server, and the stream acknowledges a few hundred at once.
// Every event is stored, confirmed (Flush returns) and none counted failed.
func TestEmit_BatchedEventsAreOneMessageEachAndAllConfirmed(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if !b.Audit.CachedInfo().Config.AllowBatchPublish {
		t.Fatal("the audit stream does not take batches")
	}
	e := newEmitter(t, b, auditemit.Options{})
	const executions, each = 200, 5
	var ids []string
	before := serverMsgs(t, env)
	for i := range executions {
		id := fmt.Sprintf("exec-%03d", i)
		ids = append(ids, id)
		for range each {
			e.Emit(event(audit.EventStarted, id))
		}
	}
	flush(t, e)
	msgs := serverMsgs(t, env) - before
	const n = executions * each
	if e.Sent() != n || e.Failed() != 0 {
		t.Fatalf("sent %d, failed %d; want %d and 0", e.Sent(), e.Failed(), n)
	}
	// One acknowledgement per event would make 2n.
	if msgs >= n+n/10 {
		t.Fatalf("%d server messages for %d events; want about one each", msgs, n)
	}
	if got := storedEvents(t, b, ids); got != n {
		t.Fatalf("%d events stored, want %d", got, n)
	}
}

// A stream that stops taking batches refuses the next batched event, which is
// counted and logged; the events after it are acknowledged one by one and
// stored.
func TestEmit_StreamStopsTakingBatches_LaterEventsAcknowledgedOneByOne(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	log := &recorder{}
	e := newEmitter(t, b, auditemit.Options{Logger: slog.New(log)})
	e.Emit(event(audit.EventRequested, "exec-1"))
	flush(t, e)
	cfg := b.Audit.CachedInfo().Config
	cfg.AllowBatchPublish = false
	if _, err := b.JS.UpdateStream(testCtx(t), cfg); err != nil {
		t.Fatal(err)
	}
	e.Emit(event(audit.EventStarted, "exec-2")) // refused: the stream takes no batch
	flush(t, e)
	if e.Failed() != 1 || log.warnings() != 1 {
		t.Fatalf("failed %d, warnings %d; want 1 and 1", e.Failed(), log.warnings())
	}
	for range 3 {
		e.Emit(event(audit.EventCompleted, "exec-3"))
	}
	flush(t, e)
	if e.Failed() != 1 {
		t.Fatalf("failed %d after the stream stopped taking batches, want 1", e.Failed())
	}
	if got := storedEvents(t, b, []string{"exec-1", "exec-3"}); got != 4 {
		t.Fatalf("%d events stored, want 4", got)
	}
}

// A server restart forgets the open batch: the next event is refused and
// counted, a new batch starts, and every event after it is stored. No event
// goes unaccounted: each is stored or counted failed.
func TestEmit_BatchForgottenByARestart_NoEventUnaccounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	for range 5 {
		e.Emit(event(audit.EventStarted, "exec-before"))
	}
	reconnects := b.NC.Stats().Reconnects
	env.Restart(t)
	waitReconnected(t, b, reconnects)
	e.Emit(event(audit.EventStarted, "exec-reconnected")) // a batch of its own: the old one is unknown now
	flush(t, e)
	for range 5 {
		e.Emit(event(audit.EventCompleted, "exec-after"))
	}
	flush(t, e)
	before, after := storedEvents(t, b, []string{"exec-before"}), storedEvents(t, b, []string{"exec-reconnected", "exec-after"})
	if after != 6 {
		t.Fatalf("%d events emitted after the restart stored, want 6", after)
	}
	if stored := uint64(before + after); stored+e.Failed() < e.Sent() {
		t.Fatalf("sent %d, stored %d, failed %d: events unaccounted", e.Sent(), stored, e.Failed())
	}
}

// Events emitted while the server is down wait in the connection's reconnect
// buffer and reach the restarted server after it: they must make a batch of
// their own, which it takes, not join the batch open before the outage, which
// it no longer knows.
func TestEmit_EventsEmittedWhileTheServerIsDown_StoredAfterItsRestart(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	e := newEmitter(t, b, auditemit.Options{})
	for range 5 {
		e.Emit(event(audit.EventStarted, "exec-before")) // a batch left open by the outage
	}
	reconnects := b.NC.Stats().Reconnects
	env.Stop()
	ctx := testCtx(t)
	for b.NC.IsConnected() {
		select {
		case <-ctx.Done():
			t.Fatal("the connection did not notice the server's loss")
		case <-time.After(10 * time.Millisecond):
		}
	}
	for range 5 {
		e.Emit(event(audit.EventCompleted, "exec-offline"))
	}
	env.Restart(t)
	waitReconnected(t, b, reconnects)
	flush(t, e)
	if got := storedEvents(t, b, []string{"exec-offline"}); got != 5 {
		t.Fatalf("%d of the 5 events emitted during the outage stored", got)
	}
	before := storedEvents(t, b, []string{"exec-before"})
	if stored := uint64(before + 5); stored+e.Failed() < e.Sent() {
		t.Fatalf("sent %d, stored %d, failed %d: events unaccounted", e.Sent(), stored, e.Failed())
	}
}

// waitReconnected waits until b's connection, which had reconnected
// `reconnects` times before the server's restart, is connected to the
// restarted server. Being connected is not enough: a connection that has not
// yet read the old server's end still says it is connected, and what is
// published on it then is lost with the old socket.
func waitReconnected(t *testing.T, b *broker.Broker, reconnects uint64) {
	t.Helper()
	ctx := testCtx(t)
	for b.NC.Stats().Reconnects == reconnects || !b.NC.IsConnected() {
		select {
		case <-ctx.Done():
			t.Fatal("the connection did not come back")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// On a replicated stream a batch can be committed before its last message is
// stored (Flush commits right after the last Emit). The stream then sends the
// commit's acknowledgement when that message is stored, on that message's
// reply subject, not the commit's. The events are stored: none may be counted
// failed, and Flush returns on that acknowledgement.
func TestEmit_ReplicatedBatchCommittedBeforeItsTailIsStored_NoneCountedFailed(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	b := provision(t, c.Connect(t), broker.Config{Replicas: 3})
	if got := b.Audit.CachedInfo().Config.Replicas; got != 3 {
		t.Fatalf("audit stream has %d replicas, want 3", got)
	}
	log := &recorder{}
	e := newEmitter(t, b, auditemit.Options{Logger: slog.New(log), AckTimeout: 2 * time.Second})
	const rounds, each = 5, 3
	var ids []string
	for r := range rounds {
		id := fmt.Sprintf("exec-%d", r)
		ids = append(ids, id)
		for range each {
			e.Emit(event(audit.EventStarted, id))
		}
		flush(t, e) // commits the batch right after its last message
	}
	if got := storedEvents(t, b, ids); got != rounds*each {
		t.Fatalf("%d events stored, want %d", got, rounds*each)
	}
	if e.Failed() != 0 || log.warnings() != 0 {
		t.Fatalf("%d stored events counted failed (%d warnings), want 0", e.Failed(), log.warnings())
	}
}

// An emitter is taken per use where events are strict (an approvals store per
// decision): one that never emits asynchronously must leave nothing behind on
// the connection, or a long-running process taking one per request grows a
// subscription (and its goroutine) per request until the connection closes.
func TestNewEmitter_EmittersTakenPerUseLeaveNoSubscriptionBehind(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if !b.Audit.CachedInfo().Config.AllowBatchPublish {
		t.Fatal("the audit stream does not take batches")
	}
	before := b.NC.NumSubscriptions()
	const uses = 20
	for i := range uses {
		e := auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index})
		if err := e.EmitSync(testCtx(t), event(audit.EventApproved, fmt.Sprintf("exec-%d", i))); err != nil {
			t.Fatal(err)
		}
		flush(t, e)
	}
	if grown := b.NC.NumSubscriptions() - before; grown > 1 {
		t.Fatalf("%d emitters taken and done with left %d subscriptions on the connection, want at most 1", uses, grown)
	}
}
