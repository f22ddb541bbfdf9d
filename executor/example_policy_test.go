package executor_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

type Lookup struct {
	Email string `json:"email"`
}

// A runtime-level policy (WorkerConfig.Policies) applies to every capability
// of the worker, before the capability's own policies. Every policy is
// evaluated and recorded on the audit trail; the strongest stance wins (deny >
// hide > require-approval > allow), and a policy that errors, panics or times
// out denies.
//
// A refusal is an envelope like any outcome. What a model may see of it is
// env.ForModel(): the code, the public message and whether to retry, never
// the policy's reason, which the trail keeps.
func ExamplePolicy() {
	nc, cleanup := exampleConn()
	defer cleanup()
	ctx := context.Background()

	blocked := executor.Policy{
		Name: "blocked-actors",
		Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
			if r.Actor.Kind == envelope.ActorUser && r.Actor.ID == "mallory" {
				return executor.Decision{Stance: executor.StanceDeny, Reason: "account under review"}, nil
			}
			return executor.Decision{Stance: executor.StanceAllow}, nil
		},
	}
	lookup := executor.Define("customers.lookup", executor.Meta{
		Description: "Finds a customer by email address.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectRead,
	}, func(ctx context.Context, call executor.Call[Lookup]) (string, error) {
		return "customer c-17", nil
	})
	stop := exampleWorker(nc, executor.WorkerConfig{Policies: []executor.Policy{blocked}}, lookup)
	defer stop()
	c := exampleClient(nc)
	defer c.Close()

	in := Lookup{Email: "ada@example.com"}
	env, err := c.Call(ctx, "customers.lookup", in, executor.As(exampleAlice))
	check(err)
	fmt.Println("alice:", env.Status)

	mallory := envelope.Actor{Kind: envelope.ActorUser, ID: "mallory"}
	env, err = c.Call(ctx, "customers.lookup", in, executor.As(mallory))
	check(err)
	fmt.Println("mallory:", env.Status, env.Error.Code, "at stage", env.Error.Stage)
	forModel, err := json.Marshal(env.ForModel())
	check(err)
	fmt.Println(string(forModel))
	// Output:
	// alice: completed
	// mallory: failed POLICY_DENIED at stage policy
	// {"code":"POLICY_DENIED","message":"A policy refused the call.","retryable":false}
}
