package main

import (
	"context"
	"errors"
	"flag"
	"io"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// byIDWith runs a command whose one argument is an execution id: it parses
// the command's flags (flags adds its own), checks the id, opens a client and
// gives act a bounded context and the output flags (-o json).
func byIDWith(name string, args []string, flags func(*flag.FlagSet), act func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int) int {
	fs := newFlags(name, "ID [-o json]")
	conn := addConnFlags(fs)
	o := addOutputFlags(fs)
	if flags != nil {
		flags(fs)
	}
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	if err := o.check(); err != nil {
		return usageError("%v", err)
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
	return act(ctx, c, id, o)
}

func runStatus(args []string) int {
	var owner string
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&owner, "owner", "", "the `principal` whose execution it is (admins only; default: the caller's own)")
	}
	return byIDWith("status", args, flags, func(ctx context.Context, c *executor.Client, id string, o *outputFlags) int {
		if owner == "" {
			owner = c.Principal()
		}
		s, err := c.StatusOf(ctx, owner, id)
		if errors.Is(err, executor.ErrExpired) {
			return expiredError(err, id)
		}
		if errors.Is(err, executor.ErrUnknownExecution) {
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return usageError("%v", err)
		}
		return o.print(s, func(w io.Writer, st style) { writeStatus(w, st, s) })
	})
}
