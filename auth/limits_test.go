package auth_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A principal exhausts only its own share: beyond its account's limits the
// server refuses its connections, subscriptions and large messages, and
// another principal goes on as if nothing happened.
func TestLimits_APrincipalExhaustsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	setup, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rigGrants {
		if g.Principal == "alice" {
			g.Limits = &auth.Limits{Connections: 2, Subscriptions: 8, Payload: 4 << 10}
		}
		if err := setup.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	e := testenv.Start(t, testenv.Auth(setup))
	r := &rig{setup: setup, url: e.URL, nodes: []string{e.URL}}
	r.connect = func(t *testing.T, p string, opts ...nats.Option) *nats.Conn { return e.ConnectAs(t, p, opts...) }
	ctx := testCtx(t)
	var errs errorLog
	dial := func() (*nats.Conn, error) {
		return nats.Connect(e.URL, nats.UserCredentials(setup.CredsPath("alice")), nats.NoReconnect(),
			nats.CustomInboxPrefix(broker.NewNames(setup.Prefix).InboxPrefix("alice")), nats.ErrorHandler(errs.handler))
	}
	first, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if nc, err := dial(); err == nil {
		nc.Close()
		t.Fatal("alice's third connection was accepted beyond her limit of 2")
	} else if !strings.Contains(strings.ToLower(err.Error()), "maximum") {
		t.Fatalf("alice's third connection: %v", err)
	}
	// Subscriptions beyond the limit are refused.
	for i := range 12 {
		if _, err := first.SubscribeSync(broker.NewNames(setup.Prefix).InboxPrefix("alice") + ".s" + string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		t.Logf("flush: %v", err)
	}
	errs.wait(t, ctx, "maximum subscriptions")
	// A message beyond her payload limit closes her connection, not bob's.
	// (The client knows the limit from the server and refuses at once.)
	big := bytes.Repeat([]byte("x"), 8<<10)
	if err := second.Publish(broker.NewNames(setup.Prefix).ExecSubject("alice", "t.echo"), big); !errors.Is(err, nats.ErrMaxPayload) {
		_ = second.Flush()
		errs.wait(t, ctx, "payload")
	}

	// Meanwhile bob works as ever, with inputs larger than alice may send.
	if r.admin, err = broker.Provision(ctx, e.Connect(t), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, r.admin.JS, setup, 0); err != nil {
		t.Fatal(err)
	}
	r.startWorker(t)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	env, err := bob.Call(ctx, "t.echo", Echo{Text: strings.Repeat("b", 16<<10)})
	if err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("bob: %v %+v", err, env)
	}
}

// errorLog keeps the errors the server reported to a connection.
type errorLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errorLog) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err.Error())
}

func (l *errorLog) wait(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for {
		l.mu.Lock()
		for _, e := range l.errs {
			if strings.Contains(strings.ToLower(e), want) {
				l.mu.Unlock()
				return
			}
		}
		seen := append([]string(nil), l.errs...)
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			t.Fatalf("no error naming %q; seen %v", want, seen)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
