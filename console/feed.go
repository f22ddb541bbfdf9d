package console

import (
	"context"
	"errors"
	"sync"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/nats-io/nats.go/jetstream"
)

// feed fans one source of changes out to every live page that listens: one
// approvals watcher and one audit follower per connection, however many
// pages are open, started with the first page and stopped with the last.
type feed struct {
	run func(ctx context.Context, emit func(any)) error

	mu   sync.Mutex
	subs map[int]func(any)
	next int
	stop context.CancelFunc
	gen  int // counts runs, so that a run that failed clears only itself
}

// subscribe calls fn with every change (an audit.Event for the audit feed,
// a key for the approvals feed) and, if the source fails, with its error.
// fn must not block. The returned func unsubscribes.
func (f *feed) subscribe(fn func(any)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[int]func(any){}
	}
	id := f.next
	f.next++
	f.subs[id] = fn
	if f.stop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f.stop = cancel
		f.gen++
		gen := f.gen
		go func() {
			err := f.run(ctx, f.emit)
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
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, id)
		if len(f.subs) == 0 && f.stop != nil {
			f.stop()
			f.stop = nil
		}
	}
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

func newFeeds(b *broker.Broker) *feeds {
	return &feeds{
		approvals: &feed{run: func(ctx context.Context, emit func(any)) error {
			w, err := b.Approvals.WatchAll(ctx, jetstream.UpdatesOnly())
			if err != nil {
				return err
			}
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return nil
				case e, ok := <-w.Updates():
					if !ok {
						return nil
					}
					if e != nil {
						emit(e.Key())
					}
				}
			}
		}},
		audit: &feed{run: func(ctx context.Context, emit func(any)) error {
			return audit.Follow(ctx, b, audit.Filter{}, func(ev audit.Event) error {
				emit(ev)
				return nil
			})
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
