package demo

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the demo's own resources.
const (
	OutboxStream = "CAPSTAN_DEMO_OUTBOX"
	// OutboxSubject.<idempotency key> holds an execution's email, at most
	// one: it is published create-only (no message on the subject yet), so
	// the outbox is a mail provider that folds every send of one key into
	// the first.
	OutboxSubject = "capstan.demo.outbox"
	RefundsBucket = "CAPSTAN_DEMO_REFUNDS"
	// CallsStream keeps one message per handler call, on the subject
	// CallsSubject.<capability id>, without deduplication across calls.
	CallsStream  = "CAPSTAN_DEMO_CALLS"
	CallsSubject = "capstan.demo.calls"
	// ExecutionIDHeader carries the execution id on every outbox and calls
	// message, PrincipalHeader its principal: execution ids are unique per
	// principal.
	ExecutionIDHeader = "Capstan-Execution-Id"
	PrincipalHeader   = "Capstan-Principal"
	// AttemptHeader carries the attempt number on every calls and outbox
	// message.
	AttemptHeader = "Capstan-Attempt"
	// IdempotencyKeyHeader carries the idempotency key on every outbox
	// message: the principal's and the execution id's together, so that
	// two principals' executions of one id send two emails.
	IdempotencyKeyHeader = "Capstan-Idempotency-Key"
	// RefundApprovalAbove is the amount above which a refund needs approval.
	RefundApprovalAbove = 500
)

var everywhere = executor.On(executor.SurfaceDirect, executor.SurfaceMCP)

// FlakyInput is demo.flaky's input.
type FlakyInput struct {
	// FailTimes is how many attempts fail (retryably) before one succeeds:
	// 0 succeeds at once; demo.flaky makes at most 3 attempts, so 3 or more
	// ends failed.
	FailTimes int `json:"failTimes"`
}

// FlakyOutput reports the attempt that succeeded.
type FlakyOutput struct {
	Attempt int `json:"attempt"` // the attempt that succeeded, from 1
}

// SleepInput is demo.sleep's input.
type SleepInput struct {
	// Ms is how long to sleep, in milliseconds; past demo.sleep's 1 s
	// timeout the attempt times out (and is tried once more).
	Ms int `json:"ms"`
}

// SleepOutput reports how long it slept.
type SleepOutput struct {
	SleptMs int `json:"sleptMs"` // the input's Ms
}

// ReportInput is demo.report's input: how many pages to render, and how long
// each takes (default DefaultPageMs).
type ReportInput struct {
	Pages  int `json:"pages"`            // pages to render, 1 to 100,000
	PageMs int `json:"pageMs,omitempty"` // milliseconds a page takes, at most 10,000; 0 is DefaultPageMs
}

// DefaultPageMs is how long demo.report takes per page by default.
const DefaultPageMs = 100

// Validate bounds the report: 1 to 100,000 pages, at most 10 s a page, and
// no more than its 10-minute timeout in all.
func (r ReportInput) Validate() error {
	var issues []envelope.Issue
	if r.Pages < 1 || r.Pages > 100_000 {
		issues = append(issues, envelope.Issue{Path: "pages", Message: "must be between 1 and 100000"})
	}
	if r.PageMs < 0 || r.PageMs > 10_000 {
		issues = append(issues, envelope.Issue{Path: "pageMs", Message: "must be between 0 and 10000"})
	}
	if len(issues) > 0 {
		return &envelope.InputError{Issues: issues}
	}
	return nil
}

// ReportOutput says how many pages were rendered.
type ReportOutput struct {
	Pages int `json:"pages"` // the input's Pages, all rendered
}

// report is demo.report's handler: it renders one page after another and
// reports its progress after each, as often as it likes; the worker
// coalesces the reports.
func report(ctx context.Context, c executor.Call[ReportInput]) (ReportOutput, error) {
	per := time.Duration(c.Input.PageMs) * time.Millisecond
	if c.Input.PageMs == 0 {
		per = DefaultPageMs * time.Millisecond
	}
	c.Progress(0, float64(c.Input.Pages), "starting")
	t := time.NewTimer(per)
	defer t.Stop()
	for page := 1; page <= c.Input.Pages; page++ {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ReportOutput{}, ctx.Err()
		}
		t.Reset(per)
		c.Progress(float64(page), float64(c.Input.Pages), fmt.Sprintf("page %d of %d rendered", page, c.Input.Pages))
	}
	return ReportOutput{Pages: c.Input.Pages}, nil
}

