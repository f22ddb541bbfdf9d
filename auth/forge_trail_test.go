package auth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"

	capaudit "github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/auditproof"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
)

// TestForge_TrailIsTheCheckpointersAlone attacks the audit log's tree,
// lease, stated keys and checkpoints with a worker's and a producer's real
// credentials, on the embedded server and on the official nats-server with
// the generated configuration: every write is refused and nothing of the
// trail bucket or the checkpoints stream changes. What a worker's own
// stream or push consumer files there (the server does not hold them to
// their creator's permissions) stops nothing: the log grows, proves, and
// verifies but for those messages, each named as forged.
func TestForge_TrailIsTheCheckpointersAlone(t *testing.T) {
	t.Parallel()
	for _, d := range []deployment{embedded, official} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			testTrailForges(t, newRigOn(t, d))
		})
	}
}

func testTrailForges(t *testing.T, r *rig) {
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	cp, dir, known := r.startCheckpointer(t)

	alice, aliceNC, aliceV := r.client(t, "alice", executor.SurfaceDirect)
	env, err := alice.Call(ctx, "t.echo", Echo{Text: "before"})
	if err != nil {
		t.Fatal(err)
	}
	r.trail(t, env.ExecutionID, "capability.completed")
	covered := waitLogCovers(t, ctx, r, 0)
	// The checkpointer has nothing to add while the attacks run: the
	// trail bucket and the checkpoints stream stay as they are unless an
	// attack changes them.
	before := r.trailWorld(t)

	workerV := newViolations()
	worker := r.connect(t, auth.WorkerPrincipal, workerV.handler())
	tile := "$KV." + n.TrailBucket() + "." + "tile/8/0/000"
	forged := []byte("forged")
	writes := []string{
		"$KV." + n.TrailBucket() + ".lease",
		"$KV." + n.TrailBucket() + ".keys",
		tile,
		n.CheckpointSubject(),
	}
	admin := []string{
		"$JS.API.STREAM.MSG.DELETE.KV_" + n.TrailBucket(),
		"$JS.API.STREAM.MSG.DELETE." + n.CheckpointStream(),
		"$JS.API.STREAM.PURGE.KV_" + n.TrailBucket(),
		"$JS.API.STREAM.PURGE." + n.CheckpointStream(),
		"$JS.API.STREAM.DELETE.KV_" + n.TrailBucket(),
		"$JS.API.STREAM.DELETE." + n.CheckpointStream(),
		"$JS.API.STREAM.UPDATE.KV_" + n.TrailBucket(),
		"$JS.API.STREAM.UPDATE." + n.CheckpointStream(),
	}
	for _, subject := range append(append([]string{}, writes...), admin...) {
		if err := worker.Publish(subject, forged); err != nil {
			t.Fatal(err)
		}
		workerV.wait(t, ctx, subject)
	}
	// A producer reaches neither, in its own account or by the capstan
	// account's subjects.
	for _, subject := range append(append([]string{}, writes...), admin...) {
		if err := aliceNC.Publish(subject, forged); err != nil {
			t.Fatal(err)
		}
		aliceV.wait(t, ctx, subject)
	}
	// Nor may a worker take the subjects of the log's resources into a
	// stream of its own.
	wjs, err := jetstream.New(worker)
	if err != nil {
		t.Fatal(err)
	}
	for i, subject := range []string{"$KV." + n.TrailBucket() + ".>", n.CheckpointSubject()} {
		if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGE_OVERLAP_" + string(rune('A'+i)),
			Subjects: []string{subject}, Storage: jetstream.MemoryStorage}); err == nil {
			t.Errorf("a worker created a stream on %s", subject)
		}
	}
	r.assertTrailUnchanged(t, before)
	if !cp.Holding() {
		t.Error("the checkpointer lost its lease to the attacks")
	}

	// What the server does not refuse a worker: a push consumer delivers
	// where its creator says, and a stream republishes where its creator
	// says, both with the server's own client, whatever the creator's
	// permissions. Aimed at the lease and the checkpoints' subject, what
	// they file stops nothing: the checkpointer takes a lease that holds
	// no lease and extends the last checkpoint its keys signed, and Verify
	// names every message of the checkpoints stream they did not sign.
	audit, err := wjs.Stream(ctx, n.AuditStream())
	if err != nil {
		t.Fatal(err)
	}
	lease := "$KV." + n.TrailBucket() + ".lease"
	for i, dest := range []string{lease, n.CheckpointSubject()} {
		if _, err := audit.CreateOrUpdatePushConsumer(ctx, jetstream.ConsumerConfig{Name: "forge-push-" + string(rune('a'+i)),
			DeliverSubject: dest, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute}); err != nil {
			t.Logf("push consumer onto %s: %v", dest, err)
		}
		name, subject := "FORGE_REPUBLISH_"+string(rune('A'+i)), "forge.republish."+string(rune('a'+i))
		if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
			Storage: jetstream.MemoryStorage, RePublish: &jetstream.RePublish{Source: subject, Destination: dest}}); err != nil {
			t.Logf("stream republishing onto %s: %v", dest, err)
			continue
		}
		if _, err := wjs.Publish(ctx, subject, forged); err != nil {
			t.Fatal(err)
		}
	}
	for _, text := range []string{"after", "and after"} {
		env, err = alice.Call(ctx, "t.echo", Echo{Text: text})
		if err != nil {
			t.Fatal(err)
		}
		r.trail(t, env.ExecutionID, "capability.completed")
		covered = waitLogCovers(t, ctx, r, covered)
	}
	rep, err := trail.Verify(ctx, trail.FromDeployment(r.admin), known, trail.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Problems {
		if p.Kind != trail.KindForged {
			t.Errorf("verify: %+v", p)
		}
	}
	if rep.Unchecked != 0 || rep.Verified+len(rep.Problems) != rep.Checkpoints || rep.Size != covered {
		t.Errorf("verify after the attacks: %+v", rep)
	}
	t.Logf("checkpoints stream: %d signed, %d filed by the attacks", rep.Verified, len(rep.Problems))
	proof, err := auditproof.Prove(ctx, r.admin, "alice", env.ExecutionID, "")
	if err != nil {
		t.Fatalf("prove alice's execution after the attacks: %v", err)
	}
	pub, err := os.ReadFile(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.Verify(string(pub)); err != nil || len(proof.Messages) == 0 {
		t.Fatalf("proof of alice's execution after the attacks: %v, %d messages", err, len(proof.Messages))
	}
}

// startCheckpointer makes a signing key and runs the deployment's
// checkpointer with an admin's credentials, as capstan server runs it,
// until the test ends. It returns the key's directory and verifiers.
func (r *rig) startCheckpointer(t *testing.T) (*trail.Checkpointer, string, note.Verifiers) {
	t.Helper()
	dir := t.TempDir()
	if _, err := trail.Keygen(dir, "capstan/forge/test"); err != nil {
		t.Fatal(err)
	}
	signer, vkey, err := trail.LoadSigner(filepath.Join(dir, trail.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	known, _, err := trail.LoadVerifiers(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	cp := trail.NewCheckpointer(r.admin, signer, vkey, known, trail.Config{Interval: 100 * time.Millisecond, Name: "forge"})
	done := make(chan struct{})
	go func() { defer close(done); _ = cp.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return cp, dir, known
}

// TestTrail_TwoPrincipalsOneIDProveTheirOwn: alice and bob run executions
// under the same id at once; each proof verifies and holds its own
// principal's events only, the terminal one committing to its own
// envelope, and a proof with the other's messages put in fails.
func TestTrail_TwoPrincipalsOneIDProveTheirOwn(t *testing.T) {
	t.Parallel()
	r := newRigOn(t, embedded)
	ctx := testCtx(t)
	_, dir, _ := r.startCheckpointer(t)
	pub, err := os.ReadFile(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	id := envelope.NewExecutionID()
	principals := []string{"alice", "bob"}
	errs := make(chan error, len(principals))
	for _, p := range principals {
		c, _, _ := r.client(t, p, executor.SurfaceDirect)
		go func() {
			env, err := c.Call(ctx, "t.echo", Echo{Text: "of " + p}, executor.WithID(id))
			if err == nil && env.Status != envelope.StatusCompleted {
				err = fmt.Errorf("%s: %+v", p, env)
			}
			errs <- err
		}()
	}
	for range principals {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	proofs := map[string]*capaudit.TrailProof{}
	for _, p := range principals {
		r.trailOf(t, p, id, "capability.completed")
		proof, err := auditproof.Prove(ctx, r.admin, p, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := proof.Verify(string(pub)); err != nil {
			t.Fatalf("%s's proof: %v", p, err)
		}
		if proof.Envelope == nil {
			t.Fatalf("%s's proof carries no envelope", p)
		}
		committed := false
		for _, m := range proof.Messages {
			for _, ev := range m.Events {
				if ev.Key() != broker.Key(p, id) {
					t.Fatalf("%s's proof holds an event of %s", p, ev.Key())
				}
				committed = committed || ev.Data["envelopeHash"] != nil
			}
		}
		if !committed {
			t.Fatalf("%s's proof: no event commits to the envelope", p)
		}
		proofs[p] = proof
	}
	// Each one's envelope, messages or all of them in the other's proof
	// fail it.
	mixed := *proofs["alice"]
	mixed.Envelope = proofs["bob"].Envelope
	if mixed.Verify(string(pub)) == nil {
		t.Error("alice's proof verified with bob's envelope")
	}
	mixed = *proofs["alice"]
	mixed.Messages = append(slices.Clone(mixed.Messages), proofs["bob"].Messages...)
	if mixed.Verify(string(pub)) == nil {
		t.Error("alice's proof verified with bob's messages added")
	}
}

// waitLogCovers waits until the latest checkpoint is larger than after and
// covers every message the audit stream holds, and returns its size.
func waitLogCovers(t *testing.T, ctx context.Context, r *rig, after int64) int64 {
	t.Helper()
	for {
		info, err := r.admin.Audit.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		signed, err := trail.Latest(ctx, r.admin, nil)
		if err == nil {
			cp, err := trail.OpenUnverified(signed)
			if err != nil {
				t.Fatal(err)
			}
			if cp.Size > after && cp.FirstSeq+uint64(cp.Size) > info.State.LastSeq {
				return cp.Size
			}
		} else if !errors.Is(err, trail.ErrNoLog) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint covers the audit stream's %d messages", info.State.LastSeq)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// trailWorld is the trail bucket's keys with their values, and the
// checkpoints stream's state.
type trailWorldState struct {
	keys map[string]string
	cps  streamState
}

func (r *rig) trailWorld(t *testing.T) trailWorldState {
	t.Helper()
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	w := trailWorldState{keys: map[string]string{}}
	lister, err := r.admin.Trail.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range lister.Keys() {
		if k == "lease" {
			continue // renewed by the checkpointer all along
		}
		e, err := r.admin.Trail.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		w.keys[k] = string(e.Value())
	}
	s, err := r.admin.JS.Stream(ctx, n.CheckpointStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := info.State
	w.cps = streamState{Msgs: st.Msgs, Bytes: st.Bytes, FirstSeq: st.FirstSeq, LastSeq: st.LastSeq}
	return w
}

func (r *rig) assertTrailUnchanged(t *testing.T, before trailWorldState) {
	t.Helper()
	after := r.trailWorld(t)
	if after.cps != before.cps {
		t.Errorf("checkpoints stream changed: before %+v, after %+v", before.cps, after.cps)
	}
	for k, v := range after.keys {
		if before.keys[k] != v {
			t.Errorf("trail bucket key %s changed: %q", k, v)
		}
	}
	for k := range before.keys {
		if _, ok := after.keys[k]; !ok {
			t.Errorf("trail bucket key %s is gone", k)
		}
	}
	// The lease is the checkpointer's still.
	e, err := r.admin.Trail.Get(testCtx(t), "lease")
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	if bytes.Contains(e.Value(), []byte("forged")) {
		t.Errorf("lease %q", e.Value())
	}
}
