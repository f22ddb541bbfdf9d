package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/execrpc"
)

// Discovery tells a surface and an actor which capabilities they may see:
// those exposed on the surface (deny by default) that no discovery-phase
// policy denies or hides, each with its descriptor and the JSON Schema of its
// input. Producers ask any worker, over the core NATS request
// capstan.describe, answered by one worker of the queue group.
//
// The answering worker reads the catalog, which lists every pool's
// capabilities, so exposure and schemas are complete whichever worker
// answers. Policies are not in the catalog: the worker applies its own
// runtime-level policies (WorkerConfig.Policies) to every capability, and a
// capability's own discovery-phase policies only when the capability is in
// its registry. Give every pool the same runtime-level policies, and express
// visibility rules that must hold in every listing as runtime-level policies.
// Execution does not depend on the listing: the worker serving a call applies
// exposure and all discovery-phase policies again at stage 4 (SI-2).

// Scope narrows a description to part of the catalog. The zero value is the
// whole catalog.
type Scope struct {
	// Prefix keeps the capabilities whose id starts with it, e.g. "orders.".
	Prefix string `json:"prefix,omitempty"`
	// Tags keeps the capabilities carrying every one of these tags.
	Tags []string `json:"tags,omitempty"`
}

func (s Scope) has(d Descriptor) bool {
	if !strings.HasPrefix(d.ID, s.Prefix) {
		return false
	}
	for _, t := range s.Tags {
		if !slices.Contains(d.Tags, t) {
			return false
		}
	}
	return true
}

// DescribeRequest is the msgpack body of a capstan.describe request.
type DescribeRequest struct {
	// V is the body's schema version.
	V int `json:"v"`
	// Surface and Actor are whose view is asked for.
	Surface Surface        `json:"surface"`
	Actor   envelope.Actor `json:"actor"` // Client.Describe sends its own actor for a zero one
	// Scope narrows the listing.
	Scope Scope `json:"scope"`
	// Queue asks for the principal's queue instead of the catalog: what it
	// holds and may hold (Discovery.Queue), nothing else, nothing audited.
	Queue bool `json:"queue,omitempty"`
}

// Discovery is what a surface and actor may see of the catalog.
type Discovery struct {
	// V is the body's schema version.
	V int `json:"v"`
	// ID names this discovery on the audit trail (its capabilities.discovered
	// event is filed under it).
	ID string `json:"id"`
	// Surface is the surface described.
	Surface Surface `json:"surface"`
	// Capabilities are sorted by id.
	Capabilities []Descriptor `json:"capabilities"`
	// Digest is the hex SHA-256 of the listed ids, sorted, one per line: it
	// changes when the set of visible capabilities does.
	Digest string `json:"digest"`
	// Worker is the worker that answered.
	Worker string `json:"worker,omitempty"`
	// Queue is the principal's queue, for a request that asked for it
	// (DescribeRequest.Queue), which lists no capabilities.
	Queue *envelope.QueueUsage `json:"queue,omitempty"`
}

// DescribeReply is the msgpack body of a capstan.describe answer: the
// discovery, or the error that refused it.
type DescribeReply struct {
	Discovery
	// Error is the refusal, if the description was refused.
	Error *envelope.Error `json:"error,omitempty"`
}

// discoveryWorkers bounds how many capabilities one description evaluates
// policies for at once.
const discoveryWorkers = 8

// serveDescribe answers one capstan.describe request.
func (w *Worker) serveDescribe(m *nats.Msg) {
	if !w.b.Names.ReplyAllowed(w.b.Names.PrincipalOfSubject(m.Subject), m.Reply) {
		return // an answer aimed at someone else's subject: not served
	}
	var reply DescribeReply
	var req DescribeRequest
	if err := envelope.Unmarshal(m.Data, &req); err != nil {
		reply.V = envelope.Version
		reply.Error = &envelope.Error{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
			Message: "The describe request does not decode."}
	} else if req.Queue {
		reply = w.describeQueue(w.b.Names.PrincipalOfSubject(m.Subject))
	} else {
		reply = w.describe(w.b.Names.PrincipalOfSubject(m.Subject), &req)
	}
	b, err := envelope.Marshal(&reply)
	if err != nil {
		w.log.Error("describe reply does not encode", "err", err)
		return
	}
	if bound := w.replyBound(w.b.Names.PrincipalOfSubject(m.Subject)); len(b) > bound {
		// Never dropped for its size: the refusal says how to ask for less.
		refusal := DescribeReply{Discovery: Discovery{V: envelope.Version, ID: reply.ID, Surface: reply.Surface,
			Capabilities: []Descriptor{}, Worker: w.cfg.ID}, Error: &envelope.Error{Code: envelope.CodeInputInvalid,
			Stage: envelope.StageInput, ExposeToModel: true,
			Message: fmt.Sprintf("The description of %d capabilities is %d bytes, over the %d a reply may hold: narrow its scope (a prefix or tags).",
				len(reply.Capabilities), len(b), bound)}}
		if b, err = envelope.Marshal(&refusal); err != nil {
			return
		}
	}
	_ = m.Respond(b)
}