// EmailInput is email.send's input.
type EmailInput struct {
	To      string `json:"to"`      // the recipient's address, required (not checked further)
	Subject string `json:"subject"` // the subject line, may be empty
	// DelayMs waits before the email is sent, honouring cancellation: until
	// then nothing is sent, and a cancel ends the execution CANCELLED.
	DelayMs int `json:"delayMs,omitempty"`
	// HoldMs holds after the email is sent and its receipt recorded: the
	// window where a crash leaves an effect without a result. A cancel there
	// comes after the effect, and the execution completes (DESIGN §5).
	HoldMs int `json:"holdMs,omitempty"`
}

// wait waits ms milliseconds, or until ctx ends.
func wait(ctx context.Context, ms int) error {
	if ms <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Validate checks the address is present.
func (e EmailInput) Validate() error {
	if e.To == "" {
		return &envelope.InputError{Issues: []envelope.Issue{{Path: "to", Message: "required"}}}
	}
	return nil
}

// EmailOutput is the outbox message's sequence. It is also the receipt
// email.send records once its email is in the outbox.
type EmailOutput struct {
	OutboxSeq uint64 `json:"outboxSeq"` // the email's sequence in OutboxStream
}

// RefundInput is orders.refund's input.
type RefundInput struct {
	OrderID string `json:"orderId"` // the order refunded, required
	// Amount is the amount refunded, positive; above RefundApprovalAbove
	// the refund needs a finance approval.
	Amount int64 `json:"amount"`
}

// Validate checks the order id and amount.
func (r RefundInput) Validate() error {
	var issues []envelope.Issue
	if r.OrderID == "" {
		issues = append(issues, envelope.Issue{Path: "orderId", Message: "required"})
	}
	if r.Amount <= 0 {
		issues = append(issues, envelope.Issue{Path: "amount", Message: "must be positive"})
	}
	if len(issues) > 0 {
		return &envelope.InputError{Issues: issues}
	}
	return nil
}

// RefundOutput says whether this call recorded the refund or found it done.
type RefundOutput struct {
	OrderID string `json:"orderId"` // the input's OrderID
	Amount  int64  `json:"amount"`  // the input's Amount
	// Repeated: this execution's refund was recorded already (by an
	// earlier attempt) and nothing changed.
	Repeated bool `json:"repeated"`
}

// Streams names the demo's streams: the outbox, the calls stream and the
// refunds bucket's.
var Streams = []string{OutboxStream, CallsStream, "KV_" + RefundsBucket}

// Provision creates the demo's outbox stream and refunds bucket when they do
// not exist. replicas is as broker.Config.Replicas: 0 is auto (existing
// resources keep theirs, new ones get broker.DetectReplicas' choice); an
// explicit count must match existing resources. Existing resources are never
// changed.
func Provision(ctx context.Context, nc *nats.Conn, replicas int) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	explicit := replicas > 0
	forNew := func() int {
		if replicas == 0 {
			replicas = broker.DetectReplicas(ctx, nc)
		}
		return replicas
	}
	for _, r := range []struct {
		stream string
		create func(n int) error
	}{
		{OutboxStream, func(n int) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name: OutboxStream, Subjects: []string{OutboxSubject + ".>"}, Storage: jetstream.FileStorage, Replicas: n,
			})
			return err
		}},
		{CallsStream, func(n int) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name: CallsStream, Subjects: []string{CallsSubject + ".>"}, Storage: jetstream.FileStorage, Replicas: n,
			})
			return err
		}},
		{"KV_" + RefundsBucket, func(n int) error {
			_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: RefundsBucket, Storage: jetstream.FileStorage, Replicas: n,
			})
			return err
		}},
	} {
		// Create first: on a cluster, a stream's info waits for its group's
		// leader, a create does not.
		cerr := r.create(forNew())
		if cerr == nil {
			continue
		}
		s, err := js.Stream(ctx, r.stream)
		if err != nil {
			return nil, fmt.Errorf("demo: create %s: %w", r.stream, cerr)
		}
		cfg := s.CachedInfo().Config
		if have := cfg.Replicas; explicit && have != replicas {
			return nil, fmt.Errorf("%w: demo stream %s: Replicas is %d, wanted %d", broker.ErrConfigConflict, r.stream, have, replicas)
		}
		if r.stream == OutboxStream && !slices.Contains(cfg.Subjects, OutboxSubject+".>") {
			// An outbox of an earlier version took every email on one
			// subject: it takes them by idempotency key too.
			cfg.Subjects = append(cfg.Subjects, OutboxSubject+".>")
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				return nil, fmt.Errorf("demo: widen %s: %w", r.stream, err)
			}
		}
	}
	return js, nil
}

