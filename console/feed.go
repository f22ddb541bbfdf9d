package console

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// feed fans one source of changes out to every live page that listens: one
// approvals watcher and one audit follower per connection, however many
// pages are open, started with the first page and stopped with the last.
//
// A page subscribes after it was rendered, so it looks once for what changed
// in between (see live.go); a feed therefore fixes where it starts before
// subscribe returns, and never misses what that look did not see.
type feed struct {
	// start fixes the feed's starting point and returns the loop that emits.
	start func(ctx context.Context) (func(ctx context.Context, emit func(any)) error, error)

	mu   sync.Mutex
	subs map[int]func(any)
	next int
	stop context.CancelFunc
	gen  int // counts runs, so that a run that failed clears only itself
}

// subscribe calls fn with every change (an audit.Event for the audit feed,
// a key for the approvals feed) and, if the source fails, with its error.
// fn must not block. The returned func unsubscribes.
func (f *feed) subscribe(fn func(any)) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		run, err := f.start(sctx)
		scancel()
		if err != nil {
			cancel()
			return nil, err
		}
		f.stop = cancel
		f.gen++
		gen := f.gen
		go func() {
			err := run(ctx, f.emit)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("the source closed")
			}
			f.mu.Lock()
			if f.gen == gen {
				f.stop = nil // the next page starts it again
			}
			f.mu.Unlock()
			cancel()
			f.emit(err)
		}()
	}
	if f.subs == nil {
		f.subs = map[int]func(any){}
	}
	id := f.next
	f.next++
	f.subs[id] = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, id)
		if len(f.subs) == 0 && f.stop != nil {
			f.stop()
			f.stop = nil
		}
	}, nil
}

func (f *feed) emit(v any) {
	f.mu.Lock()
	fns := make([]func(any), 0, len(f.subs))
	for _, fn := range f.subs {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn(v)
	}
}

// feeds are the live sources of one connection.
type feeds struct {
	approvals, audit *feed
}

// approvalsReady is what the approvals feed emits once its watcher has
// caught up: whatever changed before it existed is in the bucket by then.
const approvalsReady = ""

func newFeeds(approvalsKV jetstream.KeyValue, reader approvalsReader, b *broker.Broker) *feeds {
	return &feeds{
		approvals: &feed{start: func(ctx context.Context) (func(context.Context, func(any)) error, error) {
			switch {
			case approvalsKV == nil && reader == nil:
				return nil, errNotPermitted
			case approvalsKV == nil:
				return func(ctx context.Context, emit func(any)) error { return pollApprovals(ctx, reader, emit) }, nil
			}
			return func(ctx context.Context, emit func(any)) error {
				// Keys only; the initial ones are the bucket as it is, told
				// as one change once they are through.
				w, err := approvalsKV.WatchAll(ctx, jetstream.MetaOnly())
				if err != nil {
					return err
				}
				defer func() { _ = w.Stop() }()
				initial := true
				for {
					select {
					case <-ctx.Done():
						return nil
					case e, ok := <-w.Updates():
						switch {
						case !ok:
							return nil
						case e == nil:
							initial = false
							emit(approvalsReady)
						case !initial:
							emit(e.Key())
						}
					}
				}
			}, nil
		}},
		audit: &feed{start: func(ctx context.Context) (func(context.Context, func(any)) error, error) {
			if b == nil {
				return nil, errNotPermitted
			}
			// From the event after the last one stored now: a page that
			// subscribes later reads the stream's end itself.
			info, err := b.Audit.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("capstan: audit stream: %w", err)
			}
			from := info.State.LastSeq + 1
			return func(ctx context.Context, emit func(any)) error {
				return audit.Follow(ctx, b, audit.Filter{}, func(ev audit.Event) error {
					emit(ev)
					return nil
				}, audit.FromSeq(from))
			}, nil
		}},
	}
}

func (fs *feeds) close() {
	for _, f := range []*feed{fs.approvals, fs.audit} {
		f.mu.Lock()
		if f.stop != nil {
			f.stop()
			f.stop = nil
		}
		f.subs = nil
		f.mu.Unlock()
	}
}
