package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/kvwatch"
	"github.com/capstan-dev/capstan/internal/oplog"
)

// Watcher is a worker's copy of the policy set in force, kept current by one
// watcher of the bucket's current key (oplog.Follower). Load is the set in
// force: nil when none is.
type Watcher = oplog.Copy[Set]

// Watch reads which set is in force, loads it, and follows the changes until
// ctx ends. A version that cannot be loaded or compiled is in force all the
// same, broken: every call it decides fails closed. One that could not be
// read is read again, from 1 s apart to 30 s, until it is put in force or
// another change comes.
func Watch(ctx context.Context, js jetstream.JetStream, n broker.Names, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &loader{ctx: ctx, js: js, names: n, log: log}
	return oplog.FollowCopy(ctx, js, n.PoliciesBucket(), currentKey, log, l.apply)
}

// loader loads the versions the current key names.
type loader struct {
	ctx   context.Context
	js    jetstream.JetStream
	names broker.Names
	log   *slog.Logger

	mu     sync.Mutex
	change int // the changes of the current key applied: a read again stores nothing once another came
}

// apply loads the version the current key names.
func (l *loader) apply(set *atomic.Pointer[Set], e jetstream.KeyValueEntry) {
	if from, err := kvwatch.Forged(l.ctx, l.js.Conn(), l.names.PoliciesBucket(), e); from != "" {
		// Not an admin's: the set in force stands, and with none, every
		// call fails closed.
		l.log.Error("policy change not honoured: no admin put it", "stored by", from)
		if set.Load() == nil {
			set.Store(Broken(0, fmt.Errorf("the policies in force were stored by %s, not put by an admin", from)))
		}
		return
	} else if err != nil {
		l.log.Warn("policy change applied unchecked: its stored message could not be read", "err", err)
	}
	l.mu.Lock()
	l.change++
	change := l.change
	l.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		set.Store(nil)
		return
	}
	var cur Current
	err := json.Unmarshal(e.Value(), &cur)
	if err == nil {
		// Written by another version, it may mean what this one cannot read.
		err = envelope.CheckVersion(cur.V)
	}
	if err != nil {
		l.log.Error("the policies in force do not decode: every call fails closed", "err", err)
		set.Store(Broken(0, err))
		return
	}
	if cur.Version == 0 {
		if set.Swap(nil) != nil {
			l.log.Warn("policy set removed: calls are decided without Cedar policies", "by", cur.By, "reason", cur.Reason)
		}
		return
	}
	v, err := l.read(cur, 30*time.Second)
	install(set, cur, v, err, l.log)
	if err != nil {
		go l.readAgain(set, cur, change)
	}
}

// install puts version v of cur in force, compiled, or broken when it was
// not read (err) or does not compile: every call then fails closed.
func install(set *atomic.Pointer[Set], cur Current, v *Version, err error, log *slog.Logger) {
	var s *Set
	if err == nil {
		s, err = compileVersion(cur, v)
	}
	if err != nil {
		log.Error("policy set not loaded: every call fails closed until one is", "version", cur.Version, "err", err)
		s = Broken(cur.Version, err)
	} else {
		log.Info("policy set in force", "version", cur.Version, "rules", s.Rules(), "sha256", s.SHA256, "by", cur.By)
	}
	set.Store(s)
}

// readAgain reads version cur.Version again until it is read, then puts
// it in force, unless another change of the current key than the change-th
// came meanwhile.
func (l *loader) readAgain(set *atomic.Pointer[Set], cur Current, change int) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(wait):
		}
		v, err := l.read(cur, wait)
		l.mu.Lock()
		if l.change != change {
			l.mu.Unlock()
			return
		}
		if err == nil {
			install(set, cur, v, nil, l.log)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// read reads version cur.Version, trying for at most within.
func (l *loader) read(cur Current, within time.Duration) (*Version, error) {
	var v *Version
	ctx, cancel := context.WithTimeout(l.ctx, within)
	defer cancel()
	err := oplog.Retry(ctx, func(ctx context.Context) error {
		kv, err := l.js.KeyValue(ctx, l.names.PoliciesBucket())
		if err != nil {
			return err
		}
		v, err = ReadVersion(ctx, l.js.Conn(), kv, cur.Version)
		return err
	})
	return v, err
}

// compileVersion compiles version v, checking it is the text cur names.
func compileVersion(cur Current, v *Version) (*Set, error) {
	s, err := Compile(fmt.Sprintf("v%d", v.Version), []byte(v.Text))
	if err != nil {
		return nil, err
	}
	if s.SHA256 != cur.SHA256 {
		return nil, fmt.Errorf("v%d's text has hash %s, the set in force names %s", v.Version, s.SHA256, cur.SHA256)
	}
	s.Version = v.Version
	return s, nil
}

// Fixed is a copy that holds s for ever and follows no bucket: what a
// worker's stages see, for benchmarks and tests without a server.
func Fixed(s *Set) *Watcher { return oplog.Fixed(s) }
