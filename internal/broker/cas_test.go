package broker_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type counter struct {
	V  int    `json:"v"`
	N  int    `json:"n"`
	By string `json:"by,omitempty"`
}

// onEveryStore runs f against a single server (R1 buckets) and a three-node
// cluster (R3 buckets): a replicated stream reports a lost CAS with another
// error code than a single one, and the helpers must not care.
func onEveryStore(t *testing.T, f func(t *testing.T, b *broker.Broker)) {
	t.Run("R1", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		f(t, provision(t, env.Connect(t), broker.Config{}))
	})
	t.Run("R3", func(t *testing.T) {
		t.Parallel()
		c := testenv.StartCluster(t, 3)
		f(t, provision(t, c.Connect(t), broker.Config{Replicas: 3}))
	})
}

func TestCAS_HelpersMapEveryConflictToItsSentinel(t *testing.T) {
	t.Parallel()
	onEveryStore(t, func(t *testing.T, b *broker.Broker) {
		ctx := testCtx(t)
		kv := b.Executions
		if got := b.Exec.CachedInfo().Config.Replicas; got != b.Replicas {
			t.Fatalf("exec stream has %d replicas, want %d", got, b.Replicas)
		}

		if _, _, err := broker.Load[counter](ctx, kv, "missing"); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("Load of a missing key: %v, want ErrNotFound", err)
		}

		rev1, err := broker.Create(ctx, kv, "k", &counter{V: 1, N: 1})
		if err != nil || rev1 == 0 {
			t.Fatalf("first Create: rev %d, %v", rev1, err)
		}
		if _, err := broker.Create(ctx, kv, "k", &counter{V: 1, N: 99}); !errors.Is(err, broker.ErrExists) {
			t.Fatalf("second Create: %v, want ErrExists", err)
		}
		if v, rev, err := broker.Load[counter](ctx, kv, "k"); err != nil || v.N != 1 || rev != rev1 {
			t.Fatalf("after a refused Create: %+v rev %d (%v), want n=1 rev %d", v, rev, err, rev1)
		}

		rev2, err := broker.Update(ctx, kv, "k", &counter{V: 1, N: 2}, rev1)
		if err != nil || rev2 <= rev1 {
			t.Fatalf("Update at the current revision: rev %d, %v", rev2, err)
		}
		if _, err := broker.Update(ctx, kv, "k", &counter{V: 1, N: 99}, rev1); !errors.Is(err, broker.ErrRevisionMismatch) {
			t.Fatalf("Update at a stale revision: %v, want ErrRevisionMismatch", err)
		}
		if _, err := broker.Update(ctx, kv, "missing", &counter{V: 1, N: 99}, rev2); !errors.Is(err, broker.ErrRevisionMismatch) {
			t.Fatalf("Update of a missing key: %v, want ErrRevisionMismatch", err)
		}
		if v, rev, err := broker.Load[counter](ctx, kv, "k"); err != nil || v.N != 2 || rev != rev2 {
			t.Fatalf("after Update: %+v rev %d (%v), want n=2 rev %d", v, rev, err, rev2)
		}

		// A deleted key reads as missing and can be created again.
		if err := kv.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := broker.Load[counter](ctx, kv, "k"); !errors.Is(err, broker.ErrNotFound) {
			t.Fatalf("Load of a deleted key: %v, want ErrNotFound", err)
		}
		if _, err := broker.Create(ctx, kv, "k", &counter{V: 1, N: 3}); err != nil {
			t.Fatalf("Create over a deleted key: %v", err)
		}
		if _, err := broker.Create(ctx, kv, "k", &counter{V: 1, N: 4}); !errors.Is(err, broker.ErrExists) {
			t.Fatalf("second Create over a deleted key: %v, want ErrExists", err)
		}
	})
}

