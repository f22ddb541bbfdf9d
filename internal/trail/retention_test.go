package trail

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The stream's age limit removes the oldest events: the log is not broken.
// The next checkpoint says where the retained log begins, the stored hashes
// prove the removed events, the events left are proved against every
// checkpoint, and a checkpoint kept from before the removal still holds.
func TestRetention_RemovedEventsAreProvedByTheStoredHashes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.Provision(ctx, nc, broker.Config{AuditMaxAge: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	k := newKey(t, "test.example/retained")
	runCheckpointer(t, b, k, "cp")
	kept := waitCovered(t, b, publish(t, b, "old", 300))
	// Until the age limit removed them all.
	for {
		info, err := b.Audit.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	last := publish(t, b, "new", 100)
	signed := waitCovered(t, b, last)
	cp, err := Open(signed, k.known)
	if err != nil {
		t.Fatal(err)
	}
	// On a loaded machine the age limit may already take the first new
	// ones before the checkpoint that covers the last.
	if cp.Retained < 300 || cp.Retained >= 400 || cp.Size != 400 {
		t.Fatalf("checkpoint %+v: want 400 leaves, retained from 300 on", cp)
	}
	// The events left are provable (read before the age limit takes them
	// too).
	_, incs, err := Prove(ctx, b, []uint64{last}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := incs[0].Check(cp); err != nil {
		t.Fatal(err)
	}
	r := verify(t, FromDeployment(b), k, VerifyOptions{Kept: kept})
	mustOK(t, r)
	// The age limit may go on removing the new ones while verify reads.
	if r.RemovedByRetention < 300 || r.RemovedByRetention+r.Messages != 400 || !r.KeptHolds {
		t.Fatalf("report %+v", r)
	}
}

// Events removed from the front of a stream that keeps them for 30 days:
// the checkpoints date them as younger than that, so retention did not
// remove them. The attacker created the stream again from a later sequence.
func TestAttack_RemovedFromTheFrontAsIfByRetention(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	// A checkpoint a second, as under a steady load: the first 100 events
	// are dated by the checkpoints that cover the first 50 and 100.
	a.cp.stop()
	rewriteStream(t, a, func(int, *Msg) bool { return false })
	deleteLog(t, a)
	a.cp = runCheckpointer(t, a.b, a.key, "cp")
	for i, n := range []int{50, 50, 600} {
		waitCovered(t, a.b, publish(t, a.b, fmt.Sprintf("s%d", i), n))
	}
	a.kept = waitCovered(t, a.b, 700)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var msgs []*Msg
	if err := FromDeployment(a.b).Messages(ctx, 1, func(m *Msg) error { msgs = append(msgs, m); return nil }); err != nil {
		t.Fatal(err)
	}
	cfg := a.b.Audit.CachedInfo().Config
	if err := a.b.JS.DeleteStream(ctx, cfg.Name); err != nil {
		t.Fatal(err)
	}
	cfg.FirstSeq = 101
	if _, err := a.b.JS.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs[100:] {
		if _, err := a.b.JS.PublishMsg(ctx, m.natsMsg()); err != nil {
			t.Fatal(err)
		}
	}
	a.b = a.reopen(t)
	p := a.verifyKept(t)
	if p.Kind != KindRemovedEarly || p.Leaf != 99 {
		t.Fatalf("problem %+v: want leaf 99 removed early", p)
	}
}
