package delivery

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// The sweeper ends the requests no worker will take (DESIGN §13): a request
// for a capability no pool serves, whose pool is down, or stored on a subject
// no consumer's filter covers. A work-queue stream refuses a consumer that
// overlaps the pools' filters, so the sweeper reads the exec stream message
// by message (a stream "get next by subject" from the first sequence, no
// consumer) and acts only on requests past their deadline, with no live
// lease on their record:
//
//	no record, or claimed (the handler never started) -> failed / NOT_STARTED
//	no record, where that proves nothing (absenceProves),
//	or claimed with WORKER_LOST (a claim made so)      -> failed / OUTCOME_UNKNOWN
//	pending with a cancel                              -> cancelled / CANCELLED
//	running or backoff, past the TTL deadline          -> failed / OUTCOME_UNKNOWN
//	finalized                                          -> nothing to do
//
// It claims a record by CAS before it writes the envelope, as a worker does,
// so a worker that takes the request meanwhile and the sweeper never both
// finalize; a pool worker that later receives the request finds the envelope
// and acknowledges it. The sweeper then removes the message when its
// credentials allow it; otherwise JetStream drops it at the record TTL.
//
// One worker sweeps at a time: the duty is a lease in the pools bucket
// (sweeperKey), taken and renewed by CAS. A pass costs one stream read per
// queued request (eight ranges of the stream read at once), one consumer
// listing, and one record read per request past its deadline: none of it is
// on an execution's path.

// sweeperKey is the sweeper lease's key in the pools bucket.
const sweeperKey = "_sweeper"

// sweeperLease is who holds the sweeping duty, until when.
type sweeperLease struct {
	V      int       `json:"v"`
	Holder string    `json:"holder"`
	Worker string    `json:"worker"`
	Until  time.Time `json:"until"`
}

