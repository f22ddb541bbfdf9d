package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/executor"
)

type Meeting struct {
	Title  string        `json:"title"`
	At     time.Time     `json:"at"`
	Length time.Duration `json:"length"`
	Share  float32       `json:"share,omitempty"`
}

// An agent sends JSON; the handler gets the Go types it declares, with the
// meaning encoding/json gives them (a Go duration string is accepted too).
// What does not fit ends INPUT_INVALID, every issue with its path.
func Example_jsonInput() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	schedule := executor.Define("calendar.schedule", executor.Meta{
		Description: "Schedules a meeting.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectWrite,
	}, func(ctx context.Context, call executor.Call[Meeting]) (string, error) {
		m := call.Input
		return fmt.Sprintf("%s at %s for %s (share %g)", m.Title, m.At.UTC().Format(time.Kitchen), m.Length, m.Share), nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, schedule)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	env, err := c.Call(ctx, "calendar.schedule",
		json.RawMessage(`{"title":"Review","at":"2026-11-30T10:00:00Z","length":"1h30m","share":0.5}`), executor.As(exampleAlice))
	check(err)
	var out string
	check(env.Output.Decode(&out))
	fmt.Println(env.Status, out)

	env, err = c.Call(ctx, "calendar.schedule",
		json.RawMessage(`{"title":"Review","at":"tomorrow","length":5400000000000,"share":1e39}`), executor.As(exampleAlice))
	check(err)
	fmt.Println(env.Status, env.Error.Code)
	for _, is := range env.Error.Details["issues"].([]any) {
		is := is.(map[string]any)
		fmt.Printf("  %s: %s\n", is["path"], is["message"])
	}
	// Output:
	// completed Review at 10:00AM for 1h30m0s (share 0.5)
	// failed INPUT_INVALID
	//   at: expected a date and time in RFC 3339 format, like 2026-11-30T10:00:00Z
	//   share: expected a number from -3.4028234663852886e+38 to 3.4028234663852886e+38
}