// sendOnce publishes m, again under the same message id while the stream
// does not answer (its leader may have just been lost): the stream's dedup
// window keeps one message however many tries it took.
func sendOnce(ctx context.Context, js jetstream.JetStream, m *nats.Msg, id string) (*jetstream.PubAck, error) {
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := js.PublishMsg(tctx, m, jetstream.WithMsgID(id))
		cancel()
		var apiErr *jetstream.APIError
		if err == nil || ctx.Err() != nil || (errors.As(err, &apiErr) && apiErr.Code != 503) {
			return ack, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Duration(min(try, 10)) * 100 * time.Millisecond):
		}
	}
}

// recorded returns h preceded by one message to the calls stream. The message
// id names this call alone (a random part, drawn per call), so that the
// stream's dedup window absorbs the retries of one publish but never a second
// call of the same attempt.
func recorded[In, Out any](js jetstream.JetStream, h executor.Handler[In, Out]) executor.Handler[In, Out] {
	return func(ctx context.Context, c executor.Call[In]) (Out, error) {
		m := nats.NewMsg(CallsSubject + "." + c.CapabilityID)
		m.Header.Set(ExecutionIDHeader, c.ExecutionID)
		m.Header.Set(PrincipalHeader, c.Principal)
		m.Header.Set(AttemptHeader, strconv.Itoa(c.Attempt))
		if _, err := sendOnce(ctx, js, m, fmt.Sprintf("%s-%s-%d-%s", c.Principal, c.ExecutionID, c.Attempt, rand.Text())); err != nil {
			var zero Out
			return zero, fmt.Errorf("calls stream: %w", err)
		}
		return h(ctx, c)
	}
}

// HandlerCall is one message of the calls stream: one call of a handler.
type HandlerCall struct {
	CapabilityID string // the capability whose handler was called
	Principal    string // the principal of the execution
	ExecutionID  string // the execution the call was an attempt of
	Attempt      int    // the attempt's number, from 1
}

