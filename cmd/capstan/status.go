package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/execrpc"
)

// byID is a command whose one argument is an execution id (or a unique
// prefix of one).
type byID struct {
	name string
	// flags adds the command's own flags.
	flags func(*flag.FlagSet)
	// need refuses at once, naming the role, what the command needs beyond
	// reading results by key (a cancel: cancelling).
	need func(conn *connFlags) error
	// act does the command with a bounded context and the output flags.
	act func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int
	// viaWorkers, when set, serves a principal that may not read results by
	// key (an approver) instead: it asks the workers, who show it what its
	// role lets it see.
	viaWorkers func(conn *connFlags, o *outputFlags, id string) int
}

// run parses the command's flags, checks the id, opens a client, resolves
// the id and acts.
func (b byID) run(args []string) int {
	fs, conn, o := newConnFlags(b.name, "ID [-o json]")
	if b.flags != nil {
		b.flags(fs)
	}
	id, code, ok := parseExecutionID(fs, args, o)
	if !ok {
		return code
	}
	if p := conn.principal(); b.viaWorkers != nil && !p.may(directGet(names.EnvelopesBucket())(p.name)) {
		return b.viaWorkers(conn, o, id)
	}
	if b.need != nil {
		if err := b.need(conn); err != nil {
			return usageError("%v", err)
		}
	}
	if err := conn.need("read execution results", directGet(names.EnvelopesBucket()), ""); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client(b.name, executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	if id, err = resolveExecution(ctx, c.Conn(), conn, id); err != nil {
		return usageError("%v", err)
	}
	return b.act(ctx, c, id, o)
}

func runStatus(args []string) int {
	var owner string
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&owner, "owner", "", "the `principal` whose execution it is (admins only; default: the caller's own)")
	}
	return byID{name: "status", flags: flags, viaWorkers: statusThroughWorkers, act: func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int {
		if owner == "" {
			owner = c.Principal()
		}
		s, err := c.StatusOf(ctx, owner, id)
		if errors.Is(err, executor.ErrExpired) {
			return expiredError(err, id)
		}
		if errors.Is(err, executor.ErrNoSuchExecution) {
			// Nothing in the buckets: queued, or no such execution.
			v, perr := c.Execution(ctx, executor.ExecutionRequest{ExecutionID: id, Owner: owner, Probe: true})
			switch {
			case perr == nil && v.State == executor.ExecQueued:
				return o.print(v, func(w io.Writer, st style) {
					fmt.Fprintf(w, "%s is %s: no worker has taken it yet\n", id, st.status("queued"))
				})
			case errors.Is(perr, executor.ErrNoWorkers):
				return fail(exitUsage, "%s: neither a record nor an envelope is stored, and no worker answers to tell whether its request is queued: start one ('capstan worker', or 'capstan dev')", id)
			case perr == nil && v.State == executor.ExecUncertain:
				return fail(exitUsage, "%s: neither a record nor an envelope is stored, and the workers cannot tell whether its request is queued (a long backlog)", id)
			}
			return fail(exitUnknown, "%v: %s", executor.ErrNoSuchExecution, id)
		}
		if err != nil {
			return usageError("%v", err)
		}
		return o.print(s, func(w io.Writer, st style) { writeStatus(w, st, s) })
	}}.run(args)
}

// statusThroughWorkers prints what the workers show the principal of one
// execution: an approver's view of the executions behind its approvals.
func statusThroughWorkers(conn *connFlags, o *outputFlags, arg string) int {
	nc, ctx, done, err := conn.open("status", "read executions", names.ExecutionSubject, reissue)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	id, err := resolveExecution(ctx, nc, conn, arg)
	if err != nil {
		return usageError("%v", err)
	}
	v, err := execrpc.Ask[executor.ExecutionView](ctx, nc, names, names.ExecutionSubject,
		&executor.ExecutionRequest{V: envelope.Version, ExecutionID: id}, "read execution "+id)
	if err != nil {
		return readError(err)
	}
	s := &executor.ExecutionStatus{Record: v.Record, Envelope: v.Envelope}
	return o.print(s, func(w io.Writer, st style) {
		if s.Record == nil && s.Envelope == nil {
			fmt.Fprintf(w, "%s is %s\n", id, st.status(v.State))
			return
		}
		writeStatus(w, st, s)
	})
}
