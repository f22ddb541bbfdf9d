package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// bin is the capstan binary the tests run, built once.
var bin string

func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	dir, err := os.MkdirTemp("", "capstan-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "capstan")
	args := []string{"build", "-o", bin}
	if raceBuild {
		// The processes the tests start race-check themselves: a race
		// report in their output fails the test (see checkRaces).
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build capstan:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// guard bounds how long a test waits for a process before it fails.
const guard = 2 * time.Minute

// output collects a process's output as it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// daemon is a long-running capstan process (dev, server, worker).
type daemon struct {
	cmd    *exec.Cmd
	out    output // stdout and stderr
	exited chan struct{}
	err    error
}

// startDaemon runs capstan args until the test ends, and waits until its
// output contains ready.
func startDaemon(t *testing.T, ready string, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = &d.out, &d.out
	d.cmd.Env = append(os.Environ(), env...)
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.cleanup(t) })
	deadline := time.After(guard)
	for !strings.Contains(d.out.String(), ready) {
		select {
		case <-d.exited:
			t.Fatalf("capstan %s exited (%v) before %q:\n%s", strings.Join(args, " "), d.err, ready, d.out.String())
		case <-deadline:
			t.Fatalf("capstan %s: no %q:\n%s", strings.Join(args, " "), ready, d.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return d
}

// cleanup kills the process if it still runs, fails the test on a race the
// process reported, and shows its output if the test failed.
func (d *daemon) cleanup(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Kill()
	<-d.exited
	args := strings.Join(d.cmd.Args[1:], " ")
	checkRaces(t, "capstan "+args, d.out.String())
	if t.Failed() {
		t.Logf("capstan %s:\n%s", args, d.out.String())
	}
}

// raceReport is how the race detector starts a report.
const raceReport = "WARNING: DATA RACE"

// checkRaces fails the test when a process the test ran reported a data race,
// even if everything else passed.
func checkRaces(t *testing.T, what, output string) {
	t.Helper()
	if n := strings.Count(output, raceReport); n > 0 {
		t.Errorf("%s reported %d data races:\n%s", what, n, output)
	}
}

// stop sends SIGTERM and returns the exit code.
func (d *daemon) stop(t *testing.T) int {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(guard):
		t.Fatal("no exit after SIGTERM")
	}
	return d.cmd.ProcessState.ExitCode()
}

// capstan runs one short command and returns its stdout, stderr and exit code.
func capstan(t *testing.T, url string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "CAPSTAN_NATS_URL="+url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	checkRaces(t, "capstan "+strings.Join(args, " "), stderr.String())
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("capstan %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func freePort(t *testing.T) int { return testenv.FreePort(t) }

// startDev runs `capstan dev` on a free port, with flags after the test's
// own, and returns it and its URL.
func startDev(t *testing.T, flags ...string) (*daemon, string) {
	t.Helper()
	port := freePort(t)
	d := startDaemon(t, "capstan call demo.echo", nil, append([]string{
		"dev", "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--console", "127.0.0.1:0", "--grace", "5s"},
		flags...)...)
	return d, fmt.Sprintf("nats://127.0.0.1:%d", port)
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := broker.Connect(broker.ConnectOptions{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// decode parses a command's JSON output.
func decode[T any](t *testing.T, stdout string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout)
	}
	return v
}
