package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A worker whose server was killed stops on SIGTERM without waiting for the
// server: idle, and in the middle of a load it was serving.
func TestWorker_StopsOnSIGTERMAfterItsServerWasKilled(t *testing.T) {
	t.Parallel()
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			port := freePort(t)
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			server := startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
			worker := startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker")
			if busy {
				bench := spawn(t, []string{"CAPSTAN_NATS_URL=" + url}, "bench", "--workers", "0",
					"--rate", "200/s", "--n", "1000000", "--no-baseline", "--timeout", "1h")
				// Wait until the worker has finished some of the bench's requests.
				js, err := jetstream.New(connect(t, url))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), guard)
				defer cancel()
				for {
					if s, err := js.Stream(ctx, "KV_CAPSTAN_ENVELOPES"); err == nil && s.CachedInfo().State.Msgs >= 100 {
						break
					}
					select {
					case <-bench.exited:
						t.Fatalf("bench exited before the worker served it: %v\n%s", bench.err, bench.out.String())
					case <-ctx.Done():
						t.Fatal("the worker never finished 100 of the bench's requests")
					case <-time.After(50 * time.Millisecond):
					}
				}
			}

			server.kill(t)
			signalled := time.Now()
			if err := worker.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-worker.exited:
			case <-time.After(stopBound(t)):
				t.Fatalf("worker still running %v after SIGTERM with its server gone", stopBound(t))
			}
			if ws, ok := worker.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Fatalf("worker ended by %v, not by its own shutdown", ws.Signal())
			}
			t.Logf("worker stopped %v after SIGTERM, exit code %d", time.Since(signalled).Round(time.Millisecond), worker.cmd.ProcessState.ExitCode())
		})
	}
}