// describeQueue answers what principal's queue holds and may hold (DESIGN
// §12 "Quotas"): its own stream's figures, read from the server.
func (w *Worker) describeQueue(principal string) DescribeReply {
	reply := DescribeReply{Discovery: Discovery{V: envelope.Version, Worker: w.cfg.ID}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := w.b.QueueUsageOf(ctx, principal)
	if err != nil {
		w.log.Warn("queue not read", "principal", principal, "err", err)
		reply.Error = &envelope.Error{Code: envelope.CodeInternalError, Stage: envelope.StageQueue,
			Message: "The queue could not be read."}
		return reply
	}
	reply.Queue = &u
	return reply
}

// describe filters the catalog for one principal, surface, actor and scope,
// and files the result on the trail with the true reason of every policy
// withholding. The actor and surface must be within the principal's grant,
// and only the capabilities it may call are listed.
func (w *Worker) describe(principal string, req *DescribeRequest) DescribeReply {
	reply := DescribeReply{Discovery: Discovery{V: envelope.Version, ID: envelope.NewExecutionID(), Surface: req.Surface,
		Capabilities: []Descriptor{}, Worker: w.cfg.ID}}
	ev := &audit.Event{Type: audit.EventDiscovered, Surface: string(req.Surface), Actor: audit.ActorOf(req.Actor),
		Principal: principal, ExecutionID: reply.ID}
	if cerr := checkActor(req.Actor); cerr != nil {
		reply.Error = cerr.Wire()
		ev.Data = map[string]any{"refused": string(cerr.Code), "count": 0}
		w.fileReadOnly(ev)
		return reply
	}
	// The actor and surface: as a call of a capability the grant allows.
	grant, granted := w.grants.Lookup(principal)
	if err := w.grants.CheckRequest(principal, req.Actor, string(req.Surface), "*"); err != nil {
		var cerr *envelope.CapabilityError
		if errors.As(err, &cerr) && !errors.Is(err, auth.ErrCapabilityNotGranted) {
			reply.Error = cerr.Wire()
			ev.Data = map[string]any{"refused": string(cerr.Code), "reason": cerr.Cause.Error(), "count": 0}
			w.fileReadOnly(ev)
			return reply
		}
	}
	var candidates []Descriptor
	for _, d := range w.cat.all() {
		if granted && !grant.AllowsCapability(d.ID) {
			continue
		}
		if Exposure(d.Expose).Has(req.Surface) && req.Scope.has(d) {
			candidates = append(candidates, d)
		}
	}
	sortDescriptors(candidates)

	type judged struct {
		d Descriptor
		v verdict
	}
	results := make([]judged, len(candidates))
	sem := make(chan struct{}, discoveryWorkers)
	var wg sync.WaitGroup
	for i, d := range candidates {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = judged{d: d, v: w.discoveryVerdict(d, req)}
		}()
	}
	wg.Wait()

	var withheld []map[string]any
	ids := make([]string, 0, len(results))
	for _, r := range results {
		switch {
		case r.v.failed, r.v.stance == StanceDeny, r.v.stance == StanceHide:
			reason := "policy-hidden"
			if r.v.failed {
				reason = "policy-failed"
			} else if r.v.stance == StanceDeny {
				reason = "policy-denied"
			}
			withheld = append(withheld, map[string]any{"capabilityId": r.d.ID, "reason": reason, "policyDecisions": r.v.records})
			continue
		case r.v.stance == StanceRequireApproval:
			r.d.RequiresApproval = true
		}
		r.d.Paused = pauseInfo(w.pauseOf(principal, r.d.ID, req.Actor))
		reply.Capabilities = append(reply.Capabilities, r.d)
		ids = append(ids, r.d.ID)
	}
	reply.Digest = discoveryDigest(ids)
	ev.Data = map[string]any{"count": len(ids), "digest": reply.Digest}
	if req.Scope.Prefix != "" || len(req.Scope.Tags) > 0 {
		ev.Data["scope"] = req.Scope
	}
	if len(withheld) > 0 {
		ev.Data["withheld"] = withheld
	}
	w.fileReadOnly(ev)
	return reply
}

// discoveryVerdict runs the discovery-phase policies this worker knows for d:
// the runtime's, and d's own when d is in this worker's registry.
func (w *Worker) discoveryVerdict(d Descriptor, req *DescribeRequest) verdict {
	meta := metaOf(d)
	var own []Policy
	if b := w.reg.get(d.ID); b != nil {
		meta, own = b.meta, b.meta.Policies
	}
	return evaluatePolicies(w.run.Context(), w.cfg.Policies, own, PolicyRequest{
		Phase: PhaseDiscovery, CapabilityID: d.ID, Meta: meta, Actor: req.Actor, Surface: req.Surface,
	}, w.cfg.PolicyTimeout)
}

