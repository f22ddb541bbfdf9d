package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
)

// stopBound is how long a process may take to stop after SIGTERM: generous
// for a loaded machine, well short of the minute a worker keeps retrying a
// write the store does not answer, and never more than a quarter of what is
// left of the test's own deadline.
func stopBound(t *testing.T) time.Duration {
	b := 20 * time.Second
	if d, ok := t.Deadline(); ok {
		b = min(b, time.Until(d)/4)
	}
	return b
}

// A bench whose server was killed in the middle of the run stops on SIGTERM
// without waiting for the server: it closes its connections before anything
// that would talk to the server on the way out, and abandons its in-process
// workers as a crash would.
func TestBench_StopsOnSIGTERMAfterItsServerWasKilled(t *testing.T) {
	t.Parallel()
	for _, workers := range []string{"1", "0"} {
		t.Run("workers="+workers, func(t *testing.T) {
			port := freePort(t)
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			server := startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
			if workers == "0" {
				startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker")
			}
			bench := spawn(t, []string{"CAPSTAN_NATS_URL=" + url}, "bench", "--workers", workers,
				"--rate", "200/s", "--n", "1000000", "--no-baseline", "--timeout", "1h")

			// Wait until the bench's requests reach the server (the stream is a
			// work queue: count what it received, not what it holds).
			js, err := jetstream.New(connect(t, url))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), guard)
			defer cancel()
			for {
				if s, err := js.Stream(ctx, "CAPSTAN_EXEC"); err == nil && s.CachedInfo().State.LastSeq >= 100 {
					break
				}
				select {
				case <-bench.exited:
					t.Fatalf("bench exited before its requests reached the server: %v\n%s", bench.err, bench.out.String())
				case <-ctx.Done():
					t.Fatal("no requests of the bench reached the server")
				case <-time.After(50 * time.Millisecond):
				}
			}

			server.kill(t)
			if err := bench.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-bench.exited:
			case <-time.After(stopBound(t)):
				t.Fatalf("bench still running %v after SIGTERM with its server gone", stopBound(t))
			}
			if code := bench.cmd.ProcessState.ExitCode(); code == exitOK || code < 0 {
				t.Fatalf("interrupted bench exited %d (want a failure exit, not a signal death)", code)
			}
		})
	}
}

// The CLI's waiting commands stop on SIGTERM after their server was killed:
// a call awaiting its envelope, an await, and audit --follow (which no longer
// waits to delete its consumer on a server out of reach).
func TestCLI_WaitingCommandsStopOnSIGTERMAfterTheServerWasKilled(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	server := startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	env := []string{"CAPSTAN_NATS_URL=" + url}
	// No worker serves: the call (told to wait for one) and the await of its
	// queued request wait for an envelope.
	id := envelope.NewExecutionID()
	waiting := map[string]*daemon{
		"call":   spawn(t, env, "call", "demo.echo", "--id", id, "--if-unserved", "wait", "--wait", "1h"),
		"await":  spawn(t, env, "await", id, "--wait", "1h"),
		"follow": spawn(t, env, "audit", "--follow"),
	}
	// The call is waiting once its request is stored, audit --follow once its
	// consumer exists (the await, started alongside, waits like the call).
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	for {
		exec, err1 := js.Stream(ctx, "CAPSTAN_EXEC")
		audit, err2 := js.Stream(ctx, "CAPSTAN_AUDIT")
		if err1 == nil && err2 == nil && exec.CachedInfo().State.LastSeq >= 1 && audit.CachedInfo().State.Consumers >= 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the call's request or the follow's consumer never reached the server")
		case <-time.After(50 * time.Millisecond):
		}
	}
	server.kill(t)
	for _, d := range waiting {
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	bound := time.After(stopBound(t))
	for name, d := range waiting {
		select {
		case <-d.exited:
		case <-bound:
			t.Fatalf("%s still running %v after SIGTERM with its server gone", name, stopBound(t))
		}
		// A command that does not catch SIGTERM ends by it, which is as prompt.
		if ws, ok := d.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() != syscall.SIGTERM {
			t.Fatalf("%s ended by %v", name, ws.Signal())
		}
	}
}
