package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/execution"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
)

func TestGovernance_DescribeAndInputErrorsThroughTheCLI(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)

	t.Run("describe --surface mcp prints descriptors with input schemas", func(t *testing.T) {
		stdout, stderr, code := capstan(t, url, "describe", "--surface", "mcp", "--json")
		if code != exitOK {
			t.Fatalf("exit %d, stderr %s", code, stderr)
		}
		d := decode[executor.Discovery](t, stdout)
		var ids []string
		for _, c := range d.Capabilities {
			ids = append(ids, c.ID)
			if c.InputSchema["type"] != "object" || c.Description == "" {
				t.Errorf("%s: %+v", c.ID, c)
			}
		}
		if strings.Join(ids, " ") != "demo.echo demo.flaky demo.report demo.sleep email.send orders.refund" || d.Surface != "mcp" || len(d.Digest) != 64 {
			t.Fatalf("discovery %s", stdout)
		}
		refund := d.Capabilities[5].InputSchema
		props := refund["properties"].(map[string]any)
		if props["orderId"].(map[string]any)["type"] != "string" || props["amount"].(map[string]any)["type"] != "integer" ||
			refund["additionalProperties"] != false {
			t.Fatalf("orders.refund schema %v", refund)
		}
	})

	t.Run("describe narrows by prefix and refuses a malformed actor", func(t *testing.T) {
		stdout, _, code := capstan(t, url, "describe", "--prefix", "demo.", "--actor", "anonymous", "--json")
		if d := decode[executor.Discovery](t, stdout); code != exitOK || len(d.Capabilities) != 4 {
			t.Fatalf("exit %d: %s", code, stdout)
		}
		_, stderr, code := capstan(t, url, "describe", "--actor", "root:alice")
		if code != exitFailed || !strings.Contains(stderr, "UNAUTHENTICATED") {
			t.Fatalf("exit %d, stderr %s", code, stderr)
		}
	})

	t.Run("broken JSON input says so", func(t *testing.T) {
		_, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":`)
		if code != exitUsage || !strings.Contains(stderr, "--input: input is not valid JSON") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})

	t.Run("mistyped fields are INPUT_INVALID with both paths", func(t *testing.T) {
		stdout, _, code := capstan(t, url, "call", "-o", "json", "orders.refund", "--input", `{"orderId":1,"amount":"x"}`)
		env := decode[envelope.Envelope](t, stdout)
		if code != exitFailed || env.Error == nil || env.Error.Code != envelope.CodeInputInvalid {
			t.Fatalf("exit %d: %s", code, stdout)
		}
		issues, _ := env.Error.Details["issues"].([]any)
		var paths []string
		for _, is := range issues {
			paths = append(paths, is.(map[string]any)["path"].(string))
		}
		if strings.Join(paths, " ") != "amount orderId" {
			t.Fatalf("issues %v", issues)
		}
	})
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An error a handler does not declare reaches a caller (and its model) as
// "The operation failed."; `capstan status` and the worker's logs keep the
// real cause.
func TestUndeclaredHandlerError_StatusAndLogsKeepTheCause(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	logs := &lockedBuffer{}
	reg, err := executor.NewRegistry(executor.Define("ledger.post", executor.Meta{
		Description: "Posts to the ledger.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
	}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
		return nil, errors.New("ledger: connection to 10.0.0.7:5432 refused")
	}))
	if err != nil {
		t.Fatal(err)
	}
	capstantest.Worker(t, reg, capstantest.WithConn(connect(t, env.URL)),
		capstantest.WithConfig(executor.WorkerConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))}))

	stdout, stderr, code := capstan(t, env.URL, "call", "-o", "json", "ledger.post", "--input", `{}`)
	got := decode[envelope.Envelope](t, stdout)
	if code != exitFailed || got.Error == nil || got.Error.Code != envelope.CodeExecutionFailed ||
		got.Error.Message != "The operation failed." || got.Error.ExposeToModel || strings.Contains(stdout, "10.0.0.7") {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	if m := got.ForModel(); m.Code != envelope.CodeInternalError || m.Message != "The operation failed." {
		t.Fatalf("for the model: %+v", m)
	}
	until := time.Now().Add(guard)
	for {
		if time.Now().After(until) {
			t.Fatalf("the record of %s is never finalized", got.ExecutionID)
		}
		stdout, stderr, code = capstan(t, env.URL, "status", got.ExecutionID, "--json")
		if code != exitOK {
			t.Fatalf("status: exit %d, %s", code, stderr)
		}
		st := decode[executor.ExecutionStatus](t, stdout)
		if st.Record != nil && st.Record.State == execution.StateFinalized {
			if !strings.Contains(st.Record.Cause, "connection to 10.0.0.7:5432 refused") {
				t.Fatalf("status keeps no cause: %s", stdout)
			}
			break
		}
		time.Sleep(20 * time.Millisecond) // the record is finalized just after the envelope
	}
	if !strings.Contains(logs.String(), "connection to 10.0.0.7:5432 refused") {
		t.Fatalf("logs: %s", logs.String())
	}
}
