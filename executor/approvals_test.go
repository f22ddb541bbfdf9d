package executor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testhooks"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/capstantest"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/demo"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var (
	bobApprover = envelope.Actor{Kind: "user", ID: "bob"}
	carolActor  = envelope.Actor{Kind: "user", ID: "carol"}
)

// The vault capabilities need an approval on every call and record each
// handler call in a stream that outlives the worker process that made it.
const (
	vaultPool       = "vault"
	effectsStream   = "APPROVALTEST_EFFECTS"
	effectsSubjects = "approvaltest.effects."
	refundsBucket   = "APPROVALTEST_REFUNDS"
)

type vaultInput struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
	// HoldMs holds the first attempt after its effect, until its context ends.
	HoldMs int `json:"holdMs,omitempty"`
}

func (v vaultInput) Validate() error {
	if v.Account == "" || v.Amount <= 0 {
		return &envelope.InputError{Issues: []envelope.Issue{{Path: "amount", Message: "an account and a positive amount"}}}
	}
	return nil
}

type vaultOutput struct {
	ApprovalID string `json:"approvalId"`
	Approver   string `json:"approver"`
	Comment    string `json:"comment,omitempty"`
	Actor      string `json:"actor"`
	Attempt    int    `json:"attempt"`
	Repeated   bool   `json:"repeated,omitempty"`
}

func vaultCatalog(js jetstream.JetStream) []executor.Capability {
	run := func(ctx context.Context, c executor.Call[vaultInput], repeated bool) (vaultOutput, error) {
		out := vaultOutput{Actor: c.Actor.String(), Attempt: c.Attempt, Repeated: repeated}
		subject := effectsSubjects + "none"
		if c.Approval != nil {
			out.ApprovalID, out.Approver, out.Comment = c.Approval.ID, c.Approval.Approver.String(), c.Approval.Comment
			subject = effectsSubjects + c.Approval.ID
		}
		m := nats.NewMsg(subject)
		m.Header.Set("Execution-Id", c.ExecutionID)
		m.Header.Set("Attempt", fmt.Sprint(c.Attempt))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return out, err
		}
		if c.Input.HoldMs > 0 && c.Attempt == 1 {
			select {
			case <-time.After(time.Duration(c.Input.HoldMs) * time.Millisecond):
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
		return out, nil
	}
	required := &executor.ApprovalRule{Required: true, Reason: "moving money needs a second pair of eyes"}
	return []executor.Capability{
		executor.Define("vault.transfer", executor.Meta{
			Description: "Moves money out. Never retried.",
			Expose:      executor.On(executor.SurfaceDirect, executor.SurfaceMCP), SideEffect: executor.SideEffectExternal,
			Risk: executor.RiskCritical, Approval: required,
		}, func(ctx context.Context, c executor.Call[vaultInput]) (vaultOutput, error) {
			return run(ctx, c, false)
		}),
		executor.Define("vault.refund", executor.Meta{
			Description: "Refunds money, deduplicated by the idempotency key.",
			Expose:      executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite, Idempotent: true,
			Retry: &executor.Retry{MaxAttempts: 1, Backoff: 10 * time.Millisecond}, Risk: executor.RiskHigh, Approval: required,
		}, func(ctx context.Context, c executor.Call[vaultInput]) (vaultOutput, error) {
			kv, err := js.KeyValue(ctx, refundsBucket)
			if err != nil {
				return vaultOutput{}, err
			}
			_, err = kv.Create(ctx, c.IdempotencyKey, []byte(c.ExecutionID))
			if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return vaultOutput{}, err
			}
			return run(ctx, c, err != nil)
		}),
	}
}

// vaultEnv starts a server with the vault's effect stream and refunds bucket.
func vaultEnv(t *testing.T) (*testenv.Env, jetstream.JetStream) {
	t.Helper()
	env := testenv.Start(t)
	js := env.JetStream(t)
	ctx := ctxT(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: effectsStream, Subjects: []string{effectsSubjects + ">"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: refundsBucket}); err != nil {
		t.Fatal(err)
	}
	return env, js
}

