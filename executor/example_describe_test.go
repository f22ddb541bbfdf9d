package executor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/capstan-dev/capstan/executor"
)

type SearchQuery struct {
	Text  string `json:"text"`
	Limit int    `json:"limit,omitempty"`
}

// Client.Describe tells a surface and an actor which capabilities they may
// see, each with the JSON Schema of its input, derived from the Go input type
// by the same rules that check inputs. Exposure is deny by default: a
// capability exposed only on the direct surface is not listed for MCP.
func ExampleClient_Describe() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	search := executor.Define("docs.search", executor.Meta{
		Description: "Searches the product documentation.",
		Expose:      executor.On(executor.SurfaceMCP, executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
	}, func(ctx context.Context, call executor.Call[SearchQuery]) ([]string, error) {
		return nil, nil
	})
	reindex := executor.Define("docs.reindex", executor.Meta{
		Description: "Rebuilds the search index.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectWrite,
	}, func(ctx context.Context, call executor.Call[struct{}]) (string, error) {
		return "ok", nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{}, search, reindex)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	d, err := c.Describe(ctx, executor.SurfaceMCP, exampleAlice, executor.Scope{Prefix: "docs."})
	check(err)
	for _, capability := range d.Capabilities {
		schema := capability.InputSchema
		props, _ := schema["properties"].(map[string]any)
		names := make([]string, 0, len(props))
		for name := range props {
			names = append(names, name)
		}
		slices.Sort(names)
		fmt.Printf("%s (%s): %s\n", capability.ID, capability.SideEffect, capability.Description)
		fmt.Printf("  input: %s of %s; required: %v\n", schema["type"], strings.Join(names, ", "), schema["required"])
	}
	// Output:
	// docs.search (read): Searches the product documentation.
	//   input: object of limit, text; required: [text]
}
