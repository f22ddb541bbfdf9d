package trail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/tlog"
)

// Msg is one stored audit message.
type Msg struct {
	Seq     uint64      `json:"seq"`
	Subject string      `json:"subject"`
	Header  nats.Header `json:"header,omitempty"`
	Data    []byte      `json:"data"`
	// Time is when the stream stored it; it is not part of the leaf.
	Time time.Time `json:"time"`
}

// Leaf is the message's leaf hash.
func (m *Msg) Leaf() tlog.Hash { return LeafHash(m.Subject, m.Header, m.Data) }

// Execution is the execution the message names in its header ("" for none).
func (m *Msg) Execution() string {
	if k := m.Header.Get(broker.AuditExecutionHeader); k != "" {
		return k
	}
	return m.Header.Get(broker.LegacyAuditExecutionHeader)
}

// StreamState is what a verifier needs of the audit stream.
type StreamState struct {
	Name string `json:"name"`
	// FirstSeq and LastSeq are the first and last sequences it holds; an
	// empty stream has FirstSeq == LastSeq+1.
	FirstSeq uint64 `json:"firstSeq"`
	LastSeq  uint64 `json:"lastSeq"`
	// MaxAge is its age limit (0: none).
	MaxAge time.Duration `json:"maxAge"`
}

// Source is where a verifier reads a log: a running deployment
// (FromDeployment) or an exported bundle (ReadBundle).
type Source interface {
	// Stream describes the audit stream.
	Stream(ctx context.Context) (StreamState, error)
	// Checkpoints calls fn with every stored signed checkpoint, in the order
	// they were stored, until fn returns an error.
	Checkpoints(ctx context.Context, fn func(signed []byte) error) error
	// Tile returns the stored hashes of tile (level, n), as many as stored
	// (a tile grows to 256); ErrNoTile when none is.
	Tile(ctx context.Context, level int, n int64) ([]byte, error)
	// Messages calls fn with every message from sequence from on, in order,
	// up to the last the stream held when it was called, or until fn
	// returns an error.
	Messages(ctx context.Context, from uint64, fn func(*Msg) error) error
}

// ErrNoTile is returned for a tile that is not stored.
var ErrNoTile = errors.New("tile not stored")

// ErrNoLog is returned when the deployment has no trail resources or no
// checkpoint yet: no checkpointer has run.
var ErrNoLog = errors.New("no checkpoint yet: no checkpointer has run (run 'capstan server' with an audit key, or 'capstan audit checkpointer')")

// tileKey is the trail bucket's key of tile (level, n): the tlog-tiles
// path of the full tile, which holds the partial tile's hashes while it
// grows.
func tileKey(level int, n int64) string {
	return tlog.Tile{H: TileHeight, L: level, N: n, W: tileWidth}.Path()
}

// deployment reads a log from a running deployment.
type deployment struct {
	b *broker.Broker
}

// FromDeployment reads the log of the deployment b is opened on
// (broker.OpenAll: an admin's or an open server's connection).
func FromDeployment(b *broker.Broker) Source { return &deployment{b: b} }

func (d *deployment) ready() error {
	if d.b.Trail == nil || d.b.Checkpoints == nil || d.b.Audit == nil {
		return ErrNoLog
	}
	return nil
}

func (d *deployment) Stream(ctx context.Context) (StreamState, error) {
	if d.b.Audit == nil {
		return StreamState{}, ErrNoLog
	}
	info, err := d.b.Audit.Info(ctx)
	if err != nil {
		return StreamState{}, err
	}
	return stateOf(info), nil
}

func stateOf(info *jetstream.StreamInfo) StreamState {
	st := StreamState{Name: info.Config.Name, FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, MaxAge: info.Config.MaxAge}
	if info.State.Msgs == 0 {
		st.FirstSeq = st.LastSeq + 1
	}
	return st
}

func (d *deployment) Checkpoints(ctx context.Context, fn func([]byte) error) error {
	if err := d.ready(); err != nil {
		return err
	}
	return readAll(ctx, d.b.JS, d.b.Names.CheckpointStream(), 1, func(m *Msg) error { return fn(m.Data) })
}

func (d *deployment) Tile(ctx context.Context, level int, n int64) ([]byte, error) {
	if d.b.Trail == nil {
		return nil, ErrNoLog
	}
	e, err := d.b.Trail.Get(ctx, tileKey(level, n))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, ErrNoTile
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

func (d *deployment) Messages(ctx context.Context, from uint64, fn func(*Msg) error) error {
	if d.b.Audit == nil {
		return ErrNoLog
	}
	return readAll(ctx, d.b.JS, d.b.Names.AuditStream(), from, fn)
}

// readAll reads stream from sequence from up to its last message as of
// now, in order.
func readAll(ctx context.Context, js jetstream.JetStream, stream string, from uint64, fn func(*Msg) error) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	last := s.CachedInfo().State.LastSeq
	if last < from || s.CachedInfo().State.Msgs == 0 {
		return nil
	}
	r := newReader(s, from)
	defer r.close()
	for try := 0; ; {
		msgs, err := r.fetch(ctx, 1000)
		if err == nil && len(msgs) == 0 && r.cons != nil {
			// Nothing delivered: the end when the consumer has nothing
			// more to deliver (the messages up to last gone meanwhile, to
			// retention); otherwise the server was slow to answer (a pull
			// that times out delivers nothing too), and it is asked again.
			var info *jetstream.ConsumerInfo
			if info, err = r.cons.Info(ctx); err == nil && info.NumPending == 0 {
				return nil
			}
		}
		if err != nil {
			if !broker.Unreachable(err) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return err
			}
			// The reading consumer's server gone, or its stream electing a
			// leader (a cluster that lost a node): read again, from the
			// first message not handed out, once it answers.
			r.close()
			select {
			case <-ctx.Done():
				return fmt.Errorf("capstan: read %s: %w", stream, err)
			case <-time.After(broker.Backoff(try)):
			}
			try++
			continue
		}
		try = 0
		for _, m := range msgs {
			if err := fn(m); err != nil {
				return err
			}
			if m.Seq >= last {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// tileReader serves a Source's tiles to tlog, cut to the width asked for:
// a stored tile holds every hash of the narrower ones of the same place.
type tileReader struct {
	ctx   context.Context
	src   Source
	cache map[[2]int64][]byte
}

func newTileReader(ctx context.Context, src Source) *tileReader {
	return &tileReader{ctx: ctx, src: src, cache: map[[2]int64][]byte{}}
}

func (r *tileReader) Height() int { return TileHeight }

func (r *tileReader) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		data, err := r.read(t.L, t.N)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Path(), err)
		}
		if len(data) < t.W*tlog.HashSize {
			return nil, fmt.Errorf("%s: %w: %d hashes stored", t.Path(), ErrNoTile, len(data)/tlog.HashSize)
		}
		out[i] = data[:t.W*tlog.HashSize]
	}
	return out, nil
}

func (r *tileReader) read(level int, n int64) ([]byte, error) {
	k := [2]int64{int64(level), n}
	if d, ok := r.cache[k]; ok {
		return d, nil
	}
	d, err := r.src.Tile(r.ctx, level, n)
	if err != nil {
		return nil, err
	}
	if len(r.cache) > 4096 {
		clear(r.cache)
	}
	r.cache[k] = d
	return d, nil
}

func (r *tileReader) SaveTiles([]tlog.Tile, [][]byte) {}
