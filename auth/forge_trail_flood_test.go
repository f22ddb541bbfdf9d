package auth_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/auditproof"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
)

// TestForge_WorkerStreamsFilingIntoTheLogStopNothing: a worker's real
// credentials create a stream that republishes onto the log's subjects,
// which the server stores without holding it to the worker's permissions,
// and file there, for as long as the attack lasts: checkpoints signed with
// another key, older checkpoints of the log replayed, bytes where the
// deployment states its public key, a lease held for a century. The
// checkpointer goes on covering every event (past a forged lease, once its
// holder signed nothing for a lease while events wait), a producer's trail
// proves, and verify names each forgery and nothing else.
func TestForge_WorkerStreamsFilingIntoTheLogStopNothing(t *testing.T) {
	t.Parallel()
	for _, target := range []string{"checkpoints", "stated keys", "lease"} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			r := newRigOn(t, embedded)
			ctx := testCtx(t)
			n := broker.NewNames(r.setup.Prefix)
			dir := t.TempDir()
			if _, err := trail.Keygen(dir, "capstan/forge/flood"); err != nil {
				t.Fatal(err)
			}
			known, _, err := trail.LoadVerifiers(filepath.Join(dir, trail.PublicKeyFile))
			if err != nil {
				t.Fatal(err)
			}
			cpr, _ := runCheckpointerIn(t, r, dir, "flooded")
			pub, err := os.ReadFile(filepath.Join(dir, trail.PublicKeyFile))
			if err != nil {
				t.Fatal(err)
			}
			alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
			env, err := alice.Call(ctx, "t.echo", Echo{Text: "before"})
			if err != nil {
				t.Fatal(err)
			}
			r.trail(t, env.ExecutionID, "capability.completed")
			covered := waitLogCovers(t, ctx, r, 0)

			worker := r.connect(t, auth.WorkerPrincipal)
			wjs, err := jetstream.New(worker)
			if err != nil {
				t.Fatal(err)
			}
			// What the worker files: the log's first checkpoint, read with
			// its own credentials, and checkpoints of the log's name signed
			// with a key of its own, covering more than the log holds.
			first, err := wjs.Stream(ctx, n.CheckpointStream())
			if err != nil {
				t.Fatal(err)
			}
			replay, err := first.GetMsg(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			cp, err := trail.Open(replay.Data, known)
			if err != nil {
				t.Fatal(err)
			}
			skey, vkey, err := note.GenerateKey(rand.Reader, cp.Origin)
			if err != nil {
				t.Fatal(err)
			}
			signer, err := note.NewSigner(skey)
			if err != nil {
				t.Fatal(err)
			}
			forged := *cp
			forged.Size = 1 << 40
			forgedNote, err := forged.Sign(signer)
			if err != nil {
				t.Fatal(err)
			}
			dest, files := n.CheckpointSubject(), [][]byte{forgedNote, replay.Data, []byte("junk")}
			switch target {
			case "stated keys":
				dest, files = "$KV."+n.TrailBucket()+".keys", [][]byte{[]byte(vkey + "\n")}
			case "lease":
				// A lease as a checkpointer writes it, held for ever.
				held, err := envelope.Marshal(struct {
					V      int       `json:"v"`
					Holder string    `json:"holder"`
					Until  time.Time `json:"until"`
				}{envelope.Version, "forger", time.Now().AddDate(100, 0, 0)})
				if err != nil {
					t.Fatal(err)
				}
				dest, files = "$KV."+n.TrailBucket()+".lease", [][]byte{held}
			}
			if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGE_FLOOD", Subjects: []string{"forge.flood"},
				Storage: jetstream.MemoryStorage, MaxMsgs: 10, RePublish: &jetstream.RePublish{Source: "forge.flood", Destination: dest}}); err != nil {
				t.Fatal(err)
			}
			if target == "stated keys" {
				// And one message where the checkpoints are: the
				// checkpointer's next checkpoint is refused, and it reads
				// the log again, stating its key.
				if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGE_ONCE", Subjects: []string{"forge.once"},
					Storage: jetstream.MemoryStorage, RePublish: &jetstream.RePublish{Source: "forge.once", Destination: n.CheckpointSubject()}}); err != nil {
					t.Fatal(err)
				}
				if _, err := wjs.Publish(ctx, "forge.once", []byte("junk")); err != nil {
					t.Fatal(err)
				}
			}
			fctx, stopFlood := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; fctx.Err() == nil; i++ {
					_, _ = wjs.Publish(fctx, "forge.flood", files[i%len(files)])
					time.Sleep(5 * time.Millisecond)
				}
			}()
			defer func() { stopFlood(); wg.Wait() }()

			// The checkpointer notices the attack (a checkpoint of its own
			// refused) and goes on.
			for i := range 3 {
				env, err = alice.Call(ctx, "t.echo", Echo{Text: fmt.Sprintf("during %d", i)})
				if err != nil {
					t.Fatal(err)
				}
				r.trail(t, env.ExecutionID, "capability.completed")
				covered = waitCheckpointerCovers(t, ctx, r, cpr, covered)
			}
			proof, err := auditproof.Prove(ctx, r.admin, "alice", env.ExecutionID, "")
			if err != nil {
				t.Fatalf("prove alice's execution during the attack: %v", err)
			}
			if err := proof.Verify(string(pub)); err != nil {
				t.Fatalf("alice's proof during the attack: %v", err)
			}
			stopFlood()
			wg.Wait()
			rep, err := trail.Verify(ctx, trail.FromDeployment(r.admin), known, trail.VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range rep.Problems {
				if p.Kind != trail.KindForged {
					t.Errorf("verify: %+v", p)
				}
			}
			if rep.Size < covered || rep.Verified+len(rep.Problems) != rep.Checkpoints {
				t.Errorf("verify after the attack: %+v", rep)
			}
			t.Logf("checkpoints stream: %d verified, %d forgeries named", rep.Verified, len(rep.Problems))
		})
	}
}

