package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
)

// Progress is what a handler reported of an execution's progress
// (Call.Progress): done of total, a message, the attempt, when. It is best
// effort, never proof (DESIGN §5, "Progress"): only the envelope says how an
// execution ended.
type Progress = envelope.Progress

type progressKey struct{}

// WithProgress returns a context under which the client's Call, CallMany,
// Await and Resume call fn with each progress report of the executions they
// wait for, as the worker publishes them (at most four a second each),
// until they return: fn is called once at a time, each execution's reports
// in order, never after the call returned, and it should return quickly (a slow fn makes the
// client skip reports, never the execution wait). Following progress costs
// one subscription while the call waits, on the principal's own progress
// subjects (DESIGN §12); without WithProgress nothing is subscribed.
//
//	ctx = executor.WithProgress(ctx, func(p executor.Progress) { log.Print(p.String()) })
//	env, err := client.Call(ctx, "demo.report", map[string]any{"pages": 120})
func WithProgress(ctx context.Context, fn func(Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// progressOf is the callback WithProgress set on ctx, nil when none.
func progressOf(ctx context.Context) func(Progress) {
	fn, _ := ctx.Value(progressKey{}).(func(Progress))
	return fn
}

// Progress follows the progress of one of the client's executions: each
// report the worker publishes (at most four a second) arrives on the
// channel, which keeps the latest ones when the reader falls behind, and is
// closed when ctx ends. It does not end with the execution: the caller
// stops following (its envelope comes from Await). Reports are best effort:
// one published before this subscription reached the server is not seen
// (Status shows the last one as of the lease's last renewal).
func (c *Client) Progress(ctx context.Context, executionID string) (<-chan Progress, error) {
	if err := envelope.ValidExecutionID(executionID); err != nil {
		return nil, fmt.Errorf("capstan: %w", err)
	}
	if err := c.closed(); err != nil {
		return nil, err
	}
	out := make(chan Progress, 16)
	var mu sync.Mutex
	ended := false
	f, err := c.followProgress(func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		select {
		case out <- p:
			return
		default:
		}
		select { // full: the oldest goes
		case <-out:
		default:
		}
		select {
		case out <- p:
		default:
		}
	}, 1)
	if err != nil {
		return nil, err
	}
	if err := f.add(executionID); err != nil {
		f.stop()
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		f.stop()
		mu.Lock()
		ended = true
		close(out)
		mu.Unlock()
	}()
	return out, nil
}

// WatchProgress hands fn every progress report of every execution of the
// client's principal, as the workers publish them, until ctx ends (or the
// client closes): one subscription to the principal's progress subjects, for
// a service that shows many executions at once (the MCP bridge's tasks, a
// dashboard). fn is called once at a time and must return quickly; reports
// that come while it is busy may be dropped. Reports are best effort (see
// Progress).
func (c *Client) WatchProgress(ctx context.Context, fn func(Progress)) error {
	if err := c.closed(); err != nil {
		return err
	}
	f, err := c.followProgress(fn, 0)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		f.stop()
	}()
	return nil
}

// progressFollow delivers the progress of the executions added to it to fn,
// until stop.
type progressFollow struct {
	c  *Client
	fn func(Progress)
	// wide follows every execution of the principal on one subscription
	// (a fan-out); otherwise each id added has its own. every hands over
	// every execution's reports, not only those of the ids added.
	wide, every bool

	mu   sync.Mutex
	ids  map[string]bool
	subs []*nats.Subscription
	// calling is held while fn runs: fn is called once at a time, and stop
	// waits for a call under way.
	calling sync.Mutex
	stopped atomic.Bool
}

// followProgress starts following progress for up to n executions: on
// their own subjects for one, on the principal's for more (its account's
// subscriptions are counted and limited, DESIGN §12 "Limits"); n 0 follows
// every execution of the principal.
func (c *Client) followProgress(fn func(Progress), n int) (*progressFollow, error) {
	f := &progressFollow{c: c, fn: fn, wide: n != 1, every: n == 0, ids: map[string]bool{}}
	if f.wide {
		sub, err := c.b.NC.Subscribe(c.b.Names.ProgressSubjectsOf(c.principal), f.receive)
		if err != nil {
			return nil, fmt.Errorf("capstan: follow progress: %w", err)
		}
		_ = sub.SetPendingLimits(4096, 16<<20)
		f.subs = append(f.subs, sub)
	}
	return f, nil
}

// add follows id; its subscription is made before the request is published,
// so that the server knows of it before any worker may report.
func (f *progressFollow) add(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped.Load() {
		return ErrClosed
	}
	f.ids[id] = true
	if f.wide {
		return nil
	}
	sub, err := f.c.b.NC.Subscribe(f.c.b.Names.ProgressSubject(f.c.principal, id), f.receive)
	if err != nil {
		return fmt.Errorf("capstan: follow the progress of %s: %w", id, err)
	}
	_ = sub.SetPendingLimits(256, 1<<20)
	f.subs = append(f.subs, sub)
	return nil
}

// receive hands one progress report to fn: only a record that decodes, of
// an execution followed, on that execution's own subject, its message
// cleaned (envelope.DecodeProgress cleans it, whoever published it).
func (f *progressFollow) receive(m *nats.Msg) {
	p, err := envelope.DecodeProgress(m.Data)
	if err != nil {
		f.c.cfg.Logger.Debug("progress report does not decode: ignored", "subject", m.Subject, "err", err)
		return
	}
	if m.Subject != f.c.b.Names.ProgressSubject(f.c.principal, p.ExecutionID) {
		return
	}
	f.mu.Lock()
	followed := f.every || f.ids[p.ExecutionID]
	f.mu.Unlock()
	if !followed {
		return
	}
	f.calling.Lock()
	defer f.calling.Unlock()
	if !f.stopped.Load() {
		f.fn(*p)
	}
}

// stop ends the following: once it returns, fn is never called again.
func (f *progressFollow) stop() {
	if f == nil {
		return
	}
	// A call under way ends first; none starts after.
	f.calling.Lock()
	f.stopped.Store(true)
	f.calling.Unlock()
	// add, which checks stopped under mu, adds nothing after this.
	f.mu.Lock()
	subs := f.subs
	f.subs = nil
	f.mu.Unlock()
	for _, s := range subs {
		if err := s.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			f.c.cfg.Logger.Debug("progress: unsubscribe", "subject", s.Subject, "err", err)
		}
	}
}

// progressFor starts following the progress of executions for a call whose
// context asked for it (WithProgress): nil, and nothing subscribed,
// otherwise.
func (c *Client) progressFor(ctx context.Context, n int) *progressFollow {
	fn := progressOf(ctx)
	if fn == nil {
		return nil
	}
	f, err := c.followProgress(fn, n)
	if err != nil {
		c.cfg.Logger.Warn("progress not followed", "err", err)
		return nil
	}
	return f
}

// follow adds id to f, if f follows anything; progress is best effort, so
// a subscription refused is logged, never the call's failure.
func (f *progressFollow) follow(id string) {
	if f == nil {
		return
	}
	if err := f.add(id); err != nil {
		f.c.cfg.Logger.Warn("progress not followed", "executionId", id, "err", err)
	}
}
