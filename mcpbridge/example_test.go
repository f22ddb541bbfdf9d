package mcpbridge_test

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/mcpbridge"
)

type Greeting struct {
	Name string `json:"name"`
}

// A capability exposed on the mcp surface becomes a tool of every actor's MCP
// server; a tools/call is one capstan execution for that actor. The client
// here is in memory; an agent host reaches the same server over stdio
// (server.Run with &mcp.StdioTransport{}) or streamable HTTP
// (Bridge.Handler, with bearer tokens).
func Example() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceMCP),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[Greeting]) (string, error) {
		return "Hello, " + call.Input.Name + "!", nil
	})
	stopWorker := exampleWorker(nc, hello)
	defer stopWorker()

	b, err := mcpbridge.New(nc, mcpbridge.Config{})
	check(err)
	defer b.Close()
	ada := envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}
	server, err := b.Server(ctx, ada)
	check(err)

	serverEnd, clientEnd := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, serverEnd, nil)
	check(err)
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v1"}, nil).Connect(ctx, clientEnd, nil)
	check(err)
	defer cs.Close()

	tools, err := cs.ListTools(ctx, nil)
	check(err)
	for _, t := range tools.Tools {
		fmt.Printf("%s read-only=%v\n", t.Name, t.Annotations.ReadOnlyHint)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "greet_hello", Arguments: map[string]any{"name": "Ada"}})
	check(err)
	fmt.Println(res.Content[0].(*mcp.TextContent).Text, res.StructuredContent, res.Meta["capstan/status"])
	// Output:
	// capstan_resume read-only=false
	// capstan_status read-only=true
	// greet_hello read-only=true
	// "Hello, Ada!" map[result:Hello, Ada!] completed
}
