//go:build unix

package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// Environment of a child process.
const (
	envRole        = "CAPSTAN_CHAOS_ROLE" // server | worker
	envStore       = "CAPSTAN_CHAOS_STORE"
	envPort        = "CAPSTAN_CHAOS_PORT"
	envURL         = "CAPSTAN_CHAOS_URL"
	envWorkerID    = "CAPSTAN_CHAOS_WORKER_ID"
	envLease       = "CAPSTAN_CHAOS_LEASE"
	envConcurrency = "CAPSTAN_CHAOS_CONCURRENCY"
	// The worker's pool, the part of the demo catalog it serves
	// (comma-separated ids) and its sweeping interval, when not the defaults.
	envPool         = "CAPSTAN_CHAOS_POOL"
	envCapabilities = "CAPSTAN_CHAOS_CAPABILITIES"
	envSweepEvery   = "CAPSTAN_CHAOS_SWEEP_EVERY"
	// envEmail, set to "lying", makes a worker of the test binary serve an
	// email.send whose reconciler lies (lying_test.go).
	envEmail = "CAPSTAN_CHAOS_EMAIL"
	// envReads, set to "unclaimed", makes a worker of the test binary also
	// serve chaos.read, a read without claims (unclaimed_test.go).
	envReads = "CAPSTAN_CHAOS_READS"
	// envBin names the capstan binary to run; "self" runs the test binary in
	// the roles above. Unset, TestMain builds one.
	envBin = "CAPSTAN_CHAOS_BIN"
	// envSeed replays a run: the seed of its kills, which every run logs.
	envSeed = "CAPSTAN_CHAOS_SEED"
)

// builtBin is the capstan binary TestMain built, if it built one.
var builtBin string

// TestMain runs the test binary as a server or a worker when it was started as
// one of the tests' child processes. Otherwise it builds the capstan binary
// the tests start (with the race detector when the tests have it), unless
// CAPSTAN_CHAOS_BIN names one, and runs the tests.
func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "server":
		os.Exit(serve())
	case "worker":
		os.Exit(work())
	}
	if bin := os.Getenv(envBin); bin != "" && bin != "self" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "capstan-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	builtBin = filepath.Join(dir, "capstan")
	args := []string{"build", "-o", builtBin}
	if raceBuild {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "github.com/capstan-dev/capstan/cmd/capstan")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build capstan:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// untilSignalled returns a context that ends on SIGTERM or SIGINT; SIGKILL,
// which the tests send, ends the process without it.
func untilSignalled() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// serve is `capstan server`: an embedded JetStream server on a store.
func serve() int {
	port, err := strconv.Atoi(os.Getenv(envPort))
	if err != nil {
		fmt.Fprintln(os.Stderr, "server: bad port:", err)
		return 2
	}
	s, err := natsserver.Start(natsserver.Options{StoreDir: os.Getenv(envStore), Port: port, Logger: childLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 1
	}
	ctx, stop := untilSignalled()
	defer stop()
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// work is `capstan worker`: a worker serving the demo catalog.
func work() int {
	log := childLogger()
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		log.Error("bad lease", "err", err)
		return 2
	}
	concurrency, _ := strconv.Atoi(os.Getenv(envConcurrency))
	id := os.Getenv(envWorkerID)
	nc, err := nats.Connect(os.Getenv(envURL), nats.Name(id), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Error("connect", "err", err)
		return 1
	}
	defer nc.Close()
	ctx, stop := untilSignalled()
	defer stop()
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	js, err := demo.Provision(setup, nc, 1)
	cancel()
	if err != nil {
		log.Error("provision demo", "err", err)
		return 1
	}
	caps := demo.Catalog(js)
	if os.Getenv(envEmail) == "lying" {
		for i, c := range caps {
			if c.ID() == "email.send" {
				caps[i] = lyingEmailSend(js)
			}
		}
	}
	if os.Getenv(envReads) == "unclaimed" {
		caps = append(caps, unclaimedRead(js))
	}
	if ids := os.Getenv(envCapabilities); ids != "" {
		var some []executor.Capability
		for _, c := range caps {
			if slices.Contains(strings.Split(ids, ","), c.ID()) {
				some = append(some, c)
			}
		}
		caps = some
	}
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		log.Error("registry", "err", err)
		return 1
	}
	var sweepEvery time.Duration
	if s := os.Getenv(envSweepEvery); s != "" {
		if sweepEvery, err = time.ParseDuration(s); err != nil {
			log.Error("bad sweep interval", "err", err)
			return 2
		}
	}
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{ID: id, Pool: os.Getenv(envPool), Lease: lease,
		Concurrency: concurrency, Grace: time.Second, Logger: log, SweepInterval: sweepEvery})
	if err != nil {
		log.Error("worker", "err", err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		log.Error("worker run", "err", err)
		return 1
	}
	return 0
}
