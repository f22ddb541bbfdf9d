package executor_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
	auditlog "github.com/capstan-dev/capstan/internal/trail"
)

// An execution's trail is proved in the deployment's signed audit log, and
// its terminal event commits to its envelope, completed or failed: the
// proof verifies with the public key alone, and fails when the envelope, an
// event's bytes or the key is not the one signed.
func TestProveTrail_TheEnvelopeIsProvedThroughTheTrail(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	fails := executor.Define("demo.fails", executor.Meta{Description: "Fails.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone},
		func(context.Context, executor.Call[echoIn]) (echoIn, error) { return echoIn{}, errors.New("no") })
	startWorker(t, nc, executor.WorkerConfig{}, echoCap(nil), fails)
	c := newClient(t, nc)
	pub := runLog(t, nc)

	for _, id := range []string{"demo.echo", "demo.fails"} {
		got, err := c.Call(ctxT(t), id, echoIn{Hello: "world"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.ProveTrail(ctxT(t), got.ExecutionID)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Verify(pub); err != nil {
			t.Fatalf("%s (%s): %v", id, got.Status, err)
		}
		last := p.Messages[len(p.Messages)-1].Events
		if h, _ := last[len(last)-1].Data["envelopeHash"].(string); len(h) != 64 {
			t.Fatalf("%s: the terminal event %+v commits to no envelope", id, last[len(last)-1])
		}
		stored, err := envelope.DecodeEnvelope(p.Envelope)
		if err != nil || stored.Status != got.Status || stored.FinalizedAt != got.FinalizedAt {
			t.Fatalf("%s: the proof's envelope %+v (%v) is not the one the call returned", id, stored, err)
		}

		tampered := *p
		tampered.Envelope = append([]byte(nil), p.Envelope...)
		tampered.Envelope[len(tampered.Envelope)-1] ^= 1
		if tampered.Verify(pub) == nil {
			t.Fatalf("%s: another envelope verified", id)
		}
		tampered = *p
		tampered.Messages = append([]audit.ProvedMessage(nil), p.Messages...)
		tampered.Messages[0].Data = append([]byte(nil), p.Messages[0].Data...)
		tampered.Messages[0].Data[len(tampered.Messages[0].Data)-2] ^= 1
		if tampered.Verify(pub) == nil {
			t.Fatalf("%s: an edited event verified", id)
		}
		other := filepath.Join(t.TempDir(), "other")
		if _, err := auditlog.Keygen(other, "test.example/exec"); err != nil {
			t.Fatal(err)
		}
		otherPub, _ := os.ReadFile(filepath.Join(other, auditlog.PublicKeyFile))
		if p.Verify(string(otherPub)) == nil {
			t.Fatalf("%s: verified with another key", id)
		}
	}
}

// runLog runs a checkpointer on nc's deployment until the test ends and
// returns its public key file's text.
func runLog(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := auditlog.Keygen(dir, "test.example/exec"); err != nil {
		t.Fatal(err)
	}
	signer, vkey, err := auditlog.LoadSigner(filepath.Join(dir, auditlog.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	known, _, err := auditlog.LoadVerifiers(filepath.Join(dir, auditlog.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.Provision(ctxT(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp := auditlog.NewCheckpointer(b, signer, vkey, known, auditlog.Config{Interval: 50 * time.Millisecond})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cp.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	pub, err := os.ReadFile(filepath.Join(dir, auditlog.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(pub)
}
