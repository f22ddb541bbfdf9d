//go:build unix

package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/demo"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The tests of this file hold DESIGN §13 under SIGKILL: every accepted
// request ends, once, when workers share an id and when nobody will ever
// serve it.

// copySuffix ends the message id of a request's copy: a tag of its own, or
// the end of its tag (DESIGN §2).
const copySuffix = "-copy"

// copyID is the message id of a copy of the request whose message id is id.
func copyID(id string) string {
	if strings.Count(id, ".") < 2 {
		return id + "." + copySuffix[1:] // the key alone: a tag of its own
	}
	return id + copySuffix
}

// duplicator stores a second message of every other request published on
// subject, under its own message id: a duplicated delivery of the same
// execution, which workers sharing an id may receive at once.
type duplicator struct {
	mu     sync.Mutex
	copied map[string]bool
	seen   int
	wg     sync.WaitGroup
	sub    *nats.Subscription
}

func duplicate(t *testing.T, nc *nats.Conn, js jetstream.JetStream, subject string) *duplicator {
	t.Helper()
	d := &duplicator{copied: map[string]bool{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if id == "" || strings.HasSuffix(id, copySuffix) || strings.HasSuffix(id, "."+copySuffix[1:]) {
			return
		}
		d.mu.Lock()
		d.seen++
		pick := d.seen%2 == 0 && !d.copied[id]
		if pick {
			d.copied[id] = true
			d.wg.Add(1)
		}
		d.mu.Unlock()
		if !pick {
			return
		}
		cp := nats.NewMsg(m.Subject)
		cp.Data = append([]byte(nil), m.Data...)
		for k, v := range m.Header {
			cp.Header[k] = append([]string(nil), v...)
		}
		cp.Header.Set(jetstream.MsgIDHeader, copyID(id))
		// Publish from another goroutine: this one delivers the
		// subscription's messages.
		go func() {
			defer d.wg.Done()
			ctx, cancel := context.WithTimeout(runCtx(t), 30*time.Second)
			defer cancel()
			if _, err := js.PublishMsg(ctx, cp); err != nil {
				t.Errorf("copy of %s: %v", id, err)
			}
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d.sub = sub
	return d
}

// stop waits for the copies under way and returns the ids copied.
func (d *duplicator) stop() []string {
	_ = d.sub.Unsubscribe()
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for id := range d.copied {
		ids = append(ids, id)
	}
	return ids
}

// Three worker processes started with the same --id (a copied unit file),
// SIGKILLed and replaced under that id while email.send executions hold their
// effect, with every other request stored twice: ownership is the claim's
// token, not the id, so every execution ends with one envelope and no email
// runs its handler twice, whichever process with the id receives a copy.
func TestChaos_WorkersSharingAnID_EmailSentAtMostOnce(t *testing.T) {
	t.Parallel()
	n := scale(120, 600)
	d := scale(4*time.Second, 20*time.Second)
	r := newRig(t, chaosLease, 16)
	r.spec = workerSpec{id: "shared"}
	r.startServer()
	for range 3 {
		r.startWorker()
	}
	c := r.client("email.send")
	b := testhooks.Broker(c)
	dup := duplicate(t, r.connect(), b.JS, b.Names.ExecSubject(broker.Anonymous, "email.send"))

	// The record names the id, not the process: kill at random, which with
	// handlers held up to 300 ms finds work in flight.
	kills := make(chan int, 1)
	go func() { kills <- r.chaos(d, func() string { return "" }) }()
	ids, refused := submitSpread(t, c, n, d*4/5, func(i int) (string, any) {
		return "email.send", demo.EmailInput{To: fmt.Sprintf("user%d@example.com", i), Subject: "shared id", HoldMs: spread(i, 300)}
	})
	k := <-kills
	copied := dup.stop()
	if len(refused) > 0 {
		t.Fatalf("%d submissions refused with the server up", len(refused))
	}
	if len(copied) == 0 {
		t.Fatal("no request was stored twice")
	}
	// Every copy is consumed too: awaitAll waits for an empty stream.
	awaitAll(t, b, ids)

	tl := inspect(t, b, ids)
	checkOneEnvelopeEach(t, tl, ids)
	checkRecordsFinalized(t, tl)
	unknown, unknownSent := checkEmailAtMostOnce(t, tl)
	// Only a SIGKILL leaves a running attempt to take over here: takeovers
	// from the shared id are kills that hit work in flight.
	hits := tl.takenFrom["shared"]
	if hits == 0 {
		t.Errorf("none of the %d kills hit an attempt in flight: %s", k, tl)
	}
	if tl.duplicates == 0 {
		t.Errorf("no duplicate delivery was audited for %d requests stored twice: %s", len(copied), tl)
	}
	t.Logf("email.send, 3 workers with one id: executions=%d stored twice=%d kills=%d (running attempts taken over=%d) over %v; %s; OUTCOME_UNKNOWN=%d (email sent for %d of them)",
		len(ids), len(copied), k, hits, d, tl, unknown, unknownSent)
}

// The only pool serving email.send loses its worker to SIGKILL and nobody
// restarts it; requests keep coming with a short start deadline. Workers of
// another pool, themselves SIGKILLed and replaced while the sweeping lease
// passes between them, end every such request failed / NOT_STARTED: one
// envelope each, a finalized record, no attempt and no handler call.
func TestChaos_PoolKilled_RequestsEndNotStarted(t *testing.T) {
	t.Parallel()
	n := scale(60, 400)
	d := scale(3*time.Second, 20*time.Second)
	r := newRig(t, chaosLease, 8)
	r.startServer()
	mail := r.startWorkerAs(workerSpec{pool: "mail", capabilities: "email.send", sweepEvery: -time.Second})
	r.spec = workerSpec{capabilities: "demo.echo", sweepEvery: 100 * time.Millisecond}
	for range 2 {
		r.startWorker()
	}
	c := r.client("email.send", "demo.echo")
	b := testhooks.Broker(c)
	if got := r.killWorker(mail); got != mail {
		t.Fatalf("killed %s, not the mail pool's worker %s", got, mail)
	}

	kills := make(chan int, 1)
	go func() { kills <- r.chaos(d, func() string { return "" }) }()
	// Start deadlines from 100 ms to 1 s: some pass while the sweeping
	// lease is between workers.
	ids, refused := submitSpreadWith(t, c, n, d*4/5, func(i int) (string, any) {
		return "email.send", demo.EmailInput{To: fmt.Sprintf("user%d@example.com", i), Subject: "nobody"}
	}, func(i int) []executor.CallOption {
		return []executor.CallOption{executor.StartWithin(time.Duration(100+spread(i, 900)) * time.Millisecond)}
	})
	k := <-kills
	if len(refused) > 0 {
		t.Fatalf("%d submissions refused with the server up", len(refused))
	}
	awaitAll(t, b, ids)

	tl := inspect(t, b, ids)
	checkOneEnvelopeEach(t, tl, ids)
	checkRecordsFinalized(t, tl)
	for id, o := range tl.per {
		if o.env == nil {
			continue
		}
		if o.env.Status != envelope.StatusFailed || o.env.Error == nil || o.env.Error.Code != envelope.CodeNotStarted ||
			o.env.Error.Retryable || !o.env.Error.ExposeToModel || o.env.Attempts != 0 {
			t.Errorf("%s: envelope %s %+v after %d attempts; want failed/NOT_STARTED, not retryable, exposed, no attempt",
				id, o.env.Status, o.env.Error, o.env.Attempts)
		}
		if o.started != 0 || o.handlerCalls() != 0 || o.outbox != 0 {
			t.Errorf("%s: %d attempts started, %d handler calls, %d emails sent; it never ran", id, o.started, o.handlerCalls(), o.outbox)
		}
	}
	if tl.handlerCalls != 0 {
		t.Errorf("%d handler calls with the mail pool down from the start", tl.handlerCalls)
	}
	sweepers := map[string]bool{}
	for _, o := range tl.per {
		if o.env != nil {
			sweepers[o.env.FinalizedBy] = true
		}
	}
	t.Logf("email.send with its pool killed: executions=%d, sweeping workers killed=%d over %v, requests ended by %d of them; %s",
		len(ids), k, d, len(sweepers), tl)
}
