package capstantest_test

import (
	"context"
	"fmt"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

type Greeting struct {
	Name string `json:"name"`
}

// A test's worker in one line: a registry served on a fresh embedded server
// until the test ends, and a client calling it.
func Example() {
	t := newExampleT() // a test has its *testing.T
	defer t.end()

	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[Greeting]) (string, error) {
		return "Hello, " + call.Input.Name + "!", nil
	})
	reg, err := executor.NewRegistry(hello)
	if err != nil {
		t.Fatal(err)
	}

	w := capstantest.Worker(t, reg)
	c := w.Client(t, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}})
	env, err := c.Call(context.Background(), "greet.hello", Greeting{Name: "Ada"})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := env.Output.Decode(&out); err != nil {
		t.Fatal(err)
	}
	fmt.Println(env.Status, out)
	// Output: completed Hello, Ada!
}
