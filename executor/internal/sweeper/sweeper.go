package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor/internal/engine"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
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
	// Listed reports whether the catalog lists a capability now (as
	// engine.Config.Listed): a request on a subject no consumer covers,
	// of a capability it does not list, is ended at once. Nil: none is
	// ended so.
	Listed func(id string) (bool, error)
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
// by their deadline, and frees the limits' slots of executions gone
// (Runner.SweepSlots), while this sweeper holds the sweeping lease.
func (s *Sweeper) Run(ctx context.Context, every time.Duration) {
	token := uuid.NewString()
	t := time.NewTicker(every)
	defer t.Stop()
	defer s.release(token)
	for ctx.Err() == nil {
		if s.hold(ctx, token, 3*every) {
			if n, err := s.Pass(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("sweep failed", "err", err)
			} else if n > 0 {
				s.cfg.Log.Info("swept requests that never started", "ended", n)
			}
			if n, err := s.eng.SweepSlots(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("sweep of the limits' slots failed", "err", err)
			} else if n > 0 {
				s.cfg.Log.Info("freed the slots of executions gone", "freed", n)
			}
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// hold takes or renews the sweeping lease for token, and reports whether
// this sweeper holds it. A write begun finishes although ctx ends, so that
// the release that follows reads it: one cut short by the client could
// still land after the release, and hold the duty for three intervals.
func (s *Sweeper) hold(ctx context.Context, token string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
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

// Pass walks every queue once (DESIGN §13) and ends every request past its
// deadline that no live lease holds, every request no worker will ever be
// given (on a subject no consumer covers, of a capability the catalog does
// not list) and every message that is no request; it returns how many it
// ended.
func (s *Sweeper) Pass(ctx context.Context) (int, error) {
	queues, err := s.b.Queues(ctx)
	if err != nil {
		return 0, err
	}
	ended, errs := 0, []error(nil)
	for _, q := range queues {
		n, err := s.passQueue(ctx, q)
		ended += n
		if err != nil {
			errs = append(errs, fmt.Errorf("queue %s: %w", q.Name, err))
		}
	}
	return ended, errors.Join(errs...)
}

// passQueue walks one queue.
func (s *Sweeper) passQueue(ctx context.Context, q broker.Queue) (int, error) {
	info := q.Stream.CachedInfo()
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 || last < first {
		return 0, nil
	}
	reach, err := s.consumerReach(ctx, q)
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
			n, err := s.walk(ctx, q, reach, from, to)
			ended.Add(int64(n))
			errs[i] = err
		}()
	}
	wg.Wait()
	return int(ended.Load()), errors.Join(errs...)
}

// walk reads the queue's requests stored from sequence from to to.
func (s *Sweeper) walk(ctx context.Context, q broker.Queue, reach []consumerReach, from, to uint64) (int, error) {
	ended := 0
	subjects := s.b.Names.ExecSubjects()
	for seq := from; seq <= to; {
		getCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := q.Stream.GetMsg(getCtx, seq, jetstream.WithGetMsgSubject(subjects))
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
		if s.sweep(ctx, q, reach, m) {
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

// consumerReach reads the queue's consumers, before a pass: a request
// delivered after it is claimed by the worker it went to, whose create-only
// record and the sweeper's are one write against the other.
func (s *Sweeper) consumerReach(ctx context.Context, q broker.Queue) ([]consumerReach, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list := q.Stream.ListConsumers(ctx)
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

// covered reports whether a consumer's filter takes subject: some worker is
// given what is stored there.
func covered(reach []consumerReach, subject string) bool {
	for _, c := range reach {
		for _, f := range c.filters {
			if broker.SubjectMatches(subject, f) {
				return true
			}
		}
	}
	return false
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
func (s *Sweeper) sweep(ctx context.Context, q broker.Queue, reach []consumerReach, m *jetstream.RawStreamMsg) bool {
	principal, capID, ok := s.b.Names.ParseExecSubject(m.Subject)
	if !ok {
		principal = broker.Anonymous
	}
	req, err := envelope.DecodeRequest(m.Data)
	if err != nil {
		// No request, and never one: ended (INPUT_INVALID, when its message
		// id names an execution) and removed, whoever would be given it.
		if s.eng.EndUndecodable(principal, capID, m.Header.Get(nats.MsgIdHdr), err) {
			s.remove(ctx, q, m.Sequence)
			return true
		}
		return false
	}
	if s.unserved(reach, m, capID) {
		if ended, decided := s.endUnserved(ctx, q, m, req, principal, capID); decided {
			return ended
		}
	}
	now := s.cfg.Now()
	f := Facts{StartDeadline: engine.StartDeadline(m.Time, req.StartBy, s.b.Config.RecordTTL),
		TTLDeadline: engine.TTLDeadline(m.Time, s.b.Config.RecordTTL), Now: now}
	if !Due(f) {
		return false
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
		s.remove(ctx, q, m.Sequence)
	case EndUnrun:
		if s.eng.EndUnrun(req, principal, a.Err) {
			s.swept.Add(1)
			s.remove(ctx, q, m.Sequence)
			return true
		}
	case Restore:
		if s.eng.RestoreEnvelope(req, principal, rec) {
			s.remove(ctx, q, m.Sequence)
		}
	case End:
		if s.eng.EndTaken(ctx, req, principal, rec, rev, a.Err, a.Attempts) {
			s.swept.Add(1)
			s.remove(ctx, q, m.Sequence)
			return true
		}
	}
	return false
}

// unserved reports whether no worker will ever be given m: a request on a
// subject no consumer of its queue covers, never delivered, of a capability
// the catalog does not list now (nor does any pool that is down: a listed
// capability's requests wait for their pool until their start deadline).
// Requests sent to the unrouted subject wait for its consumer.
func (s *Sweeper) unserved(reach []consumerReach, m *jetstream.RawStreamMsg, capID string) bool {
	if s.cfg.Listed == nil || capID == broker.Unrouted || covered(reach, m.Subject) || everDelivered(reach, m.Subject, m.Sequence) {
		return false
	}
	if envelope.ValidCapabilityID(capID) != nil {
		return true // no capability is named so: nothing will ever list it
	}
	listed, err := s.cfg.Listed(capID)
	return err == nil && !listed
}

// endUnserved ends a request no worker will be given: CAPABILITY_NOT_FOUND,
// as a worker would end it, unless something ended it already. decided is
// false when its execution has a record, which the table decides from.
func (s *Sweeper) endUnserved(ctx context.Context, q broker.Queue, m *jetstream.RawStreamMsg, req *envelope.Request,
	principal, capID string) (ended, decided bool) {
	_, _, err := s.eng.Record(principal, req.ExecutionID)
	switch {
	case err == nil:
		return false, false
	case !errors.Is(err, broker.ErrNotFound):
		return false, true // the store did not answer: the next pass
	}
	switch s.eng.Envelope(principal, req.ExecutionID) {
	case engine.EnvelopePresent, engine.EnvelopeUndecodable:
		s.remove(ctx, q, m.Sequence)
		return false, true
	case engine.EnvelopeAbsent:
	default:
		return false, true
	}
	// The subject's capability is the one no worker serves: the body's
	// may name another, which no worker would take from it either.
	unserved := *req
	unserved.CapabilityID = capID
	if !s.eng.EndRefused(&unserved, principal, engine.NotFoundError(), "unserved") {
		return false, true
	}
	s.swept.Add(1)
	s.remove(ctx, q, m.Sequence)
	return true, true
}

// remove removes a request the sweeper ended from its queue. Credentials
// that may not delete stream messages leave it: then a pool's worker that
// receives it finds the envelope and acknowledges it, or JetStream drops it
// at the record TTL.
func (s *Sweeper) remove(ctx context.Context, q broker.Queue, seq uint64) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := q.Stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		s.cfg.Log.Debug("swept request left in the stream", "stream", q.Name, "seq", seq, "err", err)
	}
}
