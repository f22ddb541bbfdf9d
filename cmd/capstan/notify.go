package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/notifier"
	"github.com/capstan-dev/capstan/internal/notifystatus"
	"github.com/capstan-dev/capstan/telemetry"
)

// notifyConfigEnv names the notifier's configuration file when --config
// does not.
const notifyConfigEnv = "CAPSTAN_NOTIFY_CONFIG"

func runNotify(args []string) int {
	fs := newFlags("notify", "--config FILE [--id ID] [--metrics HOST:PORT] [--wait D] | --init --config FILE | --check --config FILE | --status [--json]")
	conn := addConnFlags(fs)
	out := addOutputFlags(fs)
	config := fs.String("config", "", "the channels' configuration `file` (JSON, mode 0600; default $"+notifyConfigEnv+")")
	id := fs.String("id", "", "this notifier's name in logs and status (default notify-host-pid)")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on http://`HOST:PORT`/metrics")
	wait := fs.Duration("wait", 0, "how long to wait for the servers and capstan's resources at start, retrying with a log line (0: until stopped)")
	status := fs.Bool("status", false, "print what the running notifiers delivered and failed, and the consumer's queue, then exit (1: none answered, or one gave a notification up)")
	statusWait := fs.Duration("status-wait", time.Second, "how long --status gathers answers")
	initOnly := fs.Bool("init", false, "create the notify consumer of each channel of --config (with an admin's credentials), then exit")
	check := fs.Bool("check", false, "read and check the configuration, print its channels (never their secrets), then exit")
	if _, code, ok := parseOutput(fs, args, 0, out); !ok {
		return code
	}
	if *config == "" {
		*config = os.Getenv(notifyConfigEnv)
	}
	names := broker.NewNames("")
	if *status {
		return notifyStatus(conn, out, names, *statusWait)
	}
	if *config == "" {
		return usageError("notify: --config FILE (or $%s) names the channels", notifyConfigEnv)
	}
	cfg, err := notifier.LoadFile(*config)
	if err != nil {
		return usageError("%v", err)
	}
	if *initOnly {
		return notifyInit(conn, broker.NewNames(cfg.Prefix), cfg)
	}
	if *check {
		return out.print(cfg.Channels, func(w io.Writer, st style) { writeChannels(w, st, cfg) })
	}
	log := newLogger(slog.LevelInfo)
	ctx, stop := signalContext()
	defer stop()
	nc, err := conn.connectWait(ctx, "notify", *wait, log)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return usageError("%v", err)
	}
	defer nc.Close()
	cfg.ID, cfg.Logger = *id, log
	// A notifier's own credentials may not create the consumer; anyone
	// else's (an admin's, a worker's, none on an open server) may.
	cr, _ := conn.credentials()
	cfg.Provision = !cr.Known() || cr.Role != string(auth.RoleNotifier)
	n, err := notifier.New(nc, cfg)
	if err != nil {
		return usageError("%v", err)
	}
	if *metrics != "" {
		tel := telemetry.New(telemetry.Options{})
		if err := n.Register(tel.Registry()); err != nil {
			return usageError("--metrics: %v", err)
		}
		addr, _, err := tel.Serve(ctx, *metrics)
		if err != nil {
			return usageError("--metrics: %v", err)
		}
		log.Info("metrics served", "url", fmt.Sprintf("http://%s/metrics", addr))
	}
	if err := runNotifier(ctx, n, *wait, log); err != nil {
		return usageError("%v", err)
	}
	return exitOK
}

