package envelope

import (
	"strings"
	"unicode/utf8"
)

// Issue is one problem of an input, at a path like "items[2].amount" (empty
// for the input as a whole). An INPUT_INVALID envelope lists them in its
// error's details, under "issues".
type Issue struct {
	// Path is where in the input, "" for the input as a whole.
	Path string `json:"path"`
	// Message says what is wrong there.
	Message string `json:"message"`
}

// InputError lists every issue of an input. A capability's input type may
// return one from its Validate method to report issues with paths; any other
// error becomes one issue without a path.
type InputError struct {
	// Issues are the problems found.
	Issues []Issue
	// Cause is what the decoder or the Validate method said, for the logs
	// and for errors.Is and errors.As. It never reaches the envelope, the
	// model or the audit trail.
	Cause error
}

// Error lists the issues, and the cause shortened.
func (e *InputError) Error() string {
	if len(e.Issues) == 0 {
		return "invalid input"
	}
	var b strings.Builder
	for i, is := range e.Issues {
		if i > 0 {
			b.WriteString("; ")
		}
		if is.Path != "" {
			b.WriteString(is.Path + ": ")
		}
		b.WriteString(is.Message)
	}
	if e.Cause != nil {
		b.WriteString(" (" + shortenCause(e.Cause.Error()) + ")")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *InputError) Unwrap() error { return e.Cause }

// shortenCause cuts a cause to 256 bytes, on a rune boundary.
func shortenCause(s string) string {
	const max, more = 256, "…"
	if len(s) <= max {
		return s
	}
	cut := max - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
