package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// A worker started before its server (a compose file or a rollout starting
// everything at once) waits for it with a log line instead of exiting, and
// serves once the server is up.
func TestWorkerStartedBeforeItsServer_WaitsThenServes(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	w := spawn(t, []string{"CAPSTAN_NATS_URL=" + url}, "worker", "--capabilities", "demo.echo", "--grace", "5s")
	w.waitOutput(t, "waiting for NATS")
	select {
	case <-w.exited:
		t.Fatalf("the worker exited while it waited: %v\n%s", w.err, w.out.String())
	default:
	}
	startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	w.waitOutput(t, "worker started")
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"late"}`)
	if code != exitOK || !strings.Contains(stdout, `"completed"`) || !strings.Contains(stdout, "late") {
		t.Fatalf("call: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code := w.stop(t); code != exitOK {
		t.Fatalf("worker exit %d", code)
	}
}

// A call of a capability that a catalog lists but no running worker serves
// (its pool is down) ends NOT_STARTED at --start-within, with exit code 1.
func TestCall_StartWithin_PoolDown_NotStarted(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	env := []string{"CAPSTAN_NATS_URL=" + url}
	// The default pool runs (and sweeps); the comms pool served email.send
	// once and is down now.
	startDaemon(t, "worker started", env, "worker", "--capabilities", "demo.echo", "--sweep-every", "100ms")
	comms := startDaemon(t, "worker started", env, "worker", "--pool", "comms", "--capabilities", "email.send")
	comms.kill(t)
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "email.send", "--input", `{"to":"a@example.com","subject":"hi"}`,
		"--start-within", "500ms")
	if code != exitFailed || !strings.Contains(stdout, `"NOT_STARTED"`) {
		t.Fatalf("call: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// A second dev or server on a store another one serves is refused before its
// server reads the store: two servers on one JetStream store lose each
// other's messages. Once the first stops, the store is free again.
func TestDev_StoreInUse_SecondRefusedFirstUnharmed(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	first := startDaemon(t, "capstan call demo.echo", nil, "dev", "--store", store,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--console", "off", "--grace", "5s")
	for _, second := range [][]string{{"dev", "--console", "off"}, {"server"}} {
		args := append(second, "--store", store, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		stdout, stderr, code := capstan(t, url, args...)
		if code == exitOK || !strings.Contains(stderr, "in use by another process") || !strings.Contains(stderr, "--store") {
			t.Fatalf("capstan %s: exit %d\n%s\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"still":"here"}`)
	if code != exitOK || !strings.Contains(stdout, `"completed"`) {
		t.Fatalf("call on the first: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code := first.stop(t); code != exitOK {
		t.Fatalf("first dev exit %d", code)
	}
	startDaemon(t, "capstan call demo.echo", nil, "dev", "--store", store,
		"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--console", "off", "--grace", "5s")
}

