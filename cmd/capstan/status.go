package main

import (
	"context"
	"errors"
	"flag"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// byID runs a command whose one argument is an execution id: it parses the
// flags, checks the id, opens a client and gives act a bounded context.
func byID(name string, args []string, act func(ctx context.Context, c *executor.Client, id string) int) int {
	return byIDWith(name, args, nil, act)
}

// byIDWith is byID with flags of the command's own.
func byIDWith(name string, args []string, flags func(*flag.FlagSet), act func(ctx context.Context, c *executor.Client, id string) int) int {
	fs := newFlags(name, "ID")
	conn := addConnFlags(fs)
	if flags != nil {
		flags(fs)
	}
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	id := pos[0]
	if err := envelope.ValidExecutionID(id); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client(name, executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	return act(ctx, c, id)
}

func runStatus(args []string) int {
	return byID("status", args, func(ctx context.Context, c *executor.Client, id string) int {
		s, err := c.Status(ctx, id)
		if errors.Is(err, executor.ErrUnknownExecution) {
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return usageError("%v", err)
		}
		return printJSON(s)
	})
}
