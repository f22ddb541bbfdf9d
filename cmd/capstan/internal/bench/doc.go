// Package bench measures what one capstan execution costs: throughput,
// latency percentiles, CPU, allocations and broker messages per execution,
// set against a raw JetStream baseline (publish, pull, ack) run with the same
// payload and concurrency on the same server.
//
// It is the machinery behind `capstan bench`; the command parses flags,
// starts an embedded server when asked, and prints the Result. A run needs a
// server with capstan's resources provisioned; it provisions the demo
// capabilities itself and, unless Config.Workers is 0, runs that many workers
// serving them in this process.
//
//	res, err := bench.Run(ctx, bench.Target{Connect: connect}, bench.Config{
//		N: 10000, Concurrency: 256, Capability: "demo.echo", PayloadBytes: 64,
//		Workers: 1, WorkerConcurrency: 256,
//	})
//	if err != nil {
//		return err
//	}
//	fmt.Printf("%.0f executions/s, p99 %.2f ms, %.2f× raw JetStream\n",
//		res.ExecutionsPerSec, res.P99Ms, res.Ratio)
//
// Four loads are offered: a closed loop (Concurrency calls in flight), a
// closed loop of CallMany batches (Batch), an open loop at a fixed Rate whose
// latencies count from when each call was due, and a backlog (all N queued
// before the workers start, then the drain is timed).
//
// The process readings (CPU time, peak RSS) come from internal/procstat, the
// one place capstan reads the operating system's resource usage.
package bench