// runNotifier runs n until ctx ends (the notify command, and the notifier a
// worker runs beside itself). While the servers or capstan's resources are
// not there yet, it waits up to wait (0: until ctx ends). It returns why it
// could not run.
func runNotifier(ctx context.Context, n *notifier.Notifier, wait time.Duration, log *slog.Logger) error {
	start := time.Now()
	for {
		err := n.Run(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, notifier.ErrNotProvisioned) && !broker.Unreachable(err) || wait > 0 && time.Since(start) > wait {
			return err
		}
		log.Warn("waiting for capstan's resources; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// loadNotify reads a worker's --notify configuration: its notifier creates
// the consumer with the worker's rights.
func loadNotify(path string) (*notifier.Config, error) {
	if path == "" {
		return nil, nil
	}
	cfg, err := notifier.LoadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--notify: %w", err)
	}
	cfg.Provision = true
	return &cfg, nil
}

// startNotifier runs a notifier of cfg beside a worker on its connection,
// its counts on the worker's metrics, until ctx ends or stop is called;
// stop returns once it has stopped.
func startNotifier(ctx context.Context, nc *nats.Conn, cfg *notifier.Config, tel *telemetry.Telemetry, log *slog.Logger) (stop func(), err error) {
	if cfg == nil {
		return func() {}, nil
	}
	cfg.Logger = log
	n, err := notifier.New(nc, *cfg)
	if err != nil {
		return nil, err
	}
	if tel != nil {
		if err := n.Register(tel.Registry()); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := runNotifier(ctx, n, 0, log); err != nil {
			log.Error("notifier stopped", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}

// notifyInit creates the channels' notify consumers, which a notifier's own
// credentials may not.
func notifyInit(conn *connFlags, names broker.Names, cfg notifier.Config) int {
	nc, err := conn.connect("notify --init")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return usageError("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := notifier.Provision(ctx, js, cfg); err != nil {
		return fail(exitFailed, "notify --init: %v (it needs an admin's credentials)", err)
	}
	configured := map[string]bool{}
	for _, c := range cfg.Channels {
		configured[c.Name] = true
	}
	queues, err := notifystatus.Queues(ctx, js, names)
	if err != nil {
		return fail(exitFailed, "notify --init: %v", err)
	}
	for _, q := range queues {
		if configured[q.Channel] {
			fmt.Printf("channel %s: consumer %s, notifications since %s\n", q.Channel, names.NotifyConsumer(q.Channel), q.Created.UTC().Format(time.RFC3339))
		} else {
			fmt.Printf("channel %s is not in this configuration: its consumer %s stays until removed (nats consumer rm KV_%s %s)\n",
				q.Channel, names.NotifyConsumer(q.Channel), names.ApprovalsBucket(), names.NotifyConsumer(q.Channel))
		}
	}
	return exitOK
}

// notifyReport is what --status prints.
type notifyReport struct {
	Notifiers []notifier.Stats     `json:"notifiers"`
	Queues    []notifystatus.Queue `json:"queues"`
	QueuesErr string               `json:"queuesError,omitempty"`
}

func notifyStatus(conn *connFlags, out *outputFlags, names broker.Names, wait time.Duration) int {
	nc, err := conn.connect("notify --status")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait+10*time.Second)
	defer cancel()
	stats, err := notifystatus.Request(ctx, nc, names, wait)
	if err != nil {
		return fail(exitFailed, "notify --status: %v", err)
	}
	r := notifyReport{Notifiers: stats, Queues: []notifystatus.Queue{}}
	if js, err := jetstream.New(nc); err == nil {
		if q, err := notifystatus.Queues(ctx, js, names); err == nil {
			r.Queues = q
		} else {
			r.QueuesErr = err.Error()
		}
	}
	if code := out.print(r, func(w io.Writer, st style) { writeNotifyStatus(w, st, r) }); code != exitOK {
		return code
	}
	if len(stats) == 0 {
		return exitFailed
	}
	for _, s := range stats {
		for _, c := range s.Channels {
			if c.Failed > 0 {
				return exitFailed
			}
		}
	}
	return exitOK
}

func writeNotifyStatus(w io.Writer, st style, r notifyReport) {
	if len(r.Notifiers) == 0 {
		fmt.Fprintln(w, "No notifier answered.")
	}
	for i, s := range r.Notifiers {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s  %s  up %s  in flight %d\n", st.bold("notifier"), s.ID, short(st.now.Sub(s.Started)), s.InFlight)
		t := newTable(w, st, "CHANNEL", "KIND", "WHERE", "TYPES", "SENT", "FAILED", "RETRIES", "LAST FAILURE")
		for _, c := range s.Channels {
			failed := strconv.FormatUint(c.Failed, 10)
			if c.Failed > 0 {
				failed = st.paint(ansiRed, failed)
			}
			t.row(c.Name, string(c.Kind), c.Where, strings.Join(c.Types, ","), strconv.FormatUint(c.Sent, 10),
				failed, strconv.FormatUint(c.Retries, 10), orDash(ago(st.now, c.LastFailure)))
		}
		t.flush()
		if len(s.Failures) > 0 {
			fmt.Fprintln(w, st.bold("given up (latest last)"))
			for _, f := range s.Failures {
				fmt.Fprintf(w, "  %s  %s  %s  %s  %s\n", stamp(st, f.At), f.Channel, f.Key,
					plural(f.Attempts, "attempt", "attempts"), clip(f.Error, 200))
			}
		}
	}
	fmt.Fprintln(w)
	if r.QueuesErr != "" {
		fmt.Fprintf(w, "%s  %s\n", st.bold("queues"), r.QueuesErr)
		return
	}
	t := newTable(w, st, "QUEUE", "WAITING", "IN FLIGHT", "REDELIVERED", "SINCE")
	for _, q := range r.Queues {
		t.row(q.Channel, strconv.FormatUint(q.Waiting, 10), strconv.Itoa(q.InFlight), strconv.Itoa(q.Redelivered), stamp(st, q.Created))
	}
	t.flush()
	fmt.Fprintln(w, st.dim("in flight: being delivered, or a pending approval waiting for its expiry"))
}

func writeChannels(w io.Writer, st style, cfg notifier.Config) {
	t := newTable(w, st, "CHANNEL", "KIND", "TYPES", "WHERE")
	for _, c := range cfg.Channels {
		t.row(c.Name, string(c.Kind), strings.Join(c.Types, ","), c.Where())
	}
	t.flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
