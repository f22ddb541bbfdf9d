package trail

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// An event removed from the stream before the checkpointer read it (the
// stream created again by an admin, deletes allowed for one message, denied
// again) is signed as a sequence that held no message: the log is
// consistent, yet the stream, which denies deletes, has a hole. Verify
// names the sequence.
func TestAttack_RemovedBeforeTheCheckpointerReadIt(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	a.cp.stop()
	last := publish(t, a.b, "late", 10) // sequences 701 to 710, in no checkpoint
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
	cfg.DenyDelete = false
	s, err := a.b.JS.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteMsg(ctx, 705); err != nil {
		t.Fatal(err)
	}
	cfg.DenyDelete = true
	if _, err := a.b.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	b := a.reopen(t)
	runCheckpointer(t, b, a.key, "after")
	waitCovered(t, b, last)
	p := a.verifyKept(t)
	wantProblem(t, p, KindMissing, 704, "")
	if !strings.Contains(p.Detail, "before the checkpointer read it") {
		t.Fatalf("problem %+v: want it said that the message went before it was logged", p)
	}
}

// A tile of the leaves' hashes removed or cut short (the trail bucket is
// an admin's to write) leaves the events' tree matching every checkpoint,
// yet no inclusion proof of the leaves it held can be made, and retention
// would leave them unproved: verify names the tile.
func TestAttack_TileCutShort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		tile  int64
		bytes int
	}{
		{"the first emptied", 0, 0},
		{"a full one cut inside a hash", 1, tileWidth*32 - 1},
		{"the last cut to one hash", 2, 33},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := newAttacked(t)
			a.cp.stop()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			key := tileKey(0, tc.tile)
			e, err := a.b.Trail.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.b.Trail.Put(ctx, key, e.Value()[:tc.bytes]); err != nil {
				t.Fatal(err)
			}
			p := a.verifyKept(t)
			if p.Kind != KindTile || !strings.Contains(p.Detail, key) {
				t.Fatalf("problem %+v, want tile %s named", p, key)
			}
		})
	}
}