// Sweep ends, every interval while ctx lasts, the requests no worker
// started by their deadline, while this runner holds the sweeping lease.
func (w *Runner) Sweep(ctx context.Context, every time.Duration) {
	token := uuid.NewString()
	t := time.NewTicker(every)
	defer t.Stop()
	defer w.releaseSweepLease(token)
	for {
		if w.holdSweepLease(ctx, token, 3*every) {
			if n, err := w.SweepOnce(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn("sweep failed", "err", err)
			} else if n > 0 {
				w.log.Info("swept requests that never started", "ended", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// holdSweepLease takes or renews the sweeping lease for token, and reports
// whether this runner holds it.
func (w *Runner) holdSweepLease(ctx context.Context, token string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := time.Now().UTC()
	mine := &sweeperLease{V: envelope.Version, Holder: token, Worker: w.cfg.ID, Until: now.Add(d)}
	cur, rev, err := broker.Load[sweeperLease](ctx, w.b.Pools, sweeperKey)
	switch {
	case errors.Is(err, broker.ErrNotFound):
		_, err = broker.Create(ctx, w.b.Pools, sweeperKey, mine)
		return err == nil
	case err != nil:
		return false
	case cur.Holder != token && now.Before(cur.Until):
		return false
	}
	_, err = broker.Update(ctx, w.b.Pools, sweeperKey, mine, rev)
	return err == nil
}

// sweepWalkers is how many ranges of the stream a pass walks at once: each
// read is a round trip, so a pass over a long backlog is bound by latency.
const sweepWalkers = 8

// releaseSweepLease ends the lease now if token holds it, so that another
// worker takes the duty at its next pass rather than after the lease.
func (w *Runner) releaseSweepLease(token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, rev, err := broker.Load[sweeperLease](ctx, w.b.Pools, sweeperKey)
	if err != nil || cur.Holder != token {
		return
	}
	cur.Until = time.Now().UTC()
	_, _ = broker.Update(ctx, w.b.Pools, sweeperKey, cur, rev)
}

// SweepOnce walks the exec stream once and ends every request past its
// deadline that no live lease holds; it returns how many it ended.
func (w *Runner) SweepOnce(ctx context.Context) (int, error) {
	info, err := w.b.Exec.Info(ctx)
	if err != nil {
		return 0, err
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 || last < first {
		return 0, nil
	}
	reach, err := w.consumerReach(ctx)
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
			n, err := w.sweepRange(ctx, reach, from, to)
			ended.Add(int64(n))
			errs[i] = err
		}()
	}
	wg.Wait()
	return int(ended.Load()), errors.Join(errs...)
}

// sweepRange walks the stream's requests stored from sequence from to to.
func (w *Runner) sweepRange(ctx context.Context, reach []consumerReach, from, to uint64) (int, error) {
	ended := 0
	subjects := w.b.Names.ExecSubjects()
	for seq := from; seq <= to; {
		getCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := w.b.Exec.GetMsg(getCtx, seq, jetstream.WithGetMsgSubject(subjects))
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
		if w.sweepOne(ctx, reach, m) {
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
func (w *Runner) consumerReach(ctx context.Context) ([]consumerReach, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list := w.b.Exec.ListConsumers(ctx)
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

// sweepOne ends one stored request if it is past its deadline and nobody
// holds it; it reports whether it ended it.
func (w *Runner) sweepOne(ctx context.Context, reach []consumerReach, m *jetstream.RawStreamMsg) bool {
	req, err := envelope.DecodeRequest(m.Data)
	if err != nil {
		return false // a pool's worker terminates it; else JetStream drops it at the TTL
	}
	now := time.Now()
	if !now.After(w.startDeadline(m.Time, req)) {
		return false
	}
	principal, _, ok := w.b.Names.ParseExecSubject(m.Subject)
	if !ok {
		principal = broker.Anonymous
	}
	x := &Execution{w: w, req: req, principal: principal, key: broker.Key(principal, req.ExecutionID),
		claim: uuid.NewString(), start: now, done: make(chan struct{}), stopRenewing: make(chan struct{}),
		stopDeadline: func() {}}
	x.ctx, x.cancel = context.WithCancelCause(ctx)
	defer x.cancel(nil)
	x.hashInput()

	loadCtx, cancel := StoreContext()
	rec, rev, err := broker.Load[Record](loadCtx, w.b.Executions, x.key)
	cancel()
	switch {
	case errors.Is(err, broker.ErrNotFound):
		if have, err := x.envelope(); have != nil || err != nil {
			// Ended already (this is a copy, or its ack was lost), or not known.
			if have != nil {
				w.removeSwept(ctx, m.Sequence)
			}
			return false
		}
		env := notStartedEnvelope(req)
		if !absenceProves(req.ExecutionID, m.Time, !everDelivered(reach, m.Subject, m.Sequence), now,
			w.b.Config.RecordWindow) {
			// An attempt may have run under a record that has expired since:
			// never "it never ran".
			env = &envelope.Envelope{ExecutionID: req.ExecutionID, CapabilityID: req.CapabilityID,
				Status: envelope.StatusFailed, Error: outcomeUnknown(expiredRecordMessage).Wire()}
		}
		done, _, _ := w.finalizeWithoutRun(x, env, "")
		if done {
			w.swept.Add(1)
			w.removeSwept(ctx, m.Sequence)
		}
		return done
	case err != nil:
		return false
	case rec.State == StateFinalized:
		if w.finalizeRecorded(x, rec) {
			w.removeSwept(ctx, m.Sequence)
		}
		return false
	case rec.leaseLive(now):
		return false
	}
	var o *outcome
	attempts := rec.Attempt
	switch {
	case rec.CancelRequested:
		o = x.cancelled(envelope.CodeCancelled, "The caller cancelled the execution.")
	case rec.State == StateClaimed && rec.LastError == envelope.CodeWorkerLost:
		// Claimed where no record proved that no attempt had run.
		o = x.failedAfterRun(outcomeUnknown(expiredRecordMessage))
	case rec.State == StatePending || rec.State == StateClaimed:
		o = x.failed(NotStartedError())
	case now.After(w.ttlDeadline(m.Time)):
		// Started, and its worker lost: nothing may try it again.
		o = x.failedAfterRun(&envelope.CapabilityError{
			Code: envelope.CodeOutcomeUnknown, Stage: envelope.StageHandler, ExposeToModel: true,
			Message: "The worker running this operation was lost; it may or may not have taken effect.",
		})
	default:
		return false // a pool's worker takes it over
	}
	// Claim it, as a takeover does; a lost CAS means someone else moved.
	prev := rec.Worker
	x.rec, x.rev = rec, rev
	if err := x.update(func(r *Record) {
		r.Worker, r.Claim, r.LeaseUntil = w.cfg.ID, x.claim, time.Now().UTC().Add(w.cfg.Lease)
	}); err != nil && !errors.Is(err, errCancelRequested) {
		return false
	}
	if rec.State == StatePending {
		x.emit(audit.Requested, nil)
	} else {
		x.emit(audit.TakenOver, map[string]any{"fromWorker": prev, "state": string(rec.State), "attempt": attempts})
	}
	if !x.finalizeSwept(o, attempts) {
		return false
	}
	w.swept.Add(1)
	w.removeSwept(ctx, m.Sequence)
	return true
}

// finalizeSwept is finalize without a delivery to acknowledge.
func (x *Execution) finalizeSwept(o *outcome, attempts int) bool {
	env := o.env
	env.V, env.ExecutionID, env.CapabilityID = envelope.Version, x.req.ExecutionID, x.req.CapabilityID
	env.Attempts, env.FinalizedBy, env.FinalizedAt = attempts, x.w.cfg.ID, time.Now().UTC()
	data := o.data
	if data == nil {
		data = map[string]any{}
	}
	data["attempts"] = attempts
	x.emit(o.event, data)
	stored, ok := x.createEnvelope(env)
	if !ok {
		return false
	}
	_ = x.update(func(r *Record) {
		r.State, r.Status, r.Attempt = StateFinalized, stored.Status, stored.Attempts
		if stored.Error != nil {
			r.LastError = stored.Error.Code
		}
	})
	return true
}

// removeSwept removes a request the sweeper ended from the stream. Workers'
// credentials may not allow it: then a pool's worker that receives it finds
// the envelope and acknowledges it, or JetStream drops it at the record TTL.
func (w *Runner) removeSwept(ctx context.Context, seq uint64) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.b.Exec.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		w.log.Debug("swept request left in the stream", "seq", seq, "err", err)
	}
}
