// Command capstan runs capstan's embedded server, demo workers, and the calls,
// status and cancellation of executions from a shell.
//
// Exit codes: 0 completed, 1 failed or cancelled, 2 usage or connection
// error, 3 approval-required, 4 no envelope within --wait, 5 expired, 6 no
// such execution.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// command is one subcommand. Adding a subcommand is one line in commands.
type command struct {
	name    string
	summary string
	run     func(args []string) int
}

var commands = []command{
	{"dev", "embedded server, resources and a demo worker pool in one process", runDev},
	{"server", "the embedded JetStream server alone, with capstan's resources", runServer},
	{"worker", "a worker pool serving the demo catalog against an existing server", runWorker},
	{"call", "submit an execution and await its envelope", runCall},
	{"submit", "submit an execution and print its id", runSubmit},
	{"await", "await an execution's envelope", runAwait},
	{"status", "print an execution's record and envelope", runStatus},
	{"executions", "list executions, newest first, by capability, status, actor, principal and time", runExecutions},
	{"cancel", "cancel an execution", runCancel},
	{"audit", "print an execution's audit trail, or follow the audit stream", runAudit},
	{"describe", "list the capabilities a surface and actor may see, with input schemas", runDescribe},
	{"limits", "show each capability's limits and their usage now: slots, rates, budgets", runLimits},
	{"pause", "stop calls at once: of a capability, a principal, an actor, or everything (admins)", runPause},
	{"unpause", "lift a pause: the calls it held run (admins)", runUnpause},
	{"pauses", "list what is paused, since when, by whom and why", runPauses},
	{"policy", "Cedar policies as data: apply, test against recorded calls, show, history, remove (admins)", runPolicy},
	{"approvals", "list, show, approve and reject approvals", runApprovals},
	{"resume", "run an approved call as a new execution and await it", runResume},
	{"mcp", "serve the capabilities as MCP tools, over stdio or streamable HTTP", runMCP},
	{"notify", "tell approvers of approvals in Slack, by email or a signed webhook", runNotify},
	{"console", "the web console: approvals inbox, executions and their trails, capabilities", runConsole},
	{"bench", "measure throughput and latency, against a raw JetStream baseline", runBench},
	{"auth", "create principals, their credentials and the server's configuration", runAuth},
	{"admin", "operate a deployment: 'admin replicas [N]' shows or changes replica counts", runAdmin},
	{"version", "print capstan's version, and the Go and NATS versions it was built with", runVersion},
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		printCommands(os.Stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			if c, ok := lookup(rest[0]); ok {
				return c.run([]string{"-h"})
			}
			return usageError("unknown command %q; run 'capstan help'", rest[0])
		}
		printCommands(os.Stdout)
		return exitOK
	case "-version", "--version":
		return runVersion(rest)
	}
	c, ok := lookup(name)
	if !ok {
		return usageError("unknown command %q; run 'capstan help'", name)
	}
	return c.run(rest)
}

// runGroup runs the command of group (auth, policy) that args name:
// usage goes to stderr when none is named, to stdout when asked for.
func runGroup(group, usage string, args []string, commands map[string]func([]string) int) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "-help":
		fmt.Fprint(os.Stdout, usage) // asked for: help goes to stdout, as every command's does
		return exitOK
	}
	if run, ok := commands[args[0]]; ok {
		return run(args[1:])
	}
	return usageError("unknown %s command %q; run 'capstan %s --help'", group, args[0], group)
}

// aliases are other names of commands.
var aliases = map[string]string{"list": "executions"}

func lookup(name string) (command, bool) {
	if a, ok := aliases[name]; ok {
		name = a
	}
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func printCommands(w io.Writer) {
	fmt.Fprintf(w, "capstan runs agent tool calls through NATS JetStream to pools of Go workers.\n\n")
	fmt.Fprintf(w, "usage: capstan <command> [arguments]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'capstan help <command>' for a command's flags.\n")
}

// newFlags returns a command's flag set; usage is what follows the command's
// name in its synopsis. parseFlags reports its errors, so that every command
// says them in one form.
func newFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: capstan %s %s\n\nflags:\n", name, usage)
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard)
	return fs
}

// newConnFlags returns the flag set of a command that connects and prints:
// with the connection flags and the output flags.
func newConnFlags(name, usage string) (*flag.FlagSet, *connFlags, *outputFlags) {
	fs := newFlags(name, usage)
	return fs, addConnFlags(fs), addOutputFlags(fs)
}

// printUsage writes the command's synopsis and flags to w.
func printUsage(fs *flag.FlagSet, w io.Writer) {
	fs.SetOutput(w)
	fs.Usage()
	fs.SetOutput(io.Discard)
}

// parseFlags parses args, allowing flags before and after positional
// arguments, and checks the number of positional arguments (want < 0: any
// number). It returns the positional arguments, or an exit code when the
// command should end here.
func parseFlags(fs *flag.FlagSet, args []string, want int) ([]string, int, bool) {
	var pos []string
	for {
		if err := parseExplained(fs, args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(fs, os.Stdout)
				return nil, exitOK, false
			}
			fmt.Fprintf(os.Stderr, "capstan %s: %v\n", fs.Name(), err)
			printUsage(fs, os.Stderr)
			return nil, exitUsage, false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		// After "--" everything is positional.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if want >= 0 && len(pos) != want {
		if want == 0 {
			fmt.Fprintf(os.Stderr, "capstan %s: unexpected argument %q\n", fs.Name(), strings.Join(pos, " "))
		} else {
			fmt.Fprintf(os.Stderr, "capstan %s: want %d argument(s), got %d\n", fs.Name(), want, len(pos))
		}
		printUsage(fs, os.Stderr)
		return nil, exitUsage, false
	}
	return pos, 0, true
}

// parseExplained is fs.Parse, but a duration flag given a value that is not
// one (5, 1x) says what it wants where the flag package says "parse error".
// Its values are wrapped for the parse only, so that help still names their
// type (-wait duration).
func parseExplained(fs *flag.FlagSet, args []string) error {
	var wrapped []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				f.Value = durationValue{f.Value}
				wrapped = append(wrapped, f)
			}
		}
	})
	defer func() {
		for _, f := range wrapped {
			f.Value = f.Value.(durationValue).Value
		}
	}()
	return fs.Parse(args)
}

// durationValue is a duration flag's value while its flags are parsed.
type durationValue struct{ flag.Value }

func (d durationValue) Set(s string) error {
	if err := d.Value.Set(s); err != nil {
		return errors.New("want a duration with a unit, like 30s, 2m or 1h30m")
	}
	return nil
}

func (d durationValue) String() string {
	if d.Value == nil {
		return "" // the zero value the flag package makes for its help
	}
	return d.Value.String()
}
