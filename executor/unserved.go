package executor

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Unserved says what a call does when no live worker serves its capability:
// its pool is down (no worker renewed the pool's catalog entry within the
// catalog TTL), or no pool lists it and no worker runs at all (DESIGN §13).
// The client tells it from the catalog before it publishes, at no cost for a
// capability that is served.
type Unserved int

const (
	// UnservedQueue (the default): the request is stored and waits for a
	// worker until its start deadline, as any request does; Call returns at
	// once with an *UnservedError that names its execution id (Queued),
	// which Await waits on and Cancel withdraws (but a read without a
	// claim: see Meta.Idempotent). Submit stores it and
	// returns its id.
	UnservedQueue Unserved = iota
	// UnservedRefuse: nothing is stored; Call and Submit return an
	// *UnservedError at once.
	UnservedRefuse
	// UnservedWait: the call is stored and waited for as any other, until
	// a worker comes, its start deadline or the context's end.
	UnservedWait
)

// String names the choice as the CLI's --if-unserved takes it.
func (u Unserved) String() string {
	switch u {
	case UnservedQueue:
		return "queue"
	case UnservedRefuse:
		return "refuse"
	case UnservedWait:
		return "wait"
	}
	return fmt.Sprintf("Unserved(%d)", int(u))
}

// ErrUnserved marks an *UnservedError.
var ErrUnserved = errors.New("capstan: no live worker serves the capability")

// UnservedError is a call to a capability no live worker serves, told before
// or as it was submitted, so that the caller hears it at once instead of
// waiting for a worker that is not there. errors.Is(err, ErrUnserved) holds.
type UnservedError struct {
	// CapabilityID is the capability called.
	CapabilityID string
	// Pool is the pool the catalog lists it in; empty when no pool lists
	// it (and no worker runs at all).
	Pool string
	// LapsedAt is when the pool's liveness entry lapsed: its workers were
	// last seen a catalog TTL before. Zero when the pool has none.
	LapsedAt time.Time
	// ExecutionID is the request's id: stored and waiting when Queued.
	ExecutionID string
	// Queued: the request is stored and waits for a worker until StartBy.
	Queued  bool
	StartBy time.Time // set with Queued
}

// Error says what is missing, what to start, and what became of the request.
func (e *UnservedError) Error() string {
	var b strings.Builder
	if e.Pool == "" {
		fmt.Fprintf(&b, "capstan: no worker serves %s, and no worker is running: start one whose registry has it (capstan dev or capstan worker serve the demo catalog)", e.CapabilityID)
	} else {
		fmt.Fprintf(&b, "capstan: no live worker serves %s: its pool %q has none", e.CapabilityID, e.Pool)
		if !e.LapsedAt.IsZero() {
			fmt.Fprintf(&b, " (its liveness lapsed at %s)", e.LapsedAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(&b, ": start a worker of pool %q (capstan worker --pool %s serves the demo catalog; a program of yours runs executor.NewWorker with WorkerConfig{Pool: %q})", e.Pool, e.Pool, e.Pool)
	}
	if e.Queued {
		until := "its start deadline"
		if !e.StartBy.IsZero() {
			until = e.StartBy.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "; the request is queued as execution %s until %s, when it ends NOT_STARTED unless a worker starts it", e.ExecutionID, until)
	} else {
		b.WriteString("; nothing was submitted")
	}
	return b.String()
}

// Unwrap makes the error ErrUnserved.
func (e *UnservedError) Unwrap() error { return ErrUnserved }