// effects counts the handler calls an approval authorized, in every process.
func effects(t *testing.T, js jetstream.JetStream, approvalID string) int {
	t.Helper()
	s, err := js.Stream(ctxT(t), effectsStream)
	if err != nil {
		t.Fatal(err)
	}
	subject := effectsSubjects + approvalID
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Subjects[subject])
}

func startVault(t *testing.T, nc *nats.Conn, js jetstream.JetStream, cfg executor.WorkerConfig) *executor.Worker {
	t.Helper()
	cfg.Pool = vaultPool
	return startWorker(t, nc, cfg, vaultCatalog(js)...)
}

// requireApproval calls a capability that needs approval and returns the
// approval the envelope names.
func requireApproval(t *testing.T, c *executor.Client, capabilityID string, input any, opts ...executor.CallOption) (*envelope.Envelope, *approvals.Record) {
	t.Helper()
	env, err := c.Call(ctxT(t), capabilityID, input, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if env.Status != envelope.StatusApprovalRequired || env.Approval == nil || env.Error != nil || env.Attempts != 0 {
		t.Fatalf("envelope %+v, error %+v", env, env.Error)
	}
	rec, err := c.Approval(ctxT(t), env.Approval.ID)
	if err != nil {
		t.Fatal(err)
	}
	return env, rec
}

func decide(t *testing.T, c *executor.Client, id string, approve bool) {
	t.Helper()
	if _, err := c.Decide(ctxT(t), id, approvals.Verdict{Approve: approve, Approver: bobApprover, Comment: "checked"}); err != nil {
		t.Fatal(err)
	}
}

func mustFailWith(t *testing.T, env *envelope.Envelope, code envelope.Code) {
	t.Helper()
	if env.Status != envelope.StatusFailed || env.Error == nil || env.Error.Code != code {
		t.Fatalf("envelope %s %+v, want failed %s", env.Status, env.Error, code)
	}
}

// The walk-through of the demo: a refund above 500 waits for an approval; an
// approver other than the requester approves; the resume completes once, and
// a second resume is refused.
func TestApproval_RefundAbove500_ApproveResumeOnce(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	js, err := demo.Provision(ctxT(t), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, executor.WorkerConfig{}, demo.Catalog(js)...)
	c := newClient(t, env.Connect(t))
	ctx := ctxT(t)

	first, rec := requireApproval(t, c, "orders.refund", json.RawMessage(`{"orderId":"o1","amount":900}`), executor.As(alice))
	if first.Approval.Types[0] != "finance" || !strings.Contains(strings.Join(first.Approval.Reasons, ";"), "above 500") {
		t.Fatalf("approval ref %+v", first.Approval)
	}
	if rec.Status != approvals.StatusPending || rec.RequestedBy != first.ExecutionID || rec.Actor.String() != "user:alice" ||
		string(rec.Input) != `{"amount":900,"orderId":"o1"}` || rec.SideEffect != "write" || rec.Risk != "high" ||
		!rec.ExpiresAt.Equal(first.Approval.ExpiresAt) || rec.ExpiresAt.Sub(rec.RequestedAt) != approvalstore.DefaultTTL {
		t.Fatalf("approval %+v", rec)
	}
	if below, err := c.Call(ctx, "orders.refund", map[string]any{"orderId": "o2", "amount": 500}, executor.As(alice)); err != nil ||
		below.Status != envelope.StatusCompleted {
		t.Fatalf("a refund of 500 needs no approval: %+v %v", below, err)
	}

	decide(t, c, rec.ID, true)
	done, err := c.Resume(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != envelope.StatusCompleted || done.ExecutionID == first.ExecutionID {
		t.Fatalf("resume: %+v %+v", done, done.Error)
	}
	var out demo.RefundOutput
	if err := done.Output.Decode(&out); err != nil || out.OrderID != "o1" || out.Amount != 900 || out.Repeated {
		t.Fatalf("output %+v %v", out, err)
	}
	again, err := c.Resume(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustFailWith(t, again, envelope.CodeApprovalConsumed)
	if m := again.ForModel(); m.Code != envelope.CodeApprovalConsumed {
		t.Fatalf("the model sees %+v", m)
	}
	got, _ := c.Approval(ctx, rec.ID)
	if got.Status != approvals.StatusConsumed || got.ConsumedBy != done.ExecutionID {
		t.Fatalf("approval after the resume: %+v", got)
	}

	// A new call with the same input is a new execution: it needs a new approval.
	next, nextRec := requireApproval(t, c, "orders.refund", map[string]any{"orderId": "o1", "amount": 900}, executor.As(alice))
	if next.Approval.ID == rec.ID || nextRec.InputHash != rec.InputHash {
		t.Fatalf("new call: approval %s (first %s), hash %s (first %s)", next.Approval.ID, rec.ID, nextRec.InputHash, rec.InputHash)
	}
}

// The requester may not approve their own call.
func TestApproval_RequesterApprovingOwnCall_SelfApproval(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	startVault(t, env.Connect(t), js, executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	_, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10}, executor.As(alice))

	_, err := c.Decide(ctxT(t), rec.ID, approvals.Verdict{Approve: true, Approver: alice})
	if !errors.Is(err, approvals.ErrSelfApproval) || approvalstore.Code(err) != envelope.CodeApprovalSelfApproval {
		t.Fatalf("self-approval: %v", err)
	}
	resumed, err := c.Resume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustFailWith(t, resumed, envelope.CodeApprovalPending)
	if n := effects(t, js, rec.ID); n != 0 {
		t.Fatalf("%d handler calls", n)
	}
}

// A resume of an approval that is not approved ends with the matching code,
// and the handler is never called.
func TestResume_NotApproved_MatchingCodeHandlerNotCalled(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	startVault(t, env.Connect(t), js, executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	b := testhooks.Broker(c)
	cases := []struct {
		name  string
		setup func(id string)
		want  envelope.Code
	}{
		{"pending", func(string) {}, envelope.CodeApprovalPending},
		{"rejected", func(id string) { decide(t, c, id, false) }, envelope.CodeApprovalRejected},
		{"expired before a decision", func(id string) {
			rewriteApproval(t, b, id, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })
		}, envelope.CodeApprovalExpired},
		{"expired after approval", func(id string) {
			decide(t, c, id, true)
			rewriteApproval(t, b, id, func(r *approvals.Record) { r.ExpiresAt = time.Now().Add(-time.Second) })
		}, envelope.CodeApprovalExpired},
		{"cancelled", func(id string) {
			if _, err := c.WithdrawApproval(ctxT(t), id, alice, "not needed"); err != nil {
				t.Fatal(err)
			}
		}, envelope.CodeApprovalRejected},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10}, executor.As(alice))
			tc.setup(rec.ID)
			got, err := c.Resume(ctxT(t), rec.ID)
			if err != nil {
				t.Fatal(err)
			}
			mustFailWith(t, got, tc.want)
			if got.Error.Stage != envelope.StageApproval || !got.Error.ExposeToModel {
				t.Fatalf("error %+v", got.Error)
			}
			if n := effects(t, js, rec.ID); n != 0 {
				t.Fatalf("%d handler calls", n)
			}
		})
	}
	if _, err := c.Resume(ctxT(t), envelope.NewExecutionID()); !errors.Is(err, approvals.ErrNotFound) {
		t.Fatalf("resume of an unknown approval: %v", err)
	}
}

