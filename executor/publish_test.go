package executor_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// republishes signals each time a client publishes a request again because
// no stream stored it.
type republishes chan struct{}

func (r republishes) Enabled(context.Context, slog.Level) bool { return true }
func (r republishes) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == "request not stored yet; publishing again" {
		select {
		case r <- struct{}{}:
		default:
		}
	}
	return nil
}
func (r republishes) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r republishes) WithGroup(string) slog.Handler      { return r }

// TestSubmitAndSubmitResume_PublishAgainUntilTheStreamAnswers: while no
// stream stores requests (as while a replicated exec stream elects a
// leader), Submit and SubmitResume both keep publishing under the execution
// id; once the stream is back, each returns, and its execution runs once.
func TestSubmitAndSubmitResume_PublishAgainUntilTheStreamAnswers(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx := ctxT(t)
	js, err := demo.Provision(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, executor.WorkerConfig{}, demo.Catalog(js)...)
	again := make(republishes, 1)
	c, err := executor.NewClient(env.Connect(t), executor.ClientConfig{Actor: alice, Logger: slog.New(again)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, rec := requireApproval(t, c, "orders.refund", map[string]any{"orderId": "o1", "amount": 900}, executor.As(alice))
	decide(t, c, rec.ID, true)

	for _, tc := range []struct {
		name   string
		submit func(ctx context.Context) (string, error)
	}{
		{"Submit", func(ctx context.Context) (string, error) {
			return c.Submit(ctx, "orders.refund", map[string]any{"orderId": "o2", "amount": 100}, executor.As(alice))
		}},
		{"SubmitResume", func(ctx context.Context) (string, error) { return c.SubmitResume(ctx, rec.ID) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := js.DeleteStream(ctx, testhooks.Broker(c).Names.ExecStream()); err != nil {
				t.Fatal(err)
			}
			type result struct {
				id  string
				err error
			}
			done := make(chan result, 1)
			go func() {
				id, err := tc.submit(ctx)
				done <- result{id, err}
			}()
			select {
			case <-again:
			case r := <-done:
				t.Fatalf("returned (%q, %v) while no stream could store the request", r.id, r.err)
			case <-ctx.Done():
				t.Fatal("the request was never published again")
			}
			// The stream is back; a worker started now recreates the pool's
			// consumer, which went with the stream.
			if _, err := broker.Provision(ctx, nc, broker.Config{}); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("%s: %v", tc.name, r.err)
			}
			startWorker(t, env.Connect(t), executor.WorkerConfig{}, demo.Catalog(js)...)
			got, err := c.Await(ctx, r.id)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != envelope.StatusCompleted || got.Attempts != 1 {
				t.Fatalf("envelope %+v %+v", got, got.Error)
			}
		})
	}
	if got, err := c.Approval(ctx, rec.ID); err != nil || got.Status != approvals.StatusConsumed {
		t.Fatalf("approval after the resume: %+v %v", got, err)
	}
}
