package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/capstan-dev/capstan/telemetry"
)

// A worker and a client sharing one Telemetry; after a call, the scrape of
// /metrics counts its envelope.
func Example() {
	url, stopServer := exampleServer() // yours: `capstan dev`, `capstan server` or any JetStream
	defer stopServer()
	ctx, stop := context.WithCancel(context.Background())

	tel := telemetry.New(telemetry.Options{})
	hello := executor.Define("greet.hello", executor.Meta{
		Description: "Greets someone by name.",
		Expose:      executor.On(executor.SurfaceDirect),
		SideEffect:  executor.SideEffectNone,
	}, func(ctx context.Context, call executor.Call[string]) (string, error) {
		return "Hello, " + call.Input + "!", nil
	})
	reg, err := executor.NewRegistry(hello)
	check(err)
	nc, err := executor.Connect(executor.ConnectOptions{URL: url})
	check(err)
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "greeters", Observer: tel.Worker()})
	check(err)
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()

	c, err := executor.NewClient(nc, executor.ClientConfig{Observer: tel.Client()})
	check(err)
	env, err := c.Call(ctx, "greet.hello", "Ada", executor.As(envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}))
	check(err)
	fmt.Println(env.Status)

	check(c.Close())
	stop()
	check(<-done) // the worker has ended its deliveries: the counts are final

	srv := httptest.NewServer(tel.Handler()) // usually: http.Handle("/metrics", tel.Handler())
	defer srv.Close()
	res, err := http.Get(srv.URL + "/metrics")
	check(err)
	body, err := io.ReadAll(res.Body)
	check(err)
	_ = res.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "capstan_executions_finalized_total{") || strings.HasPrefix(line, "capstan_attempts_total{") {
			fmt.Println(line)
		}
	}
	nc.Close()
	// Output:
	// completed
	// capstan_attempts_total{capability="greet.hello",pool="greeters"} 1
	// capstan_executions_finalized_total{capability="greet.hello",code="",pool="greeters",status="completed"} 1
}

// exampleServer starts an embedded JetStream server on a free loopback port,
// storing in a new temporary directory that stop removes.
func exampleServer() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "capstan-example-")
	check(err)
	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		panic(err)
	}
	return natsserver.ClientURL(s), func() {
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
