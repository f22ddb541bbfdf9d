package main

import (
	"context"

	"github.com/capstan-dev/capstan/executor"
)

func runCancel(args []string) int {
	return byID("cancel", args, func(ctx context.Context, c *executor.Client, id string) int {
		reply, err := c.Cancel(ctx, id)
		if reply != nil && err != nil {
			// A worker answered but could not record the cancel.
			printJSON(reply)
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return usageError("%v", err)
		}
		return printJSON(reply)
	})
}
