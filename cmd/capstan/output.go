package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// Exit codes.
const (
	exitOK         = 0 // completed
	exitFailed     = 1 // failed or cancelled
	exitUsage      = 2 // usage or connection error
	exitApproval   = 3 // approval-required
	exitNoEnvelope = 4 // no envelope within --wait
	exitExpired    = 5 // the envelope is no longer kept
	exitUnknown    = 6 // no such execution: nothing of it is stored
	exitUnserved   = 7 // no live worker serves the capability
	// SIGINT or SIGTERM while waiting for an envelope: the execution goes on
	// (128 + the signal's number, what a shell reports for a process the
	// signal ended: Ctrl-C, or a supervisor's stop).
	exitInterrupted = 130 // SIGINT
	exitTerminated  = 143 // SIGTERM
)

// printJSON writes v to stdout as indented JSON.
func printJSON(v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fail(exitFailed, "print JSON: %v", err)
	}
	return exitOK
}

// printEnvelope prints env as o says and returns the exit code of its
// status.
func printEnvelope(o *outputFlags, env *envelope.Envelope) int {
	if code := o.print(env, func(w io.Writer, st style) { writeEnvelope(w, st, env) }); code != exitOK {
		return code
	}
	switch env.Status {
	case envelope.StatusCompleted:
		return exitOK
	case envelope.StatusApprovalRequired:
		return exitApproval
	default:
		return exitFailed
	}
}

// fail reports an error on stderr and returns code.
func fail(code int, format string, args ...any) int {
	msg := strings.TrimPrefix(fmt.Sprintf(format, args...), "capstan: ") // library errors carry it too
	fmt.Fprintln(os.Stderr, "capstan: "+msg)
	return code
}

func usageError(format string, args ...any) int { return fail(exitUsage, format, args...) }

// outputFlags choose how a command prints for a person (the default: tables
// and short summaries) or for a script (-o json or --json: the JSON the
// command has always printed).
type outputFlags struct {
	json   bool
	format string
}

func addOutputFlags(fs *flag.FlagSet) *outputFlags {
	o := &outputFlags{}
	fs.BoolVar(&o.json, "json", false, "print JSON, for scripts (the same as -o json)")
	fs.StringVar(&o.format, "o", "", "output `format`: text (for a person, the default) or json")
	return o
}

// check refuses an unknown format; call it after parsing.
func (o *outputFlags) check() error {
	switch o.format {
	case "", "text", "table", "json":
		return nil
	}
	return fmt.Errorf("-o %q: want text or json", o.format)
}

// parseOutput parses args as parseFlags does, then refuses an unknown
// output format: how a command that prints with o reads its arguments.
func parseOutput(fs *flag.FlagSet, args []string, want int, o *outputFlags) ([]string, int, bool) {
	pos, code, ok := parseFlags(fs, args, want)
	if !ok {
		return nil, code, false
	}
	if err := o.check(); err != nil {
		return nil, usageError("%v", err), false
	}
	return pos, exitOK, true
}

// parseExecutionID parses the args of a command whose one argument is an
// execution id (or a prefix of one), as parseOutput does, and checks it.
func parseExecutionID(fs *flag.FlagSet, args []string, o *outputFlags) (string, int, bool) {
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return "", code, false
	}
	if err := envelope.ValidExecutionID(pos[0]); err != nil {
		return "", usageError("%v", err), false
	}
	return pos[0], exitOK, true
}

func (o *outputFlags) isJSON() bool { return o.json || o.format == "json" }

// print writes v as JSON, or with human for a person.
func (o *outputFlags) print(v any, human func(w io.Writer, st style)) int {
	if o.isJSON() {
		return printJSON(v)
	}
	w := bufio.NewWriter(os.Stdout)
	human(w, stdoutStyle())
	if err := w.Flush(); err != nil {
		return fail(exitFailed, "print: %v", err)
	}
	return exitOK
}

// colorsWanted reports whether f may be written in colour: a terminal, and
// neither NO_COLOR nor TERM=dumb says otherwise.
func colorsWanted(f *os.File) bool {
	return isTerminal(f) && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}

func stdoutStyle() style { return style{color: colorsWanted(os.Stdout), now: time.Now()} }

// style is how human output is written: in colour or not, and the moment
// ages are counted from.
type style struct {
	color bool
	now   time.Time
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiDim    = "\x1b[2m"
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiCyan   = "\x1b[36m"
)

func (s style) paint(code, text string) string {
	if !s.color || text == "" {
		return text
	}
	return code + text + ansiReset
}

func (s style) bold(text string) string { return s.paint(ansiBold, text) }
func (s style) dim(text string) string  { return s.paint(ansiDim, text) }

// status paints a status or event word by what it means.
func (s style) status(word string) string {
	switch word {
	case "completed", "approved", "capability.completed", "capability.approved":
		return s.paint(ansiGreen, word)
	case "failed", "rejected", "capability.failed", "capability.denied", "capability.rejected", "envelope.conflict":
		return s.paint(ansiRed, word)
	case "cancelled", "pending", "running", "backoff", "capability.cancelled", "capability.retried", "execution.taken_over":
		return s.paint(ansiYellow, word)
	case "approval-required", "capability.approval_requested":
		return s.paint(ansiCyan, word)
	case "expired", "consumed":
		return s.paint(ansiDim, word)
	}
	return word
}

// waiting shows, on a terminal's stderr, how long a command has waited for
// what, once it has waited a second; stop clears the line. Without a
// terminal it shows nothing.
func waiting(what string, limit time.Duration) (stop func()) { return waitingFor(what, limit, nil) }
