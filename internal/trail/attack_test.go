package trail

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/minio/highwayhash"
	"github.com/nats-io/nats.go"
)

// The attacks of an operator on the trail, each caught by the verifier
// against a checkpoint the auditor kept: the first event that does not
// match is named, with the kind of change. The server requires
// credentials; the attacker holds the admin's (or the store's files).

// attacked is a deployment whose log holds 700 audit messages, all covered
// by the checkpoint the auditor kept.
type attacked struct {
	env  *testenv.Env
	nc   *nats.Conn
	b    *broker.Broker
	key  *logKey
	cp   *running
	kept []byte
}

func newAttacked(t *testing.T) *attacked {
	t.Helper()
	setup, err := auth.Init(filepath.Join(t.TempDir(), "auth"), "")
	if err != nil {
		t.Fatal(err)
	}
	a := &attacked{env: testenv.Start(t, testenv.Auth(setup))}
	a.nc = a.env.Connect(t) // the admin's credentials
	a.b = provision(t, a.nc)
	a.key = newKey(t, "audit.example/payments")
	a.cp = runCheckpointer(t, a.b, a.key, "cp")
	publish(t, a.b, "a", 600)
	last := publish(t, a.b, "b", 100)
	a.kept = waitCovered(t, a.b, last)
	mustOK(t, verify(t, FromDeployment(a.b), a.key, VerifyOptions{Kept: a.kept}))
	return a
}

// verifyKept verifies the deployment against the kept checkpoint and returns
// the first problem, failing the test when there is none.
func (a *attacked) verifyKept(t *testing.T) Problem {
	t.Helper()
	r := verify(t, FromDeployment(a.reopen(t)), a.key, VerifyOptions{Kept: a.kept})
	if r.OK() || r.KeptHolds {
		t.Fatalf("an attacked log verified: %+v", r)
	}
	t.Logf("caught: %+v", r.Problems[0])
	return r.Problems[0]
}

// reopen binds the resources again, as a verifier started now does: once
// the server restarted on an edited store has recovered its streams, which
// takes longer than half a minute on a loaded machine.
func (a *attacked) reopen(t *testing.T) *broker.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		b, err := broker.OpenAll(ctx, a.nc, broker.Config{})
		if err == nil {
			return b
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func wantProblem(t *testing.T, p Problem, kind string, leaf int64, execution string) {
	t.Helper()
	if p.Kind != kind || p.Leaf != leaf || p.Seq != uint64(leaf)+1 || p.Execution != execution {
		t.Fatalf("problem %+v, want %s at leaf %d (execution %q)", p, kind, leaf, execution)
	}
}

// auditBlocks lists the files of the audit stream's message blocks.
func auditBlocks(t *testing.T, storeDir string, names broker.Names) []string {
	t.Helper()
	var blocks []string
	_ = filepath.WalkDir(storeDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".blk") &&
			strings.Contains(p, string(filepath.Separator)+names.AuditStream()+string(filepath.Separator)) {
			blocks = append(blocks, p)
		}
		return nil
	})
	if len(blocks) == 0 {
		t.Fatal("no message block of the audit stream in the store")
	}
	return blocks
}

// editBlocks changes one byte of the message holding marker in the audit
// stream's blocks, with the server stopped. With reseal it also computes
// the record's checksum again, as JetStream's file store does (a
// HighwayHash keyed by the stream's name and the block's number), so that
// the server serves the edited message instead of dropping it.
func editBlocks(t *testing.T, storeDir string, names broker.Names, marker string, reseal bool) {
	t.Helper()
	for _, p := range auditBlocks(t, storeDir, names) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(marker)) {
			continue
		}
		index, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(p), ".blk"), 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		if !editRecord(b, names.AuditStream(), uint32(index), []byte(marker), reseal) {
			t.Fatalf("marker %q not in a record of %s", marker, p)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("marker %q in none of the audit stream's blocks", marker)
}