// waitCheckpointerCovers waits until the checkpoint cp last stored is
// larger than after and covers every message the audit stream holds, and
// returns its size: what it signed, whatever else the checkpoints stream
// holds.
func waitCheckpointerCovers(t *testing.T, ctx context.Context, r *rig, cp *trail.Checkpointer, after int64) int64 {
	t.Helper()
	for {
		info, err := r.admin.Audit.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := cp.Size(); n > after && uint64(n) >= info.State.LastSeq {
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the checkpointer signed %d leaves, not the audit stream's %d messages", cp.Size(), info.State.LastSeq)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestForge_WorkerBurstInTheCheckpointsThenARestart: a worker's stream
// files thousands of checkpoints signed with another key at once, and the
// checkpointer is restarted (an upgrade, a node's loss) before it signed
// again: it finds the last checkpoint the log's keys signed behind them
// and goes on, and a proof is made past them.
func TestForge_WorkerBurstInTheCheckpointsThenARestart(t *testing.T) {
	t.Parallel()
	r := newRigOn(t, embedded)
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	dir := t.TempDir()
	if _, err := trail.Keygen(dir, "capstan/forge/burst"); err != nil {
		t.Fatal(err)
	}
	first, stopFirst := runCheckpointerIn(t, r, dir, "first")
	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(ctx, "t.echo", Echo{Text: "before"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, env.ExecutionID, "capability.completed")
	covered := waitCheckpointerCovers(t, ctx, r, first, 0)
	stopFirst()

	worker := r.connect(t, auth.WorkerPrincipal)
	wjs, err := jetstream.New(worker)
	if err != nil {
		t.Fatal(err)
	}
	skey, _, err := note.GenerateKey(rand.Reader, "capstan/forge/burst")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGE_BURST", Subjects: []string{"forge.burst"},
		Storage: jetstream.MemoryStorage, MaxMsgs: 10, RePublish: &jetstream.RePublish{Source: "forge.burst", Destination: n.CheckpointSubject()}}); err != nil {
		t.Fatal(err)
	}
	const burst = 3000
	for i := range burst {
		cp := trail.Checkpoint{Origin: "capstan/forge/burst", Size: int64(1000 + i), Stream: n.AuditStream(), FirstSeq: 1}
		signed, err := cp.Sign(signer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wjs.Publish(ctx, "forge.burst", signed); err != nil {
			t.Fatal(err)
		}
	}
	cps, err := r.admin.JS.Stream(ctx, n.CheckpointStream())
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cps.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs >= burst {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	next, _ := runCheckpointerIn(t, r, dir, "next")
	env, err = alice.Call(ctx, "t.echo", Echo{Text: "after"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, env.ExecutionID, "capability.completed")
	waitCheckpointerCovers(t, ctx, r, next, covered)
	pub, err := os.ReadFile(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	proof, err := auditproof.Prove(ctx, r.admin, "alice", env.ExecutionID, string(pub))
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.Verify(string(pub)); err != nil {
		t.Fatalf("alice's proof after the burst: %v", err)
	}
}

// runCheckpointerIn runs a checkpointer with the key in dir, with an
// admin's credentials and a lease of a second, until stop or the test's
// end.
func runCheckpointerIn(t *testing.T, r *rig, dir, name string) (*trail.Checkpointer, func()) {
	t.Helper()
	signer, vkey, err := trail.LoadSigner(filepath.Join(dir, trail.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	known, _, err := trail.LoadVerifiers(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp := trail.NewCheckpointer(r.admin, signer, vkey, known, trail.Config{Interval: 100 * time.Millisecond, Lease: time.Second, Name: name})
	done := make(chan struct{})
	go func() { defer close(done); _ = cp.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return cp, stop
}