// A capability whose only pool is down: `call --if-unserved refuse` submits
// nothing and exits 7 naming the pool to start; `submit` queues it and warns
// once, in the CLI's own voice.
func TestSubmit_PoolDown_WarnsWhatToStart(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	env := []string{"CAPSTAN_NATS_URL=" + url}
	startDaemon(t, "worker started", env, "worker", "--capabilities", "demo.echo")
	comms := startDaemon(t, "worker started", env, "worker", "--pool", "comms", "--capabilities", "email.send")
	comms.kill(t)
	input := `{"to":"a@example.com","subject":"hi"}`
	deadline := time.Now().Add(guard)
	for {
		// The pool is down once its liveness lapses.
		_, stderr, code := capstan(t, url, "call", "email.send", "--input", input, "--if-unserved", "refuse", "--wait", "2s")
		if code == exitUnserved {
			if !strings.Contains(stderr, `capstan worker --pool comms`) {
				t.Fatalf("exit 7 without what to start:\n%s", stderr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call: exit %d, never %d\n%s", code, exitUnserved, stderr)
		}
	}
	stdout, stderr, code := capstan(t, url, "submit", "email.send", "--input", input)
	if code != exitOK || strings.TrimSpace(stdout) == "" {
		t.Fatalf("submit: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.HasPrefix(stderr, "capstan: warning: no live worker serves email.send") || strings.Count(stderr, "capstan:") != 1 {
		t.Fatalf("submit's warning:\n%s", stderr)
	}
}

// Ctrl-C (SIGINT) or SIGTERM during `capstan call --wait` stops the waiting,
// not the execution, and says so with the id to await or cancel; the exit code
// is 128 + the signal's number, as a shell reports a process the signal ended
// (130, 143). The call then ends as it would have.
func TestCall_Interrupted_SaysTheExecutionGoesOn(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	for _, tc := range []struct {
		sig  os.Signal
		exit int
	}{{os.Interrupt, 130}, {syscall.SIGTERM, 143}} {
		id := envelope.NewExecutionID() // a fresh UUIDv7: one from another time is taken for a record expired
		call := spawn(t, []string{"CAPSTAN_NATS_URL=" + url}, "call", "demo.report", "--id", id,
			"--input", `{"pages":30,"pageMs":100}`, "--follow", "--wait", "5m")
		call.waitOutput(t, "progress ")
		if err := call.cmd.Process.Signal(tc.sig); err != nil {
			t.Fatal(err)
		}
		select {
		case <-call.exited:
		case <-time.After(guard):
			t.Fatalf("call did not exit after %v", tc.sig)
		}
		out := call.out.String()
		if code := call.cmd.ProcessState.ExitCode(); code != tc.exit ||
			!strings.Contains(out, "capstan await "+id) || !strings.Contains(out, "goes on") {
			t.Fatalf("call ended by %v: exit %d, want %d\n%s", tc.sig, code, tc.exit, out)
		}
		stdout, stderr, code := capstan(t, url, "await", "-o", "json", id, "--wait", "1m")
		if code != exitOK || !strings.Contains(stdout, `"completed"`) {
			t.Fatalf("await after %v: exit %d\n%s\n%s", tc.sig, code, stdout, stderr)
		}
	}
}

// A call a pause holds gets no envelope within --wait; it is told the pause
// is why (what, by whom, the reason) and what lifts it, not "no envelope"
// alone.
func TestCall_HeldByAPause_SaysSoAndHowToLiftIt(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	if _, stderr, code := capstan(t, url, "pause", "demo.echo", "--reason", "maintenance window"); code != exitOK {
		t.Fatalf("pause: exit %d\n%s", code, stderr)
	}
	stdout, stderr, code := capstan(t, url, "call", "demo.echo", "--input", `{}`, "--wait", "2s")
	if code != exitNoEnvelope || !strings.Contains(stderr, "demo.echo is paused") ||
		!strings.Contains(stderr, "maintenance window") || !strings.Contains(stderr, "capstan unpause demo.echo") {
		t.Fatalf("held call: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// A dev whose --listen port another process holds says so and how to listen
// elsewhere, not the bind error alone.
func TestDev_PortInUse_SaysWhatToDo(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	stdout, stderr, code := capstan(t, "nats://"+addr, "dev", "--store", t.TempDir(), "--listen", addr, "--console", "off")
	if code == exitOK || !strings.Contains(stderr, addr+" is in use by another process") || !strings.Contains(stderr, "--listen 127.0.0.1:0") {
		t.Fatalf("dev on a port in use: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// A call sent while its capability was served, whose worker is lost while it
// waits (no catalog entry renewed, nothing swept), is told at --wait that no
// live worker serves it any more, and what to start, not "no envelope" alone.
func TestCall_ItsWorkerLostWhileItWaits_SaysNoneServes(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	startDaemon(t, "capstan server listening on", nil, "server", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	gone := executor.Define("t.gone", executor.Meta{Description: "Served by a worker that is lost.", Expose: executor.On(executor.SurfaceDirect),
		SideEffect: executor.SideEffectRead}, func(context.Context, executor.Call[struct{}]) (bool, error) { return true, nil })
	reg, err := executor.NewRegistry(gone)
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, url)
	capstantest.Worker(t, reg, capstantest.WithConn(nc),
		capstantest.WithConfig(executor.WorkerConfig{Pool: "gone", CatalogTTL: 6 * time.Second, SweepInterval: -1}))
	nc.Close() // lost: its catalog entry is left to lapse
	_, stderr, code := capstan(t, url, "call", "t.gone", "--input", "{}", "--wait", "12s")
	if code != exitUnserved || !strings.Contains(stderr, "no live worker serves t.gone") || !strings.Contains(stderr, "capstan await ") {
		t.Fatalf("a call whose worker was lost: exit %d\n%s", code, stderr)
	}
}
