package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

func runDescribe(args []string) int {
	fs, conn, o := newConnFlags("describe", "[--surface S] [--actor kind:id] [--prefix P] [--tag T]... [-o json]")
	surfaceFlag := fs.String("surface", string(executor.SurfaceDirect), "the surface to describe: direct, mcp or http")
	actorFlag := fs.String("actor", "", "who is asking, as kind:id (or anonymous; default user:<principal> with --creds, else user:$USER)")
	var scope executor.Scope
	fs.StringVar(&scope.Prefix, "prefix", "", "only capabilities whose id starts with this")
	fs.Func("tag", "only capabilities with this tag (repeatable: all must match)", func(s string) error {
		if s == "" {
			return errors.New("empty tag")
		}
		scope.Tags = append(scope.Tags, s)
		return nil
	})
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	surface, err := parseSurface(*surfaceFlag)
	if err != nil {
		return usageError("%v", err)
	}
	if err := o.check(); err != nil {
		return usageError("%v", err)
	}
	if *actorFlag == "" {
		*actorFlag = defaultActor(conn)
	}
	actor, err := parseActor(*actorFlag)
	if err != nil {
		return usageError("%v", err)
	}
	if err := conn.need("describe capabilities", names.DescribeSubject,
		"an approver reads approvals ('capstan approvals list') and the executions behind them ('capstan executions')"); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("describe", executor.ClientConfig{Surface: surface})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()

	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	d, err := c.Describe(ctx, surface, actor, scope)
	var ce *envelope.CapabilityError
	if errors.As(err, &ce) {
		return fail(exitFailed, "describe refused: %s: %s", ce.Code, ce.Message)
	}
	if err != nil {
		return usageError("%v", err)
	}
	return o.print(d, func(w io.Writer, st style) { writeDiscovery(w, st, d) })
}

// parseActor reads kind:id; an anonymous actor may leave out the id.
func parseActor(s string) (envelope.Actor, error) {
	kind, id, _ := strings.Cut(s, ":")
	if kind == "" || id == "" && kind != envelope.ActorAnonymous {
		return envelope.Actor{}, fmt.Errorf("--actor %q: want kind:id, e.g. user:alice, or anonymous", s)
	}
	return envelope.Actor{Kind: kind, ID: id}, nil
}
