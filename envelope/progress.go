package envelope

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/internal/msgenc"
)

// Progress is what a handler reported of an attempt's work so far: how much
// is done, of how much (0: unknown), and a short message. Workers publish it
// on the execution owner's progress subject, coalesced, and keep the last one
// in the execution's record at each lease renewal (DESIGN §5, "Progress").
// It is best effort, never proof: a progress message may be lost, come late
// or come after the envelope, and says nothing of the outcome; the envelope
// alone does. It carries no output: what leaves a worker of an output passes
// stages 12 and 13 in the envelope, whole.
type Progress struct {
	// V is the schema version, Version; a reader refuses any other.
	V int `json:"v"`
	// ExecutionID is the execution the report is of.
	ExecutionID string `json:"executionId"`
	// Attempt is the attempt that reported it: a retry's progress starts
	// again.
	Attempt int `json:"attempt,omitempty"`
	// Done is how much is done, Total of how much (0: not known); both are
	// finite and not negative, in the handler's own unit (items, bytes,
	// pages).
	Done  float64 `json:"done,omitempty"`
	Total float64 `json:"total,omitempty"` // see Done
	// Message is one line of printable text, at most MaxProgressMessage
	// bytes, shown to people and models as the handler wrote it.
	Message string `json:"message,omitempty"`
	// At is when the handler reported it (the worker's clock).
	At time.Time `json:"at"`
}

// MaxProgressMessage bounds a progress message, in bytes.
const MaxProgressMessage = 256

// CleanProgress makes a handler's report fit the record: a value that is
// not finite or is negative is 0 (not known), and the message is one line
// of printable UTF-8 of at most MaxProgressMessage bytes (control
// characters, a terminal's escape sequences among them, become spaces;
// invalid bytes U+FFFD; a longer one is cut at a character boundary).
func CleanProgress(done, total float64, message string) (float64, float64, string) {
	clean := func(f float64) float64 {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return 0
		}
		return f
	}
	return clean(done), clean(total), cleanLine(message, MaxProgressMessage)
}

// cleanLine is s as one line of printable UTF-8, at most max bytes.
func cleanLine(s string, max int) string {
	printable := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			printable = false
			break
		}
	}
	if printable && len(s) <= max {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), max))
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
		case !unicode.IsPrint(r):
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// DecodeProgress decodes a progress record, refusing one of another schema
// version, without a valid execution id, or with a value that is not finite
// or is negative. Whoever published it, its message comes out cleaned as
// CleanProgress cleans it: one printable line, at most MaxProgressMessage
// bytes, for a terminal, a page or a model. It never panics; every failure
// wraps ErrDecode.
func DecodeProgress(b []byte) (*Progress, error) {
	var p Progress
	if err := Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if err := CheckVersion(p.V); err != nil {
		return nil, err
	}
	if err := ValidExecutionID(p.ExecutionID); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	for _, f := range []float64{p.Done, p.Total} {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return nil, fmt.Errorf("%w: progress value %v", ErrDecode, f)
		}
	}
	p.Message = cleanLine(p.Message, MaxProgressMessage)
	return &p, nil
}

// Fraction is Done of Total, between 0 and 1, and whether Total is known.
func (p *Progress) Fraction() (float64, bool) {
	if p == nil || p.Total <= 0 {
		return 0, false
	}
	return min(max(p.Done/p.Total, 0), 1), true
}

// Line is the report in one line for a person: String, or empty when
// String says nothing, with "attempt N: " before it after the first attempt.
func (p *Progress) Line(empty string) string {
	text := p.String()
	if text == "" {
		text = empty
	}
	if p != nil && p.Attempt > 1 {
		text = "attempt " + strconv.Itoa(p.Attempt) + ": " + text
	}
	return text
}

// String is the progress for a person: "37 of 120 (30%): rendering", "37:
// rendering", or the message alone when nothing is counted.
func (p *Progress) String() string {
	if p == nil {
		return ""
	}
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	var s string
	switch {
	case p.Total > 0:
		f, _ := p.Fraction()
		s = fmt.Sprintf("%s of %s (%d%%)", num(p.Done), num(p.Total), int(f*100))
	case p.Done > 0:
		s = num(p.Done)
	}
	switch {
	case s == "":
		return p.Message
	case p.Message != "":
		return s + ": " + p.Message
	}
	return s
}

// EncodeMsgpack writes the progress without reflection, as the reflective
// encoder does.
func (p Progress) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.Int("v", int64(p.V))
	f.String("executionId", p.ExecutionID)
	f.Int("attempt", int64(p.Attempt))
	f.Float("done", p.Done)
	f.Float("total", p.Total)
	f.String("message", p.Message)
	f.Time("at", p.At)
	return f.Encode(enc)
}
