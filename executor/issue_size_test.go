package executor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
)

type lineItem struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type basketIn struct {
	Baskets map[string][]lineItem `json:"baskets"`
}

// An input whose issues repeat a long key (a long key above many items, each
// missing its fields) must still end INPUT_INVALID, with an envelope the
// server accepts: its issue report does not grow with the input times the
// number of issues.
func TestInputInvalid_CraftedIssueReportStillEnds(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, executor.Define("basket.check", executor.Meta{
		Description: "Checks baskets.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[basketIn]) (map[string]any, error) {
		t.Error("the handler ran with an invalid input")
		return nil, nil
	}))
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	items := make([]any, 40)
	for i := range items {
		items[i] = map[string]any{}
	}
	in := map[string]any{"baskets": map[string]any{strings.Repeat("k", 300<<10): items}}
	got, err := c.Call(ctx, "basket.check", in, executor.As(alice))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeInputInvalid {
		t.Fatalf("envelope %+v, want failed INPUT_INVALID", got)
	}
	if len(got.Error.Details) == 0 {
		t.Error("the envelope lists no issue")
	}
}
