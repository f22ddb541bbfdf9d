package bench

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// stampedLoop drives the loads that run on JetStream alone (the raw
// baseline, the floor): each message carries its publisher's slot and its
// publish time in its first 12 bytes, and its arrival at the end of the
// path hands the slot back, closing the loop.
type stampedLoop struct {
	cfg  *Config
	bar  *progress
	done []chan struct{} // one per slot
	t    *tally
	got  atomic.Int64
	all  chan struct{} // closed when cfg.N messages have arrived
}

func newStampedLoop(cfg *Config, bar *progress) *stampedLoop {
	l := &stampedLoop{cfg: cfg, bar: bar, done: make([]chan struct{}, max(cfg.Concurrency, 1)),
		t: &tally{notes: cfg.Notes, res: loopResult{latencies: make([]time.Duration, 0, cfg.N)}}, all: make(chan struct{})}
	for i := range l.done {
		l.done[i] = make(chan struct{}, 1)
	}
	return l
}

var completed = &envelope.Envelope{Status: envelope.StatusCompleted}

// message returns a message of size bytes (at least 12) stamped for slot.
func (l *stampedLoop) message(slot, size int) []byte {
	b := make([]byte, max(size, 12))
	binary.BigEndian.PutUint32(b[0:4], uint32(slot))
	binary.BigEndian.PutUint64(b[4:12], uint64(time.Now().UnixNano()))
	return b
}

// arrived counts the stamped message d at the end of its path.
func (l *stampedLoop) arrived(d []byte) {
	slot := binary.BigEndian.Uint32(d[0:4])
	sent := time.Unix(0, int64(binary.BigEndian.Uint64(d[4:12])))
	l.t.add(time.Since(sent), completed, nil)
	l.bar.add(1)
	if l.cfg.Rate == 0 {
		l.done[slot] <- struct{}{}
	}
	if l.got.Add(1) == int64(l.cfg.N) {
		close(l.all)
	}
}

// run publishes cfg.N messages, at cfg.Rate or in a closed loop of
// cfg.Concurrency slots, waits until they have all arrived, and returns
// what they measured.
func (l *stampedLoop) run(ctx context.Context, publish func(slot int) error) (*loopResult, error) {
	cfg := l.cfg
	var pubErr atomic.Value
	start := time.Now()
	switch {
	case cfg.Rate > 0:
		interval := time.Duration(float64(time.Second) / cfg.Rate)
		pace := newPacer(interval)
		for i := 0; i < cfg.N && ctx.Err() == nil; i++ {
			pace.wait(start.Add(time.Duration(i) * interval))
			go func() {
				if err := publish(0); err != nil {
					pubErr.Store(err)
				}
			}()
		}
	default:
		var next atomic.Int64
		var wg sync.WaitGroup
		for slot := range min(len(l.done), cfg.N) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(cfg.N) && ctx.Err() == nil {
					if err := publish(slot); err != nil {
						pubErr.Store(err)
						return
					}
					select {
					case <-l.done[slot]:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	if err, _ := pubErr.Load().(error); err != nil {
		return nil, err
	}
	select {
	case <-l.all:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return l.t.result(time.Since(start)), nil
}
