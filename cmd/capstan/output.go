package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/capstan-dev/capstan/envelope"
)

// Exit codes.
const (
	exitOK         = 0 // completed
	exitFailed     = 1 // failed or cancelled
	exitUsage      = 2 // usage or connection error
	exitApproval   = 3 // approval-required
	exitNoEnvelope = 4 // no envelope within --wait
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

// printEnvelope prints env and returns the exit code of its status.
func printEnvelope(env *envelope.Envelope) int {
	if code := printJSON(env); code != exitOK {
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
