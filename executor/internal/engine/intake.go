package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// intake pulls deliveries from JetStream consumers, at most a batch of each
// consumer in hand at once, and hands each to its handler on a goroutine of
// its own; on shutdown it drains.
type intake struct {
	log   *slog.Logger
	iters []jetstream.MessagesContext
	// pulling counts the pull loops, handling the handlers running.
	pulling, handling sync.WaitGroup
}

// pull starts pulling from c, batch deliveries in hand at once, handing
// each to handle.
func (in *intake) pull(c jetstream.Consumer, batch int, handle func(jetstream.Msg)) error {
	it, err := c.Messages(jetstream.PullMaxMessages(batch), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("capstan: pull from %s: %w", c.CachedInfo().Name, err)
	}
	in.iters = append(in.iters, it)
	in.pulling.Add(1)
	go in.loop(it, make(chan struct{}, batch), handle)
	return nil
}

// loop hands out it's deliveries, one slot of sem each, until it is closed.
func (in *intake) loop(it jetstream.MessagesContext, sem chan struct{}, handle func(jetstream.Msg)) {
	defer in.pulling.Done()
	for {
		sem <- struct{}{}
		msg, err := it.Next()
		if err != nil {
			<-sem
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			in.log.Warn("pull failed", "err", err)
			time.Sleep(100 * time.Millisecond) // a consumer electing a leader fails fast
			continue
		}
		in.handling.Add(1)
		go func() {
			defer func() { <-sem; in.handling.Done() }()
			handle(msg)
		}()
	}
}

// stop ends the pulls at once: a start that failed.
func (in *intake) stop() {
	for _, it := range in.iters {
		it.Stop()
	}
}

// drain stops pulling, hands out what was already buffered, and waits for
// every handler to return; once grace has passed it calls abandon, and
// waits all the same.
func (in *intake) drain(grace time.Duration, abandon func()) {
	for _, it := range in.iters {
		it.Drain()
	}
	done := make(chan struct{})
	go func() { in.pulling.Wait(); in.handling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		abandon()
		<-done
	}
}
