package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
)

// runAuth dispatches the credential commands.
func runAuth(args []string) int {
	usage := "usage: capstan auth init|add|remove|list|push DIR ...\n\n" +
		"  init DIR [--prefix P]      operator, accounts, admin and worker principals, DIR/nats-server.conf\n" +
		"  add DIR NAME --role R ...  a principal and DIR/NAME.creds (producer: --actor; approver: --types)\n" +
		"  remove DIR NAME            revoke a principal (restart or reload the server, then push)\n" +
		"  list DIR                   every principal and its grants\n" +
		"  push DIR                   publish the grants to a running server (as DIR/admin.creds)\n"
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) == 0 {
			fmt.Fprint(os.Stderr, usage)
			return exitUsage
		}
		fmt.Fprint(os.Stdout, usage) // asked for: help goes to stdout, as every command's does
		return exitOK
	}
	switch args[0] {
	case "init":
		return runAuthInit(args[1:])
	case "add":
		return runAuthAdd(args[1:])
	case "remove":
		return runAuthRemove(args[1:])
	case "list":
		return runAuthList(args[1:])
	case "push":
		return runAuthPush(args[1:])
	}
	return usageError("unknown auth command %q; run 'capstan auth --help'", args[0])
}

func runAuthInit(args []string) int {
	fs := newFlags("auth init", "DIR [--prefix P]")
	prefix := fs.String("prefix", "", "prefix of capstan's resource names (default CAPSTAN)")
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	s, err := auth.Init(pos[0], *prefix)
	if err != nil {
		return fail(exitFailed, "auth init: %v", err)
	}
	fmt.Printf("created %s: %s, %s, %s\n", pos[0], auth.ServerConfigFile,
		s.CredsPath(auth.AdminPrincipal), s.CredsPath(auth.WorkerPrincipal))
	fmt.Printf("next:\n  capstan auth add %s NAME --role producer --actor user:NAME\n  capstan server --auth %s\n", pos[0], pos[0])
	return exitOK
}

func runAuthAdd(args []string) int {
	fs := newFlags("auth add", "DIR NAME --role producer|approver|worker|admin|notifier [--actor KIND:ID] [--surfaces S,S] [--capabilities ID,PREFIX.*] [--types T,T] [--pool P]")
	role := fs.String("role", "", "producer, approver, worker, admin or notifier")
	actors := fs.String("actor", "", "actors the principal may act as, comma-separated: kind:id, or kind:* for a gateway that authenticates its users")
	surfaces := fs.String("surfaces", "", "surfaces a producer may call from, comma-separated (default all)")
	caps := fs.String("capabilities", "*", "capabilities a producer may call, comma-separated: ids, prefixes like orders.*, or *")
	types := fs.String("types", "", "approval types an approver may decide, comma-separated, or *")
	pool := fs.String("pool", "", "pool of a worker")
	pos, code, ok := parseFlags(fs, args, 2)
	if !ok {
		return code
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return fail(exitUsage, "auth add: %v", err)
	}
	g := auth.Grant{Principal: pos[1], Role: auth.Role(*role), Actors: list(*actors),
		Surfaces: list(*surfaces), Types: list(*types), Pool: *pool}
	if g.Role == auth.Producer {
		g.Capabilities = list(*caps)
	}
	if err := s.Add(g); err != nil {
		return fail(exitUsage, "auth add: %v", err)
	}
	fmt.Printf("created %s\n", s.CredsPath(g.Principal))
	fmt.Printf("a running server learns the grant with: capstan auth push %s\n", pos[0])
	return exitOK
}

func runAuthRemove(args []string) int {
	fs := newFlags("auth remove", "DIR NAME")
	pos, code, ok := parseFlags(fs, args, 2)
	if !ok {
		return code
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return fail(exitUsage, "auth remove: %v", err)
	}
	if err := s.Remove(pos[1]); err != nil {
		return fail(exitUsage, "auth remove: %v", err)
	}
	fmt.Printf("revoked %s in %s\n", pos[1], s.ServerConfigPath())
	fmt.Printf("restart or reload the server, then: capstan auth push %s\n", pos[0])
	return exitOK
}

func runAuthList(args []string) int {
	fs := newFlags("auth list", "DIR")
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return fail(exitUsage, "auth list: %v", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tROLE\tACTORS\tSURFACES\tCAPABILITIES\tTYPES\tCREDS")
	for _, g := range s.Principals {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Principal, g.Role, dash(g.Actors), dash(g.Surfaces),
			dash(g.Capabilities), dash(g.Types), s.CredsPath(g.Principal))
	}
	_ = tw.Flush()
	return exitOK
}

func runAuthPush(args []string) int {
	fs := newFlags("auth push", "DIR [--nats URL] [--creds DIR/admin.creds]")
	conn := addConnFlags(fs)
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return fail(exitUsage, "auth push: %v", err)
	}
	if conn.creds == "" {
		conn.creds = s.CredsPath(auth.AdminPrincipal)
	}
	nc, err := conn.connect("auth push")
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := auth.PublishGrants(ctx, js, s, 0); err != nil {
		return fail(exitFailed, "auth push: %v", err)
	}
	fmt.Printf("published %d grants\n", len(s.Principals))
	return exitOK
}

// list splits a comma-separated flag, dropping empty items.
func list(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func dash(v []string) string {
	if len(v) == 0 {
		return "-"
	}
	return strings.Join(v, ",")
}
