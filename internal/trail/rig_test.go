package trail

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/note"
)

// logKey makes a signing key in a test's directory and returns its signer,
// verifier key and the verifiers of its public key file.
type logKey struct {
	dir    string
	signer note.Signer
	vkey   string
	known  note.Verifiers
}

func newKey(t *testing.T, origin string) *logKey { return newKeyTB(t, origin) }

func newKeyTB(t testing.TB, origin string) *logKey {
	t.Helper()
	dir := t.TempDir()
	if _, err := Keygen(dir, origin); err != nil {
		t.Fatal(err)
	}
	s, vkey, err := LoadSigner(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	known, _, err := LoadVerifiers(filepath.Join(dir, PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return &logKey{dir: dir, signer: s, vkey: vkey, known: known}
}

func provision(t *testing.T, nc *nats.Conn) *broker.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := broker.Provision(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publish stores n audit messages of executions named from tag, each with
// its execution's header as a worker's, and returns the last sequence.
func publish(t *testing.T, b *broker.Broker, tag string, n int) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last uint64
	for i := range n {
		key := fmt.Sprintf("_anon.%s-%05d", tag, i)
		m := &nats.Msg{Subject: b.Names.AuditSubject(key), Header: nats.Header{broker.AuditExecutionHeader: {key}},
			Data: []byte(fmt.Sprintf("event of %s, MARK-%s-%05d", key, tag, i))}
		ack, err := b.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	return last
}

// running is a checkpointer run until the test ends or stop is called.
type running struct {
	cp   *Checkpointer
	stop func()
}

func runCheckpointer(t *testing.T, b *broker.Broker, k *logKey, name string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cp := NewCheckpointer(b, k.signer, k.vkey, k.known, Config{Interval: 100 * time.Millisecond, Lease: time.Second, Name: name})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cp.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return &running{cp: cp, stop: stop}
}

// waitCovered waits until the latest stored checkpoint covers the stream
// up to seq, and returns it.
func waitCovered(t *testing.T, b *broker.Broker, seq uint64) []byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		signed, err := Latest(ctx, b, nil)
		cancel()
		if err == nil {
			cp, err := OpenUnverified(signed)
			if err != nil {
				t.Fatal(err)
			}
			if cp.FirstSeq+uint64(cp.Size) > seq {
				return signed
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint covers sequence %d within a minute (last error %v)", seq, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func verify(t *testing.T, src Source, k *logKey, opts VerifyOptions) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := Verify(ctx, src, k.known, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustOK(t *testing.T, r *Report) {
	t.Helper()
	if !r.OK() {
		t.Fatalf("verify: %+v", r.Problems)
	}
}

func (m *Msg) natsMsg() *nats.Msg {
	return &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}
}
