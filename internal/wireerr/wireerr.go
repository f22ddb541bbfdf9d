// Package wireerr carries a refusal the workers answered across the wire:
// on their side, the names of the sentinel errors it matches (a reply's
// conditions); on the client's, an error that errors.Is matches against
// those sentinels again.
package wireerr

import (
	"errors"
	"slices"

	"github.com/capstan-dev/capstan/envelope"
)

// Condition names a sentinel error on the wire.
type Condition struct {
	Name string
	Err  error
}

// Table is the conditions of one kind of request.
type Table []Condition

// Names are the names of the conditions err matches, each once.
func (t Table) Names(err error) []string {
	var out []string
	for _, c := range t {
		if errors.Is(err, c.Err) && !slices.Contains(out, c.Name) {
			out = append(out, c.Name)
		}
	}
	return out
}

// Error is the refusal a reply carries: a quota's is the
// *envelope.CapabilityError it was made from (quota_exceeded, with its
// details), any other matches the conditions named.
func (t Table) Error(msg string, names []string, details map[string]any) error {
	if slices.Contains(names, "quota_exceeded") {
		return envelope.QuotaRefusal(msg, details)
	}
	e := &refused{msg: msg}
	for _, n := range names {
		for _, c := range t {
			if c.Name == n {
				e.conds = append(e.conds, c.Err)
			}
		}
	}
	return e
}

// refused is a refusal a worker answered.
type refused struct {
	msg   string
	conds []error
}

func (e *refused) Error() string   { return e.msg }
func (e *refused) Unwrap() []error { return e.conds }
