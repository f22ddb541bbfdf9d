package main

import (
	"context"
	"errors"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

func runStatus(args []string) int {
	fs := newFlags("status", "ID")
	conn := addConnFlags(fs)
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	id := pos[0]
	if err := envelope.ValidExecutionID(id); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("status", executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	s, err := c.Status(ctx, id)
	if errors.Is(err, executor.ErrUnknownExecution) {
		return fail(exitFailed, "%v", err)
	}
	if err != nil {
		return usageError("%v", err)
	}
	return printJSON(s)
}
