package main

import (
	"context"
	"flag"

	"github.com/capstan-dev/capstan/executor"
)

func runCancel(args []string) int {
	var owner string
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&owner, "owner", "", "the `principal` whose execution it is (admins only; default: the caller's own)")
	}
	return byIDWith("cancel", args, flags, func(ctx context.Context, c *executor.Client, id string) int {
		var opts []executor.CancelOption
		if owner != "" {
			opts = append(opts, executor.OwnedBy(owner))
		}
		reply, err := c.Cancel(ctx, id, opts...)
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