// Concurrent writers through the helpers: exactly one create wins, and
// read-modify-write loops that retry on ErrRevisionMismatch lose no increment.
func TestCAS_ConcurrentWritersLoseNothing(t *testing.T) {
	t.Parallel()
	onEveryStore(t, func(t *testing.T, b *broker.Broker) {
		ctx := testCtx(t)
		kv := b.Executions
		const writers, increments = 6, 10
		// A key never written, and a key written then deleted: a create over a
		// delete marker takes the server two round trips, and a rival may win
		// between them.
		if _, err := kv.Put(ctx, "reborn", []byte{0x80}); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, "reborn"); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"shared", "reborn"} {
			for round := range 5 {
				if round > 0 {
					if err := kv.Delete(ctx, key); err != nil {
						t.Fatal(err)
					}
				}
				var created, exists int
				var mu sync.Mutex
				var wg sync.WaitGroup
				for i := range writers {
					wg.Go(func() {
						_, err := broker.Create(ctx, kv, key, &counter{V: 1, By: fmt.Sprint(i)})
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							created++
						case errors.Is(err, broker.ErrExists):
							exists++
						default:
							t.Errorf("%s round %d: writer %d create: %v", key, round, i, err)
						}
					})
				}
				wg.Wait()
				if created != 1 || exists != writers-1 {
					t.Fatalf("%s round %d: %d creates won and %d were refused, want 1 and %d", key, round, created, exists, writers-1)
				}
			}
		}

		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for range writers {
			wg.Go(func() {
				for range increments {
					if err := increment(t, b, "shared"); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		// A direct get may be answered by a replica that has not yet
		// applied the last writes: read until it has. A lost increment
		// never comes.
		for {
			v, _, err := broker.Load[counter](ctx, kv, "shared")
			if err == nil && v.N == writers*increments {
				break
			}
			if err == nil && v.N > writers*increments {
				t.Fatalf("counter %+v, want %d: an increment counted twice", v, writers*increments)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("counter %+v (%v), want %d", v, err, writers*increments)
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

// increment adds one under CAS, re-reading after every lost race.
func increment(t *testing.T, b *broker.Broker, key string) error {
	ctx := testCtx(t)
	for {
		v, rev, err := broker.Load[counter](ctx, b.Executions, key)
		if err != nil {
			return err
		}
		v.N++
		_, err = broker.Update(ctx, b.Executions, key, v, rev)
		if !errors.Is(err, broker.ErrRevisionMismatch) {
			return err
		}
	}
}

func TestLoad_UndecodableRecordIsAnErrorNamingTheKey(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	env := testenv.Start(t)
	b := provision(t, env.Connect(t), broker.Config{})
	if _, err := b.Executions.Put(ctx, "bad", []byte{0xc1}); err != nil { // 0xc1 is never valid msgpack
		t.Fatal(err)
	}
	_, _, err := broker.Load[counter](ctx, b.Executions, "bad")
	if !errors.Is(err, envelope.ErrDecode) {
		t.Fatalf("Load of undecodable bytes: %v, want envelope.ErrDecode", err)
	}
	if want := "CAPSTAN_EXECUTIONS/bad"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
}

// The envelope bucket republishes what it stores on capstan.envelope.<id>, and
// only that: a second Create the server refused is never seen by a client.
func TestEnvelopes_OnlyStoredEnvelopesAreRepublished(t *testing.T) {
	t.Parallel()
	onEveryStore(t, func(t *testing.T, b *broker.Broker) {
		ctx := testCtx(t)
		msgs := make(chan *nats.Msg, 16)
		sub, err := b.NC.ChanSubscribe(b.Names.EnvelopeSubjects(), msgs)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := b.NC.Flush(); err != nil {
			t.Fatal(err)
		}

		first := counter{V: 1, N: 1, By: "first"}
		if _, err := broker.Create(ctx, b.Envelopes, "e1", &first); err != nil {
			t.Fatal(err)
		}
		if _, err := broker.Create(ctx, b.Envelopes, "e1", &counter{V: 1, N: 2, By: "second"}); !errors.Is(err, broker.ErrExists) {
			t.Fatalf("second Create: %v, want ErrExists", err)
		}
		// Republished messages arrive in stream order: once the sentinel is here,
		// anything the refused write could have caused would be here too.
		if _, err := broker.Create(ctx, b.Envelopes, "sentinel", &counter{V: 1}); err != nil {
			t.Fatal(err)
		}

		var got []*nats.Msg
		for {
			select {
			case m := <-msgs:
				got = append(got, m)
			case <-ctx.Done():
				t.Fatalf("sentinel not republished; received %d messages", len(got))
			}
			if got[len(got)-1].Subject == "capstan.envelope.sentinel" {
				break
			}
		}
		if len(got) != 2 {
			t.Fatalf("received %d messages before the sentinel, want 1 for e1", len(got)-1)
		}
		m := got[0]
		if m.Subject != "capstan.envelope.e1" || b.Names.EnvelopeKeyFromSubject(m.Subject) != "e1" {
			t.Fatalf("republished on %s", m.Subject)
		}
		var v counter
		if err := envelope.Unmarshal(m.Data, &v); err != nil || v != first {
			t.Fatalf("republished %+v (%v), want the first envelope %+v", v, err, first)
		}
		// The republished copy carries the stream sequence, which is the key's
		// revision, so a client can tell it from a later Get.
		if seq := m.Header.Get(jetstream.SequenceHeader); seq == "" {
			t.Errorf("republished message has no %s header: %v", jetstream.SequenceHeader, m.Header)
		}
		select {
		case m := <-msgs:
			t.Fatalf("unexpected message on %s after the sentinel", m.Subject)
		case <-time.After(0):
		}
	})
}
