package sweeper

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// sweeperKey is the sweeping lease's key in the pools bucket.
const sweeperKey = "_sweeper"

// sweepWalkers is how many ranges of the stream a pass walks at once: each
// read is a round trip, so a pass over a long backlog is bound by latency.
const sweepWalkers = 8

// lease is who holds the sweeping duty, until when.
type lease struct {
	V      int       `json:"v"`
	Holder string    `json:"holder"`
	Worker string    `json:"worker"`
	Until  time.Time `json:"until"`
}

// Config configures a Sweeper.
type Config struct {
	// Worker names the worker in the sweeping lease.
	Worker string
	// Log receives what the sweeper does.
	Log *slog.Logger
	// Now is the sweeper's clock (default time.Now).
	Now func() time.Time
}

// Sweeper ends the requests no worker started by their deadline, for one
// worker, through its engine.
type Sweeper struct {
	b     *broker.Broker
	eng   *engine.Runner
	cfg   Config
	swept atomic.Uint64
}

// New returns the sweeper of a worker whose engine is eng, on b.
func New(b *broker.Broker, eng *engine.Runner, cfg Config) *Sweeper {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{b: b, eng: eng, cfg: cfg}
}

// Swept counts the requests this sweeper ended.
func (s *Sweeper) Swept() uint64 { return s.swept.Load() }