// editRecord walks a block's records — total_len(4, high bit: has
// headers) sequence(8) timestamp(8) subject_len(2) subject [header_len(4)
// header] message checksum(8), little-endian — and changes the first byte
// of marker in the one that holds it.
func editRecord(block []byte, stream string, index uint32, marker []byte, reseal bool) bool {
	le := binary.LittleEndian
	const hbit = 1 << 31
	for i := 0; i+22 <= len(block); {
		rl := le.Uint32(block[i:])
		hasHdr := rl&hbit != 0
		rl &^= hbit
		if rl < 30 || i+int(rl) > len(block) {
			return false
		}
		rec := block[i : i+int(rl)]
		j := bytes.Index(rec, marker)
		if j < 0 {
			i += int(rl)
			continue
		}
		rec[j] = 'X'
		if reseal {
			key := sha256.Sum256(fmt.Appendf(nil, "%s-%d", stream, index))
			h, _ := highwayhash.New64(key[:])
			off := 22 + int(le.Uint16(rec[20:]))
			h.Write(rec[4:20])
			h.Write(rec[22:off])
			if hasHdr {
				hl := int(le.Uint32(rec[off:]))
				h.Write(rec[off+4 : off+4+hl])
				off += 4 + hl
			}
			h.Write(rec[off : len(rec)-8])
			copy(rec[len(rec)-8:], h.Sum(nil))
		}
		return true
	}
	return false
}

// (a) One event edited in place in the store's files, the server stopped
// and restarted. JetStream's checksum drops the record: the event is
// missing. With the checksum forged too, the server serves the edited
// event: it is edited. Either way the verifier names it.
func TestAttack_EditInPlace(t *testing.T) {
	t.Parallel()
	for _, reseal := range []bool{false, true} {
		t.Run(fmt.Sprintf("checksum-forged=%v", reseal), func(t *testing.T) {
			t.Parallel()
			a := newAttacked(t)
			a.cp.stop()
			a.env.Stop()
			editBlocks(t, a.env.StoreDir, a.b.Names, "MARK-a-00123", reseal)
			a.env.Restart(t)
			p := a.verifyKept(t)
			if reseal {
				wantProblem(t, p, KindEdited, 123, "_anon.a-00123")
			} else {
				wantProblem(t, p, KindMissing, 123, "")
			}
		})
	}
}

// rewriteStream deletes the audit stream with the admin's credentials and
// creates it again with the messages keep lets through, in order.
func rewriteStream(t *testing.T, a *attacked, keep func(i int, m *Msg) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var msgs []*Msg
	if err := FromDeployment(a.b).Messages(ctx, 1, func(m *Msg) error { msgs = append(msgs, m); return nil }); err != nil {
		t.Fatal(err)
	}
	cfg := a.b.Audit.CachedInfo().Config
	if err := a.b.JS.DeleteStream(ctx, cfg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := a.b.JS.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if !keep(i, m) {
			continue
		}
		if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
			t.Fatal(err)
		}
	}
}

// (b) The stream deleted and created again with one event left out.
func TestAttack_RecreatedWithoutOneEvent(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	rewriteStream(t, a, func(i int, _ *Msg) bool { return i != 200 })
	p := a.verifyKept(t)
	wantProblem(t, p, KindMissing, 200, "")
	if p.Count != 1 {
		t.Fatalf("%d leaves said missing, want 1", p.Count)
	}
}

// (c) The last 50 events cut off.
func TestAttack_TruncatedLastEvents(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	rewriteStream(t, a, func(i int, _ *Msg) bool { return i < 650 })
	p := a.verifyKept(t)
	wantProblem(t, p, KindMissing, 650, "")
	if p.Count != 50 {
		t.Fatalf("%d leaves said missing, want 50", p.Count)
	}
}

// Two events swapped, and one inserted: reordered, appended before.
func TestAttack_ReorderedAndInserted(t *testing.T) {
	t.Parallel()
	t.Run("reordered", func(t *testing.T) {
		t.Parallel()
		a := newAttacked(t)
		var held *Msg
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rewriteStream(t, a, func(i int, m *Msg) bool {
			switch i {
			case 300:
				held = m
				return false
			case 302:
				if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
					t.Fatal(err)
				}
				if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: held.Subject, Header: held.Header, Data: held.Data}); err != nil {
					t.Fatal(err)
				}
				return false
			}
			return true
		})
		wantProblem(t, a.verifyKept(t), KindReordered, 300, "_anon.a-00301")
	})
	t.Run("appended before", func(t *testing.T) {
		t.Parallel()
		a := newAttacked(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rewriteStream(t, a, func(i int, m *Msg) bool {
			if i == 400 {
				key := "_anon.forged"
				if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: a.b.Names.AuditSubject(key),
					Header: nats.Header{broker.AuditExecutionHeader: {key}}, Data: []byte("an approval that never was")}); err != nil {
					t.Fatal(err)
				}
			}
			return true
		})
		p := a.verifyKept(t)
		wantProblem(t, p, KindAppendedBefore, 400, "_anon.forged")
		if p.Count != 1 {
			t.Fatalf("%d messages said inserted, want 1", p.Count)
		}
	})
}

