package bench_test

import (
	"context"
	"fmt"
	"os"

	"github.com/capstan-dev/capstan/cmd/capstan/internal/bench"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// A small closed-loop run against an embedded server, with one in-process
// worker and the raw JetStream baseline. Speeds vary from machine to machine;
// what every run must show is that each execution completed.
func Example() {
	dir, err := os.MkdirTemp("", "bench-example-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	check(err)
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	url := natsserver.ClientURL(srv)
	ctx := context.Background()

	nc, err := broker.Connect(broker.ConnectOptions{URL: url})
	check(err)
	_, err = broker.Provision(ctx, nc, broker.Config{}) // capstan's streams and buckets
	check(err)
	nc.Close()

	res, err := bench.Run(ctx, bench.Target{
		Server: srv, // counts the server's messages per execution
		Connect: func(name string) (*nats.Conn, error) {
			return broker.Connect(broker.ConnectOptions{URL: url, Name: "bench " + name})
		},
	}, bench.Config{
		N: 200, Concurrency: 8, Capability: "demo.echo", PayloadBytes: 64,
		Workers: 1, WorkerConcurrency: 8,
	})
	check(err)
	fmt.Printf("%s loop: %d completed, %d not completed, %d errors\n", res.Mode, res.Completed, res.NotCompleted, res.Errors)
	fmt.Println("measured:", res.ExecutionsPerSec > 0, res.P99Ms >= res.P50Ms, res.ServerMsgsPerExecution > 0, res.BaselinePerSec > 0)
	// Output:
	// closed loop: 200 completed, 0 not completed, 0 errors
	// measured: true true true true
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
