package main

import (
	"context"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

func runCancel(args []string) int {
	fs := newFlags("cancel", "ID")
	conn := addConnFlags(fs)
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	id := pos[0]
	if err := envelope.ValidExecutionID(id); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("cancel", executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
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
}