// ReadCalls returns every handler call the calls stream holds, oldest first:
// as many as the stream's state counts (a consumer's count of what it has
// pending can lag behind a stream a cluster has just replicated).
func ReadCalls(ctx context.Context, js jetstream.JetStream) ([]HandlerCall, error) {
	s, err := js.Stream(ctx, CallsStream)
	if err != nil {
		return nil, fmt.Errorf("demo: calls stream: %w", err)
	}
	stored := s.CachedInfo().State.Msgs
	calls := make([]HandlerCall, 0, stored)
	if stored == 0 {
		return calls, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("demo: read calls: %w", err)
	}
	for uint64(len(calls)) < stored {
		batch, err := cons.Fetch(int(min(stored-uint64(len(calls)), 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("demo: read calls: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			attempt, _ := strconv.Atoi(m.Headers().Get(AttemptHeader))
			calls = append(calls, HandlerCall{
				CapabilityID: strings.TrimPrefix(m.Subject(), CallsSubject+"."),
				Principal:    m.Headers().Get(PrincipalHeader),
				ExecutionID:  m.Headers().Get(ExecutionIDHeader),
				Attempt:      attempt,
			})
			got++
		}
		if got == 0 {
			if err := batch.Error(); err != nil {
				return nil, fmt.Errorf("demo: read calls: %w", err)
			}
			return nil, fmt.Errorf("demo: read calls: %d of %d messages not delivered", stored-uint64(len(calls)), stored)
		}
	}
	return calls, nil
}

// sendEmail is email.send's handler: one email to the outbox, its receipt,
// then a hold.
func sendEmail(js jetstream.JetStream) executor.Handler[EmailInput, EmailOutput] {
	return func(ctx context.Context, c executor.Call[EmailInput]) (EmailOutput, error) {
		if err := wait(ctx, c.Input.DelayMs); err != nil {
			return EmailOutput{}, err // nothing sent
		}
		out, err := send(ctx, js, c)
		if err != nil {
			return EmailOutput{}, err
		}
		// The email is sent: record it at once, so that a worker lost from
		// here on, or an attempt stopped, ends completed, not
		// OUTCOME_UNKNOWN. A refusal means the outcome is no longer this
		// attempt's to report: it is returned all the same, and discarded.
		if err := c.Receipt(ctx, out); err != nil && c.Logger != nil {
			c.Logger.Warn("receipt not recorded", "err", err)
		}
		// The dangerous window: the effect happened, the result is not yet
		// returned. A crash here must never send the email again.
		if err := wait(ctx, c.Input.HoldMs); err != nil {
			return EmailOutput{}, err
		}
		return out, nil
	}
}

// send publishes c's email to the outbox under its idempotency key,
// create-only: when the key's email is there already (sent by an earlier
// attempt, or by a lost one whose publish landed late), it is that email,
// never a second.
func send(ctx context.Context, js jetstream.JetStream, c executor.Call[EmailInput]) (EmailOutput, error) {
	m := nats.NewMsg(OutboxSubject + "." + c.IdempotencyKey)
	m.Header.Set(ExecutionIDHeader, c.ExecutionID)
	m.Header.Set(PrincipalHeader, c.Principal)
	m.Header.Set(IdempotencyKeyHeader, c.IdempotencyKey)
	m.Header.Set(AttemptHeader, strconv.Itoa(c.Attempt))
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	m.Data = []byte(c.Input.To + "\n" + c.Input.Subject)
	// The stream's duplicate window drops a repeat of this key's publish
	// too (and makes sendOnce's tries one email).
	ack, err := sendOnce(ctx, js, m, c.IdempotencyKey)
	if err == nil {
		return EmailOutput{OutboxSeq: ack.Sequence}, nil
	}
	if !broker.WrongLastSequence(err) {
		return EmailOutput{}, fmt.Errorf("outbox: %w", err)
	}
	// The key's email is there already.
	sent, found, err := sentEmail(ctx, js, c.IdempotencyKey)
	switch {
	case err != nil:
		return EmailOutput{}, fmt.Errorf("outbox: %w", err)
	case !found || sent.Header.Get(ExecutionIDHeader) != c.ExecutionID:
		return EmailOutput{}, fmt.Errorf("outbox: key %s refused but not held for execution %s", c.IdempotencyKey, c.ExecutionID)
	}
	return EmailOutput{OutboxSeq: sent.Sequence}, nil
}

// sentEmail reads the outbox's email of key from the stream's leader: a
// replica may not have the last one yet, and absent must mean absent.
func sentEmail(ctx context.Context, js jetstream.JetStream, key string) (*jetstream.RawStreamMsg, bool, error) {
	return lastFromLeader(ctx, js.Conn(), OutboxStream, OutboxSubject+"."+key)
}

// lastFromLeader is broker.LastFromLeader with absence as found false.
func lastFromLeader(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, bool, error) {
	m, err := broker.LastFromLeader(ctx, nc, stream, subject)
	if errors.Is(err, broker.ErrNotFound) {
		return nil, false, nil
	}
	return m, err == nil, err
}

// EmailRecovery is email.send's recovery: its receipt is its output, and its
// reconciler looks the execution's idempotency key up in the outbox.
//
// It proves absence. The outbox is read on its stream's leader, so an email
// stored before the question is seen; and an email is published create-only
// under its key, so a lost attempt's publish that lands after the answer (a
// worker cut off by a partition whose handler ignored its context, its
// publish sent on reconnect) is refused whenever it lands, for as long as the
// outbox keeps the key's email (it has no age limit): the new attempt under
// the same key finds the late email and reports it, or its own email makes
// the late one refused. The stream's duplicate window, keyed on the
// idempotency key, drops such a repeat within the window as well; the
// create-only subject is what holds past it.
func EmailRecovery(js jetstream.JetStream) executor.Recovery[EmailInput, EmailOutput] {
	return executor.Recovery[EmailInput, EmailOutput]{
		ProvesAbsence: true,
		Timeout:       5 * time.Second,
		Reconcile: func(ctx context.Context, q executor.Reconciliation[EmailInput]) (executor.Reconciled[EmailOutput], error) {
			sent, found, err := sentEmail(ctx, js, q.IdempotencyKey)
			switch {
			case err != nil:
				return executor.Reconciled[EmailOutput]{}, err
			case !found:
				return executor.Reconciled[EmailOutput]{Effect: executor.EffectAbsent}, nil
			case sent.Header.Get(ExecutionIDHeader) != q.ExecutionID:
				// Another execution's email under this key: not evidence of
				// this one's, either way.
				return executor.Reconciled[EmailOutput]{}, nil
			}
			return executor.Found(EmailOutput{OutboxSeq: sent.Sequence}), nil
		},
	}
}

// EmailMeta is email.send's metadata.
var EmailMeta = executor.Meta{
	Description: "Sends an email (to the demo outbox stream). Never retried: a repeat would send it twice.",
	Expose:      everywhere, SideEffect: executor.SideEffectExternal, Risk: executor.RiskMedium, Tags: []string{"demo"},
}

// SendEmail is email.send's handler, recorded in the calls stream: crash
// tests wrap it to decide when a worker serving it is lost.
func SendEmail(js jetstream.JetStream) executor.Handler[EmailInput, EmailOutput] {
	return recorded(js, sendEmail(js))
}

// SendEmailWithoutReceipt is email.send's handler, recorded in the calls
// stream, that records no receipt: crash tests pair it with reconcilers of
// their own, to prove that they would see one that lies.
func SendEmailWithoutReceipt(js jetstream.JetStream) executor.Handler[EmailInput, EmailOutput] {
	return recorded(js, func(ctx context.Context, c executor.Call[EmailInput]) (EmailOutput, error) {
		if err := wait(ctx, c.Input.DelayMs); err != nil {
			return EmailOutput{}, err
		}
		out, err := send(ctx, js, c)
		if err != nil {
			return EmailOutput{}, err
		}
		if err := wait(ctx, c.Input.HoldMs); err != nil {
			return EmailOutput{}, err
		}
		return out, nil
	})
}

// refundRecovery is orders.refund's: its reconciler looks the idempotency
// key up in the refunds bucket, on the stream's leader. It proves absence:
// a refund is created under its key, create-only, so a lost attempt's late
// write is refused (and reported as a repeat) whenever it lands.
func refundRecovery(js jetstream.JetStream) executor.Recovery[RefundInput, RefundOutput] {
	return executor.Recovery[RefundInput, RefundOutput]{
		ProvesAbsence: true,
		Timeout:       5 * time.Second,
		Reconcile: func(ctx context.Context, q executor.Reconciliation[RefundInput]) (executor.Reconciled[RefundOutput], error) {
			m, found, err := lastFromLeader(ctx, js.Conn(), "KV_"+RefundsBucket, "$KV."+RefundsBucket+"."+q.IdempotencyKey)
			switch {
			case err != nil:
				return executor.Reconciled[RefundOutput]{}, err
			case !found || m.Header.Get("KV-Operation") != "":
				// Never written, or deleted: no refund under this key.
				return executor.Reconciled[RefundOutput]{Effect: executor.EffectAbsent}, nil
			}
			var in RefundInput
			if err := envelope.Unmarshal(m.Data, &in); err != nil {
				return executor.Reconciled[RefundOutput]{}, err
			}
			if in != q.Input {
				// Another refund under this key: not this execution's.
				return executor.Reconciled[RefundOutput]{}, nil
			}
			return executor.Found(RefundOutput{OrderID: in.OrderID, Amount: in.Amount}), nil
		},
	}
}

// Catalog returns the demo capabilities, their effects kept in js.
func Catalog(js jetstream.JetStream) []executor.Capability {
	return []executor.Capability{
		executor.Define("demo.echo", executor.Meta{
			Description: "Returns its input unchanged. Use to check that capstan works end to end.",
			Expose:      everywhere, SideEffect: executor.SideEffectNone, Risk: executor.RiskLow, Tags: []string{"demo"},
		}, func(ctx context.Context, c executor.Call[map[string]any]) (map[string]any, error) {
			return c.Input, nil
		}),

		executor.Define("demo.flaky", executor.Meta{
			Description: "Fails retryably while its attempt number is at most failTimes, then succeeds.",
			Expose:      everywhere, SideEffect: executor.SideEffectRead, Risk: executor.RiskLow, Tags: []string{"demo"},
			Retry: &executor.Retry{MaxAttempts: 2},
		}, recorded(js, func(ctx context.Context, c executor.Call[FlakyInput]) (FlakyOutput, error) {
			if c.Attempt <= c.Input.FailTimes {
				return FlakyOutput{}, &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Retryable: true,
					ExposeToModel: true, Message: fmt.Sprintf("Attempt %d failed on purpose.", c.Attempt)}
			}
			return FlakyOutput{Attempt: c.Attempt}, nil
		})),

		executor.Define("demo.sleep", executor.Meta{
			Description: "Sleeps ms milliseconds, honouring cancellation; times out after 1 s.",
			Expose:      everywhere, SideEffect: executor.SideEffectRead, Risk: executor.RiskLow, Tags: []string{"demo"},
			Timeout: time.Second, Retry: &executor.Retry{MaxAttempts: 1},
		}, recorded(js, func(ctx context.Context, c executor.Call[SleepInput]) (SleepOutput, error) {
			t := time.NewTimer(time.Duration(c.Input.Ms) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return SleepOutput{SleptMs: c.Input.Ms}, nil
			case <-ctx.Done():
				return SleepOutput{}, ctx.Err()
			}
		})),

		executor.Define("demo.report", executor.Meta{
			Description: "Renders a report of pages pages (pageMs each, default 100), reporting its progress after every page.",
			Expose:      everywhere, SideEffect: executor.SideEffectNone, Risk: executor.RiskLow, Tags: []string{"demo"},
			Timeout: 10 * time.Minute,
			// A report is heavy work: at most four render at once across the
			// deployment, at most three of one principal's, so that another's
			// report finds a slot whatever one principal sends; more wait
			// their turn (`capstan limits` shows it).
			Limits: []executor.Limit{{Kind: executor.LimitConcurrency, Max: 4, PrincipalMax: 3}},
		}, report),

		executor.Define("email.send", EmailMeta, SendEmail(js), executor.WithRecovery(EmailRecovery(js))),

		executor.Define("orders.refund", executor.Meta{
			Description: "Refunds an order. Confirm the order id with the customer first; above 500 it needs an approval.",
			Expose:      everywhere, SideEffect: executor.SideEffectWrite, Risk: executor.RiskHigh, Tags: []string{"demo", "payments"},
			Idempotent: true, Retry: &executor.Retry{MaxAttempts: 1}, Timeout: 10 * time.Second,
			Policies: []executor.Policy{{
				Name: "refund-approval-above-500", MayRequireApproval: true,
				Evaluate: func(ctx context.Context, r executor.PolicyRequest) (executor.Decision, error) {
					in, ok := r.Input.(*RefundInput)
					if ok && in.Amount > RefundApprovalAbove {
						return executor.Decision{Stance: executor.StanceRequireApproval, ApprovalTypes: []string{"finance"},
							Reason: fmt.Sprintf("refunds above %d need a finance approval", RefundApprovalAbove)}, nil
					}
					return executor.Decision{Stance: executor.StanceAllow}, nil
				},
			}},
		}, recorded(js, func(ctx context.Context, c executor.Call[RefundInput]) (RefundOutput, error) {
			kv, err := js.KeyValue(ctx, RefundsBucket)
			if err != nil {
				return RefundOutput{}, err
			}
			rec, _ := envelope.Marshal(c.Input)
			// Keyed by the idempotency key: a repeated attempt of this execution
			// finds its own refund and changes nothing.
			if _, err := kv.Create(ctx, c.IdempotencyKey, rec); err != nil {
				if errors.Is(err, jetstream.ErrKeyExists) {
					return RefundOutput{OrderID: c.Input.OrderID, Amount: c.Input.Amount, Repeated: true}, nil
				}
				return RefundOutput{}, &envelope.CapabilityError{Code: envelope.CodeExecutionFailed, Retryable: true,
					Message: "The refund store is unavailable.", Cause: err}
			}
			return RefundOutput{OrderID: c.Input.OrderID, Amount: c.Input.Amount}, nil
		}), executor.WithRecovery(refundRecovery(js))),
	}
}