// deleteLog removes the audit stream, the trail bucket and the checkpoints
// and provisions them anew, empty, with the admin's credentials.
func deleteLog(t *testing.T, a *attacked) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, s := range []string{a.b.Names.AuditStream(), a.b.Names.CheckpointStream()} {
		if err := a.b.JS.DeleteStream(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.b.JS.DeleteKeyValue(ctx, a.b.Names.TrailBucket()); err != nil {
		t.Fatal(err)
	}
	a.b = provision(t, a.nc)
}

// (d) The whole log written again with a history that is consistent in
// itself but not the one signed: events 0 to 299 as they were, then others.
// Without the key, the forger's checkpoints do not verify; with it (the
// operator is the attacker), they verify but no longer hash to the kept
// checkpoint; given the bundle the auditor kept, the first event that
// differs is named.
func TestAttack_RewrittenHistory(t *testing.T) {
	t.Parallel()
	for _, withKey := range []bool{false, true} {
		t.Run(fmt.Sprintf("forger-holds-the-key=%v", withKey), func(t *testing.T) {
			t.Parallel()
			a := newAttacked(t)
			bundlePath := filepath.Join(t.TempDir(), "kept.bundle")
			exportTo(t, FromDeployment(a.b), bundlePath)
			a.cp.stop()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var msgs []*Msg
			if err := FromDeployment(a.b).Messages(ctx, 1, func(m *Msg) error { msgs = append(msgs, m); return nil }); err != nil {
				t.Fatal(err)
			}
			deleteLog(t, a)
			for i, m := range msgs {
				if i == 300 {
					m.Data = []byte("event of _anon.a-00300, the approval was given")
				}
				if _, err := a.b.JS.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}); err != nil {
					t.Fatal(err)
				}
			}
			signer := newKey(t, "audit.example/payments") // same name, another key
			if withKey {
				signer = a.key
			}
			runCheckpointer(t, a.b, signer, "forger")
			waitCovered(t, a.b, uint64(len(msgs)))

			r := verify(t, FromDeployment(a.reopen(t)), a.key, VerifyOptions{Kept: a.kept})
			if r.OK() || r.KeptHolds {
				t.Fatalf("a rewritten log verified: %+v", r)
			}
			kinds := map[string]int{}
			for _, p := range r.Problems {
				kinds[p.Kind]++
			}
			if withKey && (kinds[KindForged] != 0 || kinds[KindInconsistent] == 0) {
				t.Fatalf("problems %+v: want the kept checkpoint inconsistent, nothing forged", r.Problems)
			}
			if !withKey && (kinds[KindForged] == 0 || r.Verified != 0) {
				t.Fatalf("problems %+v (%d verified): want every stored checkpoint forged", r.Problems, r.Verified)
			}
			t.Logf("caught: %+v", r.Problems)

			kb, err := ReadBundle(bundlePath)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := LastCheckpoint(ctx, kb)
			if err != nil {
				t.Fatal(err)
			}
			r = verify(t, FromDeployment(a.reopen(t)), a.key, VerifyOptions{Kept: kept, KeptTiles: kb})
			if r.OK() {
				t.Fatal("a rewritten log verified against the kept bundle")
			}
			wantProblem(t, r.Problems[0], KindEdited, 300, "_anon.a-00300")
		})
	}
}

