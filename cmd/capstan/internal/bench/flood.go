package bench

import (
	"context"
	"sync"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
)

// FloodPrincipal is the producer principal a flood comes from (Target.Connect
// is asked for its connection by this name).
const FloodPrincipal = "flood"

// flood submits n demo.sleep calls of ms milliseconds as FloodPrincipal,
// without awaiting them: they hold worker slots while the measured
// principal's calls run.
func flood(ctx context.Context, t Target, n, ms int) error {
	c, err := floodClient(t)
	if err != nil {
		return err
	}
	for range n {
		if _, err := c.Submit(ctx, "demo.sleep", demo.SleepInput{Ms: ms}); err != nil {
			return err
		}
	}
	return nil
}

// floodClient is FloodPrincipal's client. Its connection stays open until
// the process ends: the calls outlive their submission, and their envelopes
// find their way.
func floodClient(t Target) (*executor.Client, error) {
	nc, err := t.Connect(FloodPrincipal)
	if err != nil {
		return nil, err
	}
	c, err := executor.NewClient(nc, executor.ClientConfig{Actor: envelope.Actor{Kind: envelope.ActorService, ID: "capstan-flood"}})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// queueBacklog queues n demo.echo calls as FloodPrincipal, as fast as it
// can, without awaiting them: a backlog in that principal's queue when the
// measured phase starts.
func queueBacklog(ctx context.Context, t Target, n int) error {
	c, err := floodClient(t)
	if err != nil {
		return err
	}
	const submitters = 16
	var wg sync.WaitGroup
	errs := make([]error, submitters)
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n && errs[g] == nil; i += submitters {
				_, errs[g] = c.Submit(ctx, "demo.echo", map[string]any{"i": i})
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
