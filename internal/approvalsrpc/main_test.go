package approvalsrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/auditemit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// Every store, connection and server a test started is gone when the tests
// end; the tests, each on its server, run several per CPU.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	goleak.VerifyTestMain(m)
}

var (
	alice = envelope.Actor{Kind: "user", ID: "alice"}
	bob   = envelope.Actor{Kind: "user", ID: "bob"}
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// storeOn provisions the resources on nc and returns a store auditing on them.
func storeOn(t *testing.T, nc *nats.Conn) (*approvalstore.Store, *broker.Broker) {
	t.Helper()
	b, err := broker.Provision(ctxT(t), nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return approvalstore.NewStore(b.Approvals, auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index})), b
}

func approve(t *testing.T, s *approvalstore.Store, id string) {
	t.Helper()
	if _, err := s.Decide(ctxT(t), id, approvals.Verdict{Approve: true, Approver: bob}); err != nil {
		t.Fatal(err)
	}
}
