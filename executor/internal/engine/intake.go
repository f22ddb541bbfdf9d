package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// unroutedSlots is how many deliveries of the unrouted consumers a worker
// handles at once, over every queue.
const unroutedSlots = 4

// intake pulls deliveries from every queue it is given, one loop per
// consumer, and hands each to a handler once the loop's turn for a slot
// comes (turns.go): the pools' deliveries share the worker's concurrency,
// the unrouted ones a few slots of their own. A handler is a goroutine that
// takes the next delivery once it is done with one: no more of them than
// slots, each keeping the stack a delivery grew, where a goroutine of its
// own per delivery grew one afresh every time. On shutdown it drains.
type intake struct {
	log *slog.Logger
	// handle carries one delivery through the engine; unrouted says it
	// came from an unrouted consumer.
	handle                   func(msg jetstream.Msg, unrouted bool)
	poolTurns, unroutedTurns *turns
	batch                    int
	// loops counts the pull loops, handling the deliveries being handled.
	loops, handling sync.WaitGroup
	// work hands a delivery to a handler waiting for one; closed once the
	// loops are done, which ends the handlers.
	work      chan handOff
	closeWork sync.Once

	mu sync.Mutex
	// queues names the queues pulled from, and whose each is ("" for the
	// shared exec stream).
	queues map[string]string
	iters  []jetstream.MessagesContext
}

// open readies the intake: concurrency pool deliveries at once, each
// handed to handle.
func (in *intake) open(concurrency int, handle func(msg jetstream.Msg, unrouted bool)) {
	in.handle, in.batch, in.work = handle, concurrency, make(chan handOff)
	in.poolTurns, in.unroutedTurns = newTurns(concurrency), newTurns(unroutedSlots)
	in.mu.Lock()
	in.queues = map[string]string{}
	in.mu.Unlock()
}

// pulls reports whether the queue named name is pulled from.
func (in *intake) pulls(name string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	_, ok := in.queues[name]
	return ok
}

// servesOther reports whether a queue of a principal other than p is
// pulled from: one that may send at any moment (fairShare).
func (in *intake) servesOther(p string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, q := range in.queues {
		if q != "" && q != p {
			return true
		}
	}
	return false
}

// pull starts pulling from q, unless it is pulled from already.
func (in *intake) pull(q Queue) error {
	in.mu.Lock()
	if _, ok := in.queues[q.Name]; ok {
		in.mu.Unlock()
		return nil
	}
	in.queues[q.Name] = q.Principal
	in.mu.Unlock()
	pool, err := q.Pool.Messages(jetstream.PullMaxMessages(in.batch), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		in.forget(q.Name)
		return fmt.Errorf("capstan: pull from %s of %s: %w", q.Pool.CachedInfo().Name, q.Name, err)
	}
	unrouted, err := q.Unrouted.Messages(jetstream.PullMaxMessages(unroutedSlots), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		pool.Stop()
		in.forget(q.Name)
		return fmt.Errorf("capstan: pull from %s of %s: %w", q.Unrouted.CachedInfo().Name, q.Name, err)
	}
	in.mu.Lock()
	in.iters = append(in.iters, pool, unrouted)
	in.mu.Unlock()
	in.loops.Add(2)
	go func() {
		defer in.loops.Done()
		if in.loop(q.Name, pool, in.poolTurns, false) {
			// Its pool's consumer is gone: the queue is pulled again once
			// found again.
			unrouted.Stop()
		}
		in.forget(q.Name)
	}()
	go func() {
		defer in.loops.Done()
		in.loop(q.Name, unrouted, in.unroutedTurns, true)
	}()
	return nil
}

// loop hands each delivery of it to the handler once the loop's turn for a
// slot comes, until it is closed or its consumer deleted (then deleted is
// true).
func (in *intake) loop(queue string, it jetstream.MessagesContext, slots *turns, unrouted bool) (deleted bool) {
	wake := make(chan struct{}, 1)
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return false
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) {
				in.log.Warn("consumer deleted: its queue is let go", "queue", queue, "err", err)
				it.Stop()
				return true
			}
			in.log.Warn("pull failed", "queue", queue, "err", err)
			time.Sleep(100 * time.Millisecond) // a consumer electing a leader fails fast
			continue
		}
		// Holding one delivery, the loop waits for its turn: the other
		// queues' loops that wait already go first.
		slots.take(wake)
		in.handling.Add(1)
		d := handOff{msg: msg, unrouted: unrouted, slots: slots}
		select {
		case in.work <- d: // a handler was waiting
		default:
			go in.handler(d)
		}
	}
}

// handOff is a delivery handed to a handler, with the slots it holds one
// of.
type handOff struct {
	msg      jetstream.Msg
	unrouted bool
	slots    *turns
}

// handler handles d, then every delivery handed to it, until the work ends.
func (in *intake) handler(d handOff) {
	for ok := true; ok; d, ok = <-in.work {
		in.handle(d.msg, d.unrouted)
		d.slots.give()
		in.handling.Done()
	}
}

// endWork ends the handlers waiting for a delivery, once no loop hands one.
func (in *intake) endWork() { in.closeWork.Do(func() { close(in.work) }) }

// forget ends the record that queue is pulled from.
func (in *intake) forget(queue string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.queues, queue)
}

// stop ends every loop at once: a start that failed.
func (in *intake) stop() {
	in.mu.Lock()
	for _, it := range in.iters {
		it.Stop()
	}
	in.mu.Unlock()
	in.loops.Wait()
	in.endWork()
}

// drain stops pulling, hands out what was already buffered, and waits for
// every handler to return; once grace has passed it calls abandon, and
// waits all the same.
func (in *intake) drain(grace time.Duration, abandon func()) {
	in.mu.Lock()
	for _, it := range in.iters {
		it.Drain()
	}
	in.mu.Unlock()
	done := make(chan struct{})
	go func() { in.loops.Wait(); in.endWork(); in.handling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		abandon()
		<-done
	}
}
