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
