package demo

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the demo's own resources.
const (
	OutboxStream  = "CAPSTAN_DEMO_OUTBOX"
	OutboxSubject = "capstan.demo.outbox"
	RefundsBucket = "CAPSTAN_DEMO_REFUNDS"
	// CallsStream keeps one message per handler call, on the subject
	// CallsSubject.<capability id>, without deduplication across calls.
	CallsStream  = "CAPSTAN_DEMO_CALLS"
	CallsSubject = "capstan.demo.calls"
	// ExecutionIDHeader carries the execution id on every outbox and calls
	// message.
	ExecutionIDHeader = "Capstan-Execution-Id"
	// AttemptHeader carries the attempt number on every calls message.
	AttemptHeader = "Capstan-Attempt"
	// RefundApprovalAbove is the amount above which a refund needs approval.
	RefundApprovalAbove = 500
)

var everywhere = executor.On(executor.SurfaceDirect, executor.SurfaceMCP)

// FlakyInput is demo.flaky's input.
type FlakyInput struct {
	FailTimes int `json:"failTimes"`
}

// FlakyOutput reports the attempt that succeeded.
type FlakyOutput struct {
	Attempt int `json:"attempt"`
}

// SleepInput is demo.sleep's input.
type SleepInput struct {
	Ms int `json:"ms"`
}

// SleepOutput reports how long it slept.
type SleepOutput struct {
	SleptMs int `json:"sleptMs"`
}

// EmailInput is email.send's input.
type EmailInput struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	HoldMs  int    `json:"holdMs,omitempty"`
}

// Validate checks the address is present.
func (e EmailInput) Validate() error {
	if e.To == "" {
		return &envelope.InputError{Issues: []envelope.Issue{{Path: "to", Message: "required"}}}
	}
	return nil
}

// EmailOutput is the outbox message's sequence.
type EmailOutput struct {
	OutboxSeq uint64 `json:"outboxSeq"`
}

// RefundInput is orders.refund's input.
type RefundInput struct {
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
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
	OrderID  string `json:"orderId"`
	Amount   int64  `json:"amount"`
	Repeated bool   `json:"repeated"`
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
				Name: OutboxStream, Subjects: []string{OutboxSubject}, Storage: jetstream.FileStorage, Replicas: n,
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
		if have := s.CachedInfo().Config.Replicas; explicit && have != replicas {
			return nil, fmt.Errorf("%w: demo stream %s: Replicas is %d, wanted %d", broker.ErrConfigConflict, r.stream, have, replicas)
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
		m.Header.Set(AttemptHeader, strconv.Itoa(c.Attempt))
		if _, err := sendOnce(ctx, js, m, fmt.Sprintf("%s-%d-%s", c.ExecutionID, c.Attempt, rand.Text())); err != nil {
			var zero Out
			return zero, fmt.Errorf("calls stream: %w", err)
		}
		return h(ctx, c)
	}
}

// HandlerCall is one message of the calls stream: one call of a handler.
type HandlerCall struct {
	CapabilityID string
	ExecutionID  string
	Attempt      int
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

// sendEmail is email.send's handler: one message to the outbox, then a hold.
func sendEmail(js jetstream.JetStream) executor.Handler[EmailInput, EmailOutput] {
	return func(ctx context.Context, c executor.Call[EmailInput]) (EmailOutput, error) {
		m := nats.NewMsg(OutboxSubject)
		m.Header.Set(ExecutionIDHeader, c.ExecutionID)
		m.Data = []byte(c.Input.To + "\n" + c.Input.Subject)
		// The outbox is the per-attempt view: its message id names the
		// attempt, so a second attempt, which the runtime must never make,
		// shows as a second email; a second run of the same attempt shows in
		// the calls stream.
		ack, err := sendOnce(ctx, js, m, fmt.Sprintf("%s-%d", c.ExecutionID, c.Attempt))
		if err != nil {
			return EmailOutput{}, fmt.Errorf("outbox: %w", err)
		}
		// The dangerous window: the effect happened, the result is not yet
		// recorded. A crash here must never send the email again.
		if c.Input.HoldMs > 0 {
			t := time.NewTimer(time.Duration(c.Input.HoldMs) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return EmailOutput{}, ctx.Err()
			}
		}
		return EmailOutput{OutboxSeq: ack.Sequence}, nil
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

		executor.Define("email.send", executor.Meta{
			Description: "Sends an email (to the demo outbox stream). Never retried: a repeat would send it twice.",
			Expose:      everywhere, SideEffect: executor.SideEffectExternal, Risk: executor.RiskMedium, Tags: []string{"demo"},
		}, recorded(js, sendEmail(js))),

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
		})),
	}
}