// Run ends, every interval while ctx lasts, the requests no worker started
// by their deadline, while this sweeper holds the sweeping lease.
func (s *Sweeper) Run(ctx context.Context, every time.Duration) {
	token := uuid.NewString()
	t := time.NewTicker(every)
	defer t.Stop()
	defer s.release(token)
	for {
		if s.hold(ctx, token, 3*every) {
			if n, err := s.Pass(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("sweep failed", "err", err)
			} else if n > 0 {
				s.cfg.Log.Info("swept requests that never started", "ended", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// hold takes or renews the sweeping lease for token, and reports whether
// this sweeper holds it.
func (s *Sweeper) hold(ctx context.Context, token string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := s.cfg.Now().UTC()
	mine := &lease{V: envelope.Version, Holder: token, Worker: s.cfg.Worker, Until: now.Add(d)}
	cur, rev, err := broker.Load[lease](ctx, s.b.Pools, sweeperKey)
	switch {
	case errors.Is(err, broker.ErrNotFound):
		_, err = broker.Create(ctx, s.b.Pools, sweeperKey, mine)
		return err == nil
	case err != nil:
		return false
	case cur.Holder != token && now.Before(cur.Until):
		return false
	}
	_, err = broker.Update(ctx, s.b.Pools, sweeperKey, mine, rev)
	return err == nil
}

// release ends the lease now if token holds it, so that another worker
// takes the duty at its next pass rather than after the lease.
func (s *Sweeper) release(token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, rev, err := broker.Load[lease](ctx, s.b.Pools, sweeperKey)
	if err != nil || cur.Holder != token {
		return
	}
	cur.Until = s.cfg.Now().UTC()
	_, _ = broker.Update(ctx, s.b.Pools, sweeperKey, cur, rev)
}

// Pass walks the exec stream once and ends every request past its deadline
// that no live lease holds; it returns how many it ended.
func (s *Sweeper) Pass(ctx context.Context) (int, error) {
	info, err := s.b.Exec.Info(ctx)
	if err != nil {
		return 0, err
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 || last < first {
		return 0, nil
	}
	reach, err := s.consumerReach(ctx)
	if err != nil {
		return 0, err
	}
	span := (last - first + sweepWalkers) / sweepWalkers
	var (
		wg    sync.WaitGroup
		ended atomic.Int64
		errs  = make([]error, sweepWalkers)
	)
	for i := range uint64(sweepWalkers) {
		from := first + i*span
		if from > last {
			break
		}
		to := min(from+span-1, last)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := s.walk(ctx, reach, from, to)
			ended.Add(int64(n))
			errs[i] = err
		}()
	}
	wg.Wait()
	return int(ended.Load()), errors.Join(errs...)
}

// walk reads the stream's requests stored from sequence from to to.
func (s *Sweeper) walk(ctx context.Context, reach []consumerReach, from, to uint64) (int, error) {
	ended := 0
	subjects := s.b.Names.ExecSubjects()
	for seq := from; seq <= to; {
		getCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := s.b.Exec.GetMsg(getCtx, seq, jetstream.WithGetMsgSubject(subjects))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ended, nil
		}
		if err != nil {
			return ended, err
		}
		if m.Sequence > to {
			return ended, nil
		}
		seq = m.Sequence + 1
		if s.sweep(ctx, reach, m) {
			ended++
		}
	}
	return ended, nil
}

// consumerReach is one consumer of the exec stream as a pass found it: its
// filters and the last stream sequence it delivered. A request at or below
// it, on a subject it filters, has been delivered at least once.
type consumerReach struct {
	filters   []string
	delivered uint64
}

// consumerReach reads the exec stream's consumers, before a pass: a request
// delivered after it is claimed by the worker it went to, whose create-only
// record and the sweeper's are one write against the other.
func (s *Sweeper) consumerReach(ctx context.Context) ([]consumerReach, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list := s.b.Exec.ListConsumers(ctx)
	var reach []consumerReach
	for info := range list.Info() {
		filters := broker.Filters(info.Config)
		if len(filters) == 0 {
			filters = []string{">"}
		}
		reach = append(reach, consumerReach{filters: filters, delivered: info.Delivered.Stream})
	}
	return reach, list.Err()
}

// everDelivered reports whether a consumer has delivered the request stored
// at seq on subject.
func everDelivered(reach []consumerReach, subject string, seq uint64) bool {
	for _, c := range reach {
		if seq > c.delivered {
			continue
		}
		for _, f := range c.filters {
			if broker.SubjectMatches(subject, f) {
				return true
			}
		}
	}
	return false
}

// sweep ends one stored request if the table says so; it reports whether it
// ended it.
func (s *Sweeper) sweep(ctx context.Context, reach []consumerReach, m *jetstream.RawStreamMsg) bool {
	req, err := envelope.DecodeRequest(m.Data)
	if err != nil {
		return false // a pool's worker terminates it; else JetStream drops it at the TTL
	}
	now := s.cfg.Now()
	f := Facts{StartDeadline: engine.StartDeadline(m.Time, req.StartBy, s.b.Config.RecordTTL),
		TTLDeadline: engine.TTLDeadline(m.Time, s.b.Config.RecordTTL), Now: now}
	if !Due(f) {
		return false
	}
	principal, _, ok := s.b.Names.ParseExecSubject(m.Subject)
	if !ok {
		principal = broker.Anonymous
	}
	rec, rev, err := s.eng.Record(principal, req.ExecutionID)
	switch {
	case errors.Is(err, broker.ErrNotFound):
		f.Envelope = s.eng.Envelope(principal, req.ExecutionID)
		f.AbsenceProves = f.Envelope == engine.EnvelopeAbsent && engine.AbsenceProves(req.ExecutionID, m.Time,
			!everDelivered(reach, m.Subject, m.Sequence), now, s.b.Config.RecordWindow)
	case err != nil:
		return false
	default:
		f.Record = rec
	}
	switch a := Decide(f); a.Do {
	case Remove:
		s.remove(ctx, m.Sequence)
	case EndUnrun:
		if s.eng.EndUnrun(req, principal, a.Err) {
			s.swept.Add(1)
			s.remove(ctx, m.Sequence)
			return true
		}
	case Restore:
		if s.eng.RestoreEnvelope(req, principal, rec) {
			s.remove(ctx, m.Sequence)
		}
	case End:
		if s.eng.EndTaken(ctx, req, principal, rec, rev, a.Err, a.Attempts) {
			s.swept.Add(1)
			s.remove(ctx, m.Sequence)
			return true
		}
	}
	return false
}

// remove removes a request the sweeper ended from the stream. Workers'
// credentials may not allow it: then a pool's worker that receives it finds
// the envelope and acknowledges it, or JetStream drops it at the record TTL.
func (s *Sweeper) remove(ctx context.Context, seq uint64) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.b.Exec.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		s.cfg.Log.Debug("swept request left in the stream", "seq", seq, "err", err)
	}
}