// rewriteApproval changes a stored approval behind the store's back, as
// anyone with write access to the bucket could.
func rewriteApproval(t *testing.T, b *broker.Broker, id string, change func(r *approvals.Record)) {
	t.Helper()
	r, rev, err := broker.Load[approvals.Record](ctxT(t), b.Approvals, id)
	if err != nil {
		t.Fatal(err)
	}
	change(r)
	if _, err := broker.Update(ctxT(t), b.Approvals, id, r, rev); err != nil {
		t.Fatal(err)
	}
}

// Changing the approved input in the bucket is caught by the re-hash: the
// handler is not called and the approval is not used up.
func TestResume_InputChangedInBucket_InputMismatch(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	startVault(t, env.Connect(t), js, executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	_, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10}, executor.As(alice))
	decide(t, c, rec.ID, true)
	for _, tc := range []struct{ name, input string }{
		{"another amount", `{"account":"a1","amount":1000000}`},
		{"same value, not canonical", `{"amount":10, "account":"a1"}`},
		{"not even JSON", `{"account":`},
		{"canonical, as approved", `{"account":"a1","amount":10}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rewriteApproval(t, testhooks.Broker(c), rec.ID, func(r *approvals.Record) { r.Input = json.RawMessage(tc.input) })
			got, err := c.Resume(ctxT(t), rec.ID)
			switch {
			case tc.name == "not even JSON":
				if !errors.Is(err, approvals.ErrInputMismatch) {
					t.Fatalf("resume: %v", err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.name == "canonical, as approved":
				if got.Status != envelope.StatusCompleted {
					t.Fatalf("the restored input: %+v %+v", got, got.Error)
				}
				return
			default:
				mustFailWith(t, got, envelope.CodeApprovalInputMismatch)
			}
			if n := effects(t, js, rec.ID); n != 0 {
				t.Fatalf("%d handler calls", n)
			}
			if a, _ := c.Approval(ctxT(t), rec.ID); a.Status != approvals.StatusApproved {
				t.Fatalf("approval %s after a refused resume", a.Status)
			}
		})
	}
}

// A resume carries the approved input and runs as the requester: a request
// that names the approval with another actor or another input is refused.
func TestResume_OnlyTheApprovedCallAsTheRequester(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	startVault(t, env.Connect(t), js, executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))
	in := vaultInput{Account: "a1", Amount: 10}
	_, rec := requireApproval(t, c, "vault.transfer", in, executor.As(alice))
	decide(t, c, rec.ID, true)
	ctx := ctxT(t)

	for name, tc := range map[string]struct {
		capID string
		input any
		opts  []executor.CallOption
		want  envelope.Code
	}{
		"another actor":      {"vault.transfer", in, []executor.CallOption{executor.As(carolActor)}, envelope.CodeForbidden},
		"another input":      {"vault.transfer", vaultInput{Account: "a1", Amount: 11}, []executor.CallOption{executor.As(alice)}, envelope.CodeApprovalInputMismatch},
		"another capability": {"vault.refund", in, []executor.CallOption{executor.As(alice)}, envelope.CodeForbidden},
	} {
		got, err := c.Call(ctx, tc.capID, tc.input, append(tc.opts, executor.WithApproval(rec.ID))...)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != tc.want {
			t.Fatalf("%s: %s %+v, want %s", name, got.Status, got.Error, tc.want)
		}
	}
	if n := effects(t, js, rec.ID); n != 0 {
		t.Fatalf("%d handler calls", n)
	}

	// Client.Resume sets the requester whatever the options say, and the
	// handler learns who approved.
	got, err := c.Resume(ctx, rec.ID, executor.As(carolActor))
	if err != nil {
		t.Fatal(err)
	}
	var out vaultOutput
	if got.Status != envelope.StatusCompleted || got.Output.Decode(&out) != nil {
		t.Fatalf("resume: %+v %+v", got, got.Error)
	}
	if out.Actor != "user:alice" || out.ApprovalID != rec.ID || out.Approver != "user:bob" || out.Comment != "checked" {
		t.Fatalf("the handler saw %+v", out)
	}
}

// The approved input must still fit the capability's current input type: a
// worker whose type changed since refuses the resume without using the
// approval.
func TestResume_RevalidatedAgainstCurrentInputType(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	c := newClient(t, env.Connect(t))

	stop := runApprovalWorker(t, env, "approvals-v1", executor.WorkerConfig{Pool: vaultPool}, vaultCatalog(js)...)
	_, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10, HoldMs: 1}, executor.As(alice))
	decide(t, c, rec.ID, true)
	stop()

	// The next release dropped holdMs from the input.
	type strictInput struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	var calls int
	stop = runApprovalWorker(t, env, "approvals-v2", executor.WorkerConfig{Pool: vaultPool},
		executor.Define("vault.transfer", executor.Meta{Description: "Moves money out, without holds.",
			Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
			Approval: &executor.ApprovalRule{Required: true}},
			func(ctx context.Context, c executor.Call[strictInput]) (string, error) { calls++; return "sent", nil }))
	defer stop()

	got, err := c.Resume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustFailWith(t, got, envelope.CodeInputInvalid)
	if a, _ := c.Approval(ctxT(t), rec.ID); a.Status != approvals.StatusApproved || calls != 0 {
		t.Fatalf("approval %s, %d calls", a.Status, calls)
	}
}

// runApprovalWorker runs a worker on a connection of its own until the returned stop
// is called (or the test ends); stop closes the connection, so no pull request
// of the stopped worker is left behind.
func runApprovalWorker(t *testing.T, env *testenv.Env, name string, cfg executor.WorkerConfig, caps ...executor.Capability) (stop func()) {
	t.Helper()
	nc := env.Connect(t, nats.Name(name))
	reg, err := executor.NewRegistry(caps...)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID = name
	w := trackedWorker(t, reg, capstantest.WithConn(nc), capstantest.WithConfig(cfg))
	waitProcessesServing(t, env.Server, name)
	return func() {
		w.Stop()
		nc.Close()
	}
}

// A static approval rule with its own reason and TTL; an input with no
// canonical form (one that does not write as JSON) cannot be approved.
func TestApprovalRequired_StaticRuleAndUnserializableInput(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	type in struct {
		Ratio float64    `json:"ratio"`
		Memo  sealedMemo `json:"memo,omitempty"`
	}
	startWorker(t, env.Connect(t), executor.WorkerConfig{},
		executor.Define("fx.rebalance", executor.Meta{Description: "Rebalances a portfolio.",
			Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
			Approval: &executor.ApprovalRule{Required: true, Reason: "rebalancing is reviewed", TTL: 2 * time.Hour}},
			func(ctx context.Context, c executor.Call[in]) (in, error) { return c.Input, nil }))
	c := newClient(t, env.Connect(t))

	first, rec := requireApproval(t, c, "fx.rebalance", in{Ratio: 0.5})
	if len(first.Approval.Reasons) != 1 || first.Approval.Reasons[0] != "rebalancing is reviewed" ||
		rec.ExpiresAt.Sub(rec.RequestedAt) != 2*time.Hour {
		t.Fatalf("approval %+v, record %+v", first.Approval, rec)
	}
	got, err := c.Call(ctxT(t), "fx.rebalance", in{Ratio: 0.5, Memo: "sealed"})
	if err != nil {
		t.Fatal(err)
	}
	mustFailWith(t, got, envelope.CodeApprovalUnserializableInput)
	if list, _ := approvalstore.NewStore(testhooks.Broker(c).Approvals, nil).List(ctxT(t), approvalstore.Filter{CapabilityID: "fx.rebalance"}); len(list) != 1 {
		t.Fatalf("%d approvals stored", len(list))
	}
}

// sealedMemo refuses to be written as JSON when it says "sealed".
type sealedMemo string

func (m sealedMemo) MarshalJSON() ([]byte, error) {
	if m == "sealed" {
		return nil, errors.New("a sealed memo is not shown")
	}
	return json.Marshal(string(m))
}

type payout struct {
	IBAN   string `json:"iban"`
	Amount int64  `json:"amount"`
}

// Validate normalizes the IBAN: the validated input differs from the bytes sent.
func (p *payout) Validate() error {
	p.IBAN = strings.ReplaceAll(p.IBAN, " ", "")
	return nil
}

// An approval binds the validated input (SI-4, SI-6); an approver may be
// shown a redacted view of it; the handler still gets the whole of it.
func TestApproval_BindsValidatedInput_RedactedForTheApprover(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	startWorker(t, env.Connect(t), executor.WorkerConfig{},
		executor.Define("payouts.send", executor.Meta{Description: "Sends a payout.",
			Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectExternal,
			Approval: &executor.ApprovalRule{Required: true},
			RedactApprovalInput: func(in any) any {
				p := in.(*payout)
				return payout{IBAN: "****" + p.IBAN[len(p.IBAN)-4:], Amount: p.Amount}
			}},
			func(ctx context.Context, c executor.Call[payout]) (payout, error) { return c.Input, nil }))
	c := newClient(t, env.Connect(t))

	_, rec := requireApproval(t, c, "payouts.send", payout{IBAN: "DE89 3704 0044 0532 0130 00", Amount: 70})
	if string(rec.Display) != `{"amount":70,"iban":"****3000"}` || string(rec.Input) != `{"amount":70,"iban":"DE89370400440532013000"}` {
		t.Fatalf("display %s, input %s", rec.Display, rec.Input)
	}
	decide(t, c, rec.ID, true)
	got, err := c.Resume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out payout
	if got.Status != envelope.StatusCompleted || got.Output.Decode(&out) != nil || out.IBAN != "DE89370400440532013000" {
		t.Fatalf("resume %+v, output %+v", got.Error, out)
	}
}

// The trail tells the whole story: the request, the decision with the
// approver acting, and the resume consuming it.
func TestApproval_EventsInTheTrail(t *testing.T) {
	t.Parallel()
	env, js := vaultEnv(t)
	startVault(t, env.Connect(t), js, executor.WorkerConfig{})
	c := newClient(t, env.Connect(t))

	first, rec := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 10}, executor.As(alice))
	decide(t, c, rec.ID, true)
	done, err := c.Resume(ctxT(t), rec.ID)
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("resume %+v %v", done, err)
	}
	_, rejected := requireApproval(t, c, "vault.transfer", vaultInput{Account: "a1", Amount: 20}, executor.As(alice))
	decide(t, c, rejected.ID, false)

	want := func(execID string, types ...string) []audit.Event {
		t.Helper()
		evs := approvalTrail(t, testhooks.Broker(c), execID, len(types))
		var got []string
		for _, e := range evs {
			got = append(got, e.Type)
		}
		if strings.Join(got, " ") != strings.Join(types, " ") {
			t.Fatalf("trail of %s:\n got %v\nwant %v", execID, got, types)
		}
		return evs
	}
	evs := want(first.ExecutionID, audit.EventRequested, audit.EventApprovalRequested, audit.EventApproved)
	if evs[1].Actor != audit.ActorOf(alice) || evs[1].Data["approvalId"] != rec.ID {
		t.Fatalf("approval_requested %+v", evs[1])
	}
	if evs[2].Actor != audit.ActorOf(bobApprover) || evs[2].Data["approvalId"] != rec.ID || evs[2].InputHash != rec.InputHash {
		t.Fatalf("approved %+v", evs[2])
	}
	evs = want(done.ExecutionID, audit.EventRequested, audit.EventApprovalConsumed, audit.EventStarted, audit.EventCompleted)
	if evs[1].Actor != audit.ActorOf(alice) || evs[1].Data["approvalId"] != rec.ID || evs[1].Data["approver"] != "user:bob" ||
		evs[1].Data["requestedBy"] != first.ExecutionID || evs[2].Data["approvalId"] != rec.ID || evs[1].InputHash != rec.InputHash {
		t.Fatalf("resume trail %+v", evs)
	}
	again, err := c.Resume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	evs = want(again.ExecutionID, audit.EventRequested, audit.EventDenied, audit.EventFailed)
	if evs[1].Data["reason"] != "approval-consumed" || evs[1].Data["publicCode"] != string(envelope.CodeApprovalConsumed) {
		t.Fatalf("denied %+v", evs[1])
	}
	evs = want(rejected.RequestedBy, audit.EventRequested, audit.EventApprovalRequested, audit.EventRejected)
	if evs[2].Actor != audit.ActorOf(bobApprover) {
		t.Fatalf("rejected %+v", evs[2])
	}
}

// approvalTrail reads an execution's trail once it holds at least n events
// (events are stored asynchronously).
func approvalTrail(t *testing.T, b *broker.Broker, executionID string, n int) []audit.Event {
	t.Helper()
	ctx := ctxT(t)
	for {
		trail, err := audit.Read(ctx, b.NC, b.Names.Prefix(), broker.Anonymous, executionID)
		if err != nil && !errors.Is(err, broker.ErrNotFound) {
			t.Fatal(err)
		}
		if len(trail) >= n {
			return trail
		}
		select {
		case <-ctx.Done():
			t.Fatalf("trail of %s: %d events, want %d", executionID, len(trail), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ---- worker processes ----

// Environment of a worker process started by running this test binary again.
const (
	workerProcessURL   = "CAPSTAN_TEST_APPROVALS_WORKER_URL"
	workerProcessID    = "CAPSTAN_TEST_APPROVALS_WORKER_ID"
	workerProcessLease = "CAPSTAN_TEST_APPROVALS_WORKER_LEASE"
)

// TestApprovalWorkerProcess is no test of its own: it is the worker process
// that other tests start, and kill, by running this test binary again.
func TestApprovalWorkerProcess(t *testing.T) {
	url := os.Getenv(workerProcessURL)
	if url == "" {
		t.Skip("runs only as a worker process of another test")
	}
	nc, err := nats.Connect(url, nats.Name(os.Getenv(workerProcessID)), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := executor.NewRegistry(vaultCatalog(js)...)
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := time.ParseDuration(os.Getenv(workerProcessLease))
	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: vaultPool, ID: os.Getenv(workerProcessID),
		Lease: lease, Concurrency: 8, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// workerProcess starts a worker process serving the vault; it is killed when
// the test ends. Its output goes to the test log.
func workerProcess(t *testing.T, url, id string, lease time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestApprovalWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), workerProcessURL+"="+url, workerProcessID+"="+id, workerProcessLease+"="+lease.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A race the worker process reports fails the test, even one that
	// otherwise passed.
	races := 0
	read := make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(out)
		for s.Scan() {
			line := s.Text()
			if strings.Contains(line, "WARNING: DATA RACE") {
				races++
			}
			if line != "PASS" && line != "" {
				t.Logf("%s: %s", id, line)
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-read
		_ = cmd.Wait()
		if races > 0 {
			t.Errorf("worker process %s reported %d data races", id, races)
		}
	})
	return cmd
}

// waitProcessesServing waits until every named worker connection has
// subscribed to cancel requests, which a worker does just before it pulls.
func waitProcessesServing(t *testing.T, s *server.Server, ids ...string) {
	t.Helper()
	ctx := ctxT(t)
	cancelSubjects := broker.NewNames("").CancelSubjects()
	for {
		cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true, Limit: 1024})
		if err != nil {
			t.Fatal(err)
		}
		serving := map[string]bool{}
		for _, ci := range cz.Conns {
			for _, sub := range ci.Subs {
				if sub == cancelSubjects {
					serving[ci.Name] = true
				}
			}
		}
		all := true
		for _, id := range ids {
			all = all && serving[id]
		}
		if all {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("worker processes not serving: %v of %v", serving, ids)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// However many executions race to resume one approval, from how many
// clients and worker processes, exactly one runs it: 50 goroutines over 5
// client connections resume at once, 3 worker processes serve them; one
// handler call, 49 APPROVAL_CONSUMED. Repeated 100 times.
func TestSI5_ResumeRace_ExactlyOneExecutionRunsTheApproval(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	env, js := vaultEnv(t)
	ids := []string{"approvals-race-w1", "approvals-race-w2", "approvals-race-w3"}
	for _, id := range ids {
		workerProcess(t, env.URL, id, 30*time.Second)
	}
	waitProcessesServing(t, env.Server, ids...)
	clients := make([]*executor.Client, 5)
	for i := range clients {
		clients[i] = newClient(t, env.Connect(t))
	}
	const rounds, racers = 100, 50
	finalizers := map[string]int{}
	for round := 0; round < rounds; round++ {
		_, rec := requireApproval(t, clients[0], "vault.transfer", vaultInput{Account: "a1", Amount: int64(round + 1)}, executor.As(alice))
		decide(t, clients[1], rec.ID, true)

		ctx := ctxT(t)
		envs := make([]*envelope.Envelope, racers)
		errs := make([]error, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				envs[i], errs[i] = clients[i%len(clients)].Resume(ctx, rec.ID)
			}()
		}
		close(start)
		wg.Wait()

		completed := ""
		for i, e := range envs {
			if errs[i] != nil {
				t.Fatalf("round %d: resume %d: %v", round, i, errs[i])
			}
			finalizers[e.FinalizedBy]++
			switch {
			case e.Status == envelope.StatusCompleted && completed != "":
				t.Fatalf("round %d: executions %s and %s both completed", round, completed, e.ExecutionID)
			case e.Status == envelope.StatusCompleted:
				completed = e.ExecutionID
			case e.Status != envelope.StatusFailed || e.Error == nil || e.Error.Code != envelope.CodeApprovalConsumed:
				t.Fatalf("round %d: %s %+v", round, e.Status, e.Error)
			}
		}
		a, err := clients[2].Approval(ctxT(t), rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if completed == "" || a.ConsumedBy != completed {
			t.Fatalf("round %d: completed %q, approval consumed by %q", round, completed, a.ConsumedBy)
		}
		if n := effects(t, js, rec.ID); n != 1 {
			t.Fatalf("round %d: %d handler calls", round, n)
		}
	}
	t.Logf("envelopes finalized per worker process: %v", finalizers)
	if len(finalizers) < 2 {
		t.Fatalf("only %v finalized: the worker processes did not race", finalizers)
	}
}

// A worker killed while the resumed execution's handler runs: the takeover
// finishes the execution with the approval it already consumed, never asking
// for a new one. A non-idempotent handler is not attempted again (its outcome
// is unknown); an idempotent one is, still authorized by the same approval.
func TestResume_WorkerKilledMidHandler_TakeoverNeedsNoNewApproval(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills worker processes")
	}
	const lease = 2 * time.Second
	for _, tc := range []struct {
		capID    string
		status   envelope.Status
		code     envelope.Code
		attempts int
		calls    int
		events   int // requested, approval.consumed, started, taken_over, [retried, started,] the end
	}{
		{"vault.transfer", envelope.StatusFailed, envelope.CodeOutcomeUnknown, 1, 1, 5},
		{"vault.refund", envelope.StatusCompleted, "", 2, 2, 7},
	} {
		t.Run(tc.capID, func(t *testing.T) {
			env, js := vaultEnv(t)
			c := newClient(t, env.Connect(t))
			victim := workerProcess(t, env.URL, "approvals-victim", lease)
			waitProcessesServing(t, env.Server, "approvals-victim")

			_, rec := requireApproval(t, c, tc.capID, vaultInput{Account: "a1", Amount: 10, HoldMs: 600_000}, executor.As(alice))
			decide(t, c, rec.ID, true)
			execID, err := c.SubmitResume(ctxT(t), rec.ID)
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the handler's effect", func() bool { return effects(t, js, rec.ID) > 0 })
			if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = victim.Wait()

			w := startVault(t, env.Connect(t), js, executor.WorkerConfig{Lease: lease})
			got, err := c.Await(ctxT(t), execID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.status || got.Attempts != tc.attempts || (tc.code != "" && (got.Error == nil || got.Error.Code != tc.code)) {
				t.Fatalf("envelope %s attempts %d error %+v", got.Status, got.Attempts, got.Error)
			}
			if got.FinalizedBy != w.ID() {
				t.Fatalf("finalized by %s, not the takeover", got.FinalizedBy)
			}
			if n := effects(t, js, rec.ID); n != tc.calls {
				t.Fatalf("%d handler calls, want %d", n, tc.calls)
			}
			if tc.status == envelope.StatusCompleted {
				var out vaultOutput
				if err := got.Output.Decode(&out); err != nil || out.ApprovalID != rec.ID || out.Approver != "user:bob" ||
					out.Attempt != 2 || !out.Repeated {
					t.Fatalf("the takeover's handler saw %+v (%v)", out, err)
				}
			}
			a, _ := c.Approval(ctxT(t), rec.ID)
			all, _ := approvalstore.NewStore(testhooks.Broker(c).Approvals, nil).List(ctxT(t), approvalstore.Filter{})
			if a.Status != approvals.StatusConsumed || a.ConsumedBy != execID || len(all) != 1 {
				t.Fatalf("approval %+v; %d approvals in the bucket", a, len(all))
			}
			var consumed, takenOver int
			for _, ev := range approvalTrail(t, testhooks.Broker(c), execID, tc.events) {
				switch ev.Type {
				case audit.EventApprovalConsumed:
					consumed++
				case audit.EventTakenOver:
					takenOver++
				}
			}
			if consumed != 1 || takenOver != 1 {
				t.Fatalf("approval.consumed %d times, execution.taken_over %d times", consumed, takenOver)
			}
		})
	}
}
