package executor_test

import (
	"context"
	"fmt"

	"github.com/capstan-dev/capstan/executor"
)

// A handler says how far it has got with Call.Progress, as often as it
// likes; the caller follows with WithProgress (or Client.Progress, a
// channel). Reports are coalesced to at most four a second and are best
// effort: here the handler waits for each to be seen before it goes on, so
// that the example prints every one.
func ExampleCall_Progress() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	seen := make(chan struct{})
	render := executor.Define("reports.render", executor.Meta{
		Description: "Renders a report page by page.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[Report]) (string, error) {
		const pages = 3
		for page := 1; page <= pages; page++ {
			// ... render the page ...
			call.Progress(float64(page), pages, fmt.Sprintf("page %d rendered", page))
			select {
			case <-seen: // the example's reader saw it
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		return call.Input.Month + ": 3 pages", nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, render)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	ctx = executor.WithProgress(ctx, func(p executor.Progress) {
		fmt.Println(p.String())
		seen <- struct{}{}
	})
	env, err := c.Call(ctx, "reports.render", Report{Month: "2026-01"}, executor.As(exampleAlice))
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, out)
	// Output:
	// 1 of 3 (33%): page 1 rendered
	// 2 of 3 (66%): page 2 rendered
	// 3 of 3 (100%): page 3 rendered
	// completed 2026-01: 3 pages
}
