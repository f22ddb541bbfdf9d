package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/capstan-dev/capstan/demo"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runAdmin dispatches the deployment operations.
func runAdmin(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprint(os.Stderr, "usage: capstan admin replicas [N] [flags]\n\n"+
			"  replicas     show every stream's and bucket's replica count\n"+
			"  replicas N   change them all to N, and wait until the new replicas are current\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "replicas":
		return runAdminReplicas(args[1:])
	}
	return usageError("unknown admin command %q; run 'capstan admin --help'", args[0])
}

// runAdminReplicas shows or changes the replica count of capstan's streams
// and buckets and of the demo's. Provisioning never changes replicas of an
// existing deployment: this command is the one way to.
func runAdminReplicas(args []string) int {
	fs := newFlags("admin replicas", "[N] [--wait D]")
	conn := addConnFlags(fs)
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for the change to settle")
	// The count is optional, before or after the flags.
	pos, code, ok := parseFlags(fs, args, -1)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		fmt.Fprintf(os.Stderr, "capstan admin replicas: want at most one count, got %d arguments\n", len(pos))
		printUsage(fs, os.Stderr)
		return exitUsage
	}
	n := 0
	if len(pos) == 1 {
		var err error
		if n, err = strconv.Atoi(pos[0]); err != nil || n < 1 || n > broker.MaxReplicas {
			return usageError("admin replicas %q: want a count from 1 to %d", pos[0], broker.MaxReplicas)
		}
	}
	nc, err := conn.connect("admin")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()

	if n == 0 {
		return showReplicas(ctx, nc)
	}
	stopWaiting := waiting(fmt.Sprintf("%d current replicas", n), *wait)
	changes, err := broker.SetReplicas(ctx, nc, broker.Config{}, n, demo.Streams...)
	stopWaiting()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tREPLICAS")
	for _, c := range changes {
		fmt.Fprintf(tw, "%s\t%d -> %d\n", c.Stream, c.From, c.To)
	}
	_ = tw.Flush()
	if err != nil {
		return fail(exitFailed, "admin replicas %d: %v", n, err)
	}
	return exitOK
}

// showReplicas prints every stream's replica count, leader and current followers.
func showReplicas(ctx context.Context, nc *nats.Conn) int {
	url := nc.ConnectedUrl()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tREPLICAS\tLEADER\tCURRENT")
	names := append(broker.NewNames("").Streams(), demo.Streams...)
	missing := 0
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			missing++
			fmt.Fprintf(tw, "%s\t-\t-\t-\n", name)
			continue
		}
		if err != nil {
			return fail(exitFailed, "stream %s on %s: %v", name, url, err)
		}
		info := s.CachedInfo()
		leader, current := "-", 1
		if ci := info.Cluster; ci != nil {
			leader = ci.Leader
			for _, r := range ci.Replicas {
				if r.Current && !r.Offline {
					current++
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%d\n", name, info.Config.Replicas, leader, current, info.Config.Replicas)
	}
	_ = tw.Flush()
	if missing == len(names) {
		return fail(exitFailed, "nothing is provisioned on %s", url)
	}
	return exitOK
}