// metaOf rebuilds what policies may read of a capability another pool serves.
func metaOf(d Descriptor) Meta {
	m := Meta{Description: d.Description, Expose: d.Expose, SideEffect: d.SideEffect, Risk: d.Risk, Tags: d.Tags,
		Timeout: time.Duration(d.TimeoutMs) * time.Millisecond, Idempotent: d.Idempotent}
	if d.RetryMaxAttempts > 0 {
		m.Retry = &Retry{MaxAttempts: d.RetryMaxAttempts}
	}
	if d.RequiresApproval {
		m.Approval = &ApprovalRule{Required: true}
	}
	return m
}

// discoveryDigest is the hex SHA-256 of the sorted ids, one per line.
func discoveryDigest(ids []string) string {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	h := sha256.New()
	for _, id := range sorted {
		h.Write([]byte(id))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Describe asks the workers which capabilities a surface and an actor may see
// within scope. An empty surface is the client's own; an actor left zero is
// the client's default actor. A malformed actor is refused with an
// UNAUTHENTICATED *envelope.CapabilityError. Every description is audited as
// capabilities.discovered under the returned Discovery's ID, unless its
// principal asked for the same description (or for 16 others) in the last
// 10 s: it is then counted in one event at the interval's end (DESIGN §8).
// Beyond its principal's controlPerSecond quota it is refused with a
// QUOTA_EXCEEDED *envelope.CapabilityError.
func (c *Client) Describe(ctx context.Context, surface Surface, actor envelope.Actor, scope Scope) (*Discovery, error) {
	if surface == "" {
		surface = c.cfg.Surface
	}
	if actor.Kind == "" && actor.ID == "" && len(actor.Attrs) == 0 {
		actor = c.cfg.Actor
	}
	r, err := c.describe(ctx, "describe", DescribeRequest{Surface: surface, Actor: actor, Scope: scope})
	if err != nil {
		return nil, err
	}
	if r.Capabilities == nil {
		r.Capabilities = []Descriptor{}
	}
	return &r.Discovery, nil
}

// Queue asks the workers what the client's principal has waiting in its
// queue and may have waiting (DESIGN §12 "Quotas"): the figures its queue's
// stream holds now, the limits the server enforces at every submit.
func (c *Client) Queue(ctx context.Context) (*envelope.QueueUsage, error) {
	r, err := c.describe(ctx, "queue", DescribeRequest{Queue: true})
	if err != nil {
		return nil, err
	}
	if r.Queue == nil {
		// A worker of an earlier version answered with the catalog.
		return nil, fmt.Errorf("capstan: queue: the worker that answered (%s) does not tell queues", r.Worker)
	}
	return r.Queue, nil
}

// describe sends req to the workers' describe subject (within 10 s unless
// ctx is bounded) and returns their reply; what names the request in errors.
func (c *Client) describe(ctx context.Context, what string, req DescribeRequest) (*DescribeReply, error) {
	req.V = envelope.Version
	b, err := envelope.Marshal(&req)
	if err != nil {
		return nil, fmt.Errorf("capstan: %s: %w", what, err)
	}
	data, err := execrpc.Request(ctx, c.b.NC, c.b.Names.DescribeSubject(c.principal), b, 10*time.Second, what)
	if err != nil {
		return nil, err
	}
	var r DescribeReply
	if err := envelope.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("capstan: %s: bad reply: %w", what, err)
	}
	if e := r.Error; e != nil {
		return nil, &envelope.CapabilityError{Code: e.Code, Message: e.Message, Stage: e.Stage, Retryable: e.Retryable,
			ExposeToModel: e.ExposeToModel, Details: e.Details}
	}
	return &r, nil
}

// nearName is the capability principal may call on req's surface as req's
// actor (its grant, the capability's exposure, the discovery policies: what
// describe would show it) whose id is nearest req's, when one is near enough
// to be a slip (an edit distance of at most a quarter of the id, and two at
// least) and no other is as near; "" otherwise. Another pool's capability
// is judged as describe judges it here: by the runtime's policies and its
// catalog entry.
func (w *Worker) nearName(principal string, req *envelope.Request) string {
	id := req.CapabilityID
	if id == "" || checkActor(req.Actor) != nil {
		return ""
	}
	grant, granted := w.grants.Lookup(principal)
	if !granted && !w.grants.Open() {
		return ""
	}
	best, bestD, ties := "", max(2, len(id)/4)+1, 0
	var found Descriptor
	for _, d := range w.cat.all() {
		// The id named itself is never a candidate: the answer for it is
		// then the same whether it exists (concealed) or not.
		if d.ID == id || granted && !grant.AllowsCapability(d.ID) || !Exposure(d.Expose).Has(Surface(req.Surface)) {
			continue
		}
		switch dist := editDistance(id, d.ID); {
		case dist < bestD:
			best, bestD, ties, found = d.ID, dist, 0, d
		case dist == bestD:
			ties++
		}
	}
	if best == "" || ties > 0 {
		return ""
	}
	v := w.discoveryVerdict(found, &DescribeRequest{Surface: Surface(req.Surface), Actor: req.Actor})
	if v.failed || v.stance == StanceDeny || v.stance == StanceHide {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