func exportTo(t *testing.T, src Source, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Export(ctx, src, f, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// (e) An older copy of the store restored: the last events, their tiles
// and checkpoints are gone together, and the log ends before the kept
// checkpoint.
func TestAttack_OlderCopyRestored(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	a.cp.stop()
	a.env.Stop()
	backup := filepath.Join(t.TempDir(), "backup")
	if err := os.CopyFS(backup, os.DirFS(a.env.StoreDir)); err != nil {
		t.Fatal(err)
	}
	a.env.Restart(t)
	a.cp = runCheckpointer(t, a.b, a.key, "cp")
	last := publish(t, a.b, "c", 100)
	a.kept = waitCovered(t, a.b, last)
	a.cp.stop()
	a.env.Stop()
	if err := os.RemoveAll(a.env.StoreDir); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(a.env.StoreDir, os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	a.env.Restart(t)
	p := a.verifyKept(t)
	wantProblem(t, p, KindMissing, 700, "")
	if p.Count != 100 {
		t.Fatalf("%d leaves said missing, want 100", p.Count)
	}
}

// The checkpointer does not extend a log whose stream lost its last leaf:
// its new messages would take others' places.
func TestCheckpointer_RefusesAStreamThatLostEvents(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	a.cp.stop()
	rewriteStream(t, a, func(i int, _ *Msg) bool { return i < 650 })
	publish(t, a.b, "d", 100) // sequences 651 to 750: the log's 650 to 699 are others
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cp := NewCheckpointer(a.reopen(t), a.key.signer, a.key.vkey, a.key.known, Config{Interval: 50 * time.Millisecond})
	if err := cp.step(ctx); err == nil || !strings.Contains(err.Error(), "not extending") {
		t.Fatalf("step over a stream that lost events: %v", err)
	}
	cp.drop()
	signed, err := Latest(ctx, a.b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(signed, a.kept) {
		t.Fatal("a checkpoint was signed over a stream that lost events")
	}
}

// The checkpointer does not start a new log when the checkpoints were
// removed and the tree is still there: it would sign another history under
// the log's name.
func TestCheckpointer_RefusesToStartAgainWithoutItsCheckpoints(t *testing.T) {
	t.Parallel()
	a := newAttacked(t)
	a.cp.stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.b.JS.DeleteStream(ctx, a.b.Names.CheckpointStream()); err != nil {
		t.Fatal(err)
	}
	b := provision(t, a.nc)
	cp := NewCheckpointer(b, a.key.signer, a.key.vkey, a.key.known, Config{Interval: 50 * time.Millisecond})
	if err := cp.step(ctx); err == nil || !strings.Contains(err.Error(), "not starting another log") {
		t.Fatalf("step without checkpoints: %v", err)
	}
	if _, err := Latest(ctx, b, nil); !errors.Is(err, ErrNoLog) {
		t.Fatalf("a checkpoint was signed: %v", err)
	}
}

// Bytes put in a tile (what a worker's stream republishing into the trail
// bucket can do) are caught, a tile of the leaves' hashes or one above
// them: verify names the changed tile, and the checkpointer extends
// nothing over it.
func TestAttack_TileOverwritten(t *testing.T) {
	t.Parallel()
	for _, tile := range [][2]int64{{0, 2}, {1, 0}} {
		t.Run(tileKey(int(tile[0]), tile[1]), func(t *testing.T) {
			t.Parallel()
			a := newAttacked(t)
			a.cp.stop()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// Partial tiles at the right edge: those a checkpointer reads
			// back and extends.
			key := tileKey(int(tile[0]), tile[1])
			e, err := a.b.Trail.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			junk := bytes.Repeat([]byte{0x5a}, len(e.Value()))
			if _, err := a.b.Trail.Put(ctx, key, junk); err != nil {
				t.Fatal(err)
			}
			if p := a.verifyKept(t); p.Kind != KindTile {
				t.Fatalf("problem %+v, want a changed tile", p)
			}
			publish(t, a.b, "c", 10)
			cp := NewCheckpointer(a.reopen(t), a.key.signer, a.key.vkey, a.key.known, Config{Interval: 50 * time.Millisecond})
			if err := cp.step(ctx); err == nil {
				t.Fatal("a checkpointer extended a log over an overwritten tile")
			}
			cp.drop()
			if signed, err := Latest(ctx, a.b, nil); err != nil || !bytes.Equal(signed, a.kept) {
				t.Fatalf("a checkpoint was signed over an overwritten tile (%v)", err)
			}
		})
	}
}
