package main

import (
	"context"
	"io"

	"github.com/capstan-dev/capstan/executor"
)

func runCancel(args []string) int {
	return byID("cancel", args, func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int {
		reply, err := c.Cancel(ctx, id)
		human := func(w io.Writer, st style) { writeCancelReply(w, st, reply) }
		if reply != nil && err != nil {
			// A worker answered but could not record the cancel.
			o.print(reply, human)
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return usageError("%v", err)
		}
		return o.print(reply, human)
	})
}
