package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
)

// Watcher is a worker's copy of the policy set in force, kept current by one
// watcher of the bucket's current key (oplog.Follower). Load is the set in
// force: nil when none is.
type Watcher = oplog.Copy[Set]

// Watch reads which set is in force, loads it, and follows the changes until
// ctx ends. A version that cannot be loaded or compiled is in force all the
// same, broken: every call it decides fails closed.
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
}

// apply loads the version the current key names.
func (l *loader) apply(set *atomic.Pointer[Set], e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		set.Store(nil)
		return
	}
	var cur Current
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
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
	s, err := l.load(cur)
	if err != nil {
		l.log.Error("policy set not loaded: every call fails closed until one is", "version", cur.Version, "err", err)
		s = Broken(cur.Version, err)
	} else {
		l.log.Info("policy set in force", "version", cur.Version, "rules", s.Rules(), "sha256", s.SHA256, "by", cur.By)
	}
	set.Store(s)
}

// load reads and compiles version cur.Version, checking it is the text cur
// names.
func (l *loader) load(cur Current) (*Set, error) {
	var v *Version
	ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
	defer cancel()
	if err := oplog.Retry(ctx, func(ctx context.Context) error {
		kv, err := l.js.KeyValue(ctx, l.names.PoliciesBucket())
		if err != nil {
			return err
		}
		v, err = ReadVersion(ctx, l.js.Conn(), kv, cur.Version)
		return err
	}); err != nil {
		return nil, err
	}
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
