package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/capstan-dev/capstan/executor"
)

func runCancel(args []string) int {
	var owner string
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&owner, "owner", "", "the `principal` whose execution it is (admins only; default: the caller's own)")
	}
	need := func(conn *connFlags) error {
		return conn.need("cancel executions", func(p string) string { return names.CancelSubject(p, "*") },
			"producers cancel their own executions, admins any")
	}
	return byID{name: "cancel", flags: flags, need: need, act: func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int {
		var opts []executor.CancelOption
		if owner != "" {
			opts = append(opts, executor.OwnedBy(owner))
		}
		reply, err := c.Cancel(ctx, id, opts...)
		switch {
		case errors.Is(err, executor.ErrExpired):
			return expiredError(err, id)
		case errors.Is(err, executor.ErrNoSuchExecution):
			return fail(exitUnknown, "%v", err)
		}
		human := func(w io.Writer, st style) { writeCancelReply(w, st, reply) }
		if reply != nil && err != nil {
			// A worker answered but could not record the cancel.
			o.print(reply, human)
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return requestError(err)
		}
		return o.print(reply, human)
	}}.run(args)
}
