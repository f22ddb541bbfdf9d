package executor

import (
	"fmt"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"

	"github.com/capstan-dev/capstan/internal/limits"
)

// LimitKind is what a limit bounds (DESIGN §17).
type LimitKind string

// Kinds of limits.
const (
	// LimitConcurrency bounds the attempts running at once across every
	// worker of the deployment.
	LimitConcurrency LimitKind = "concurrency"
	// LimitRate bounds the executions started per interval.
	LimitRate LimitKind = "rate"
	// LimitBudget bounds the sum, over a window, of a number the capability
	// takes from each input (a refund's amount, a mail's recipients).
	LimitBudget LimitKind = "budget"
)

// LimitPer is whose usage a limit counts.
type LimitPer string

// Whose usage a limit counts. The zero value is the capability's own.
const (
	LimitPerCapability LimitPer = "capability"
	LimitPerActor      LimitPer = "actor"
	LimitPerPrincipal  LimitPer = "principal"
)

// AtLimit is what an execution over a limit does: the capability's choice.
type AtLimit string

// Choices at a limit. The zero value is AtLimitWait.
const (
	// AtLimitWait leaves the request in its queue, tried again later, until
	// its start deadline: then it ends NOT_STARTED.
	AtLimitWait AtLimit = "wait"
	// AtLimitRefuse ends the execution at once, RATE_LIMITED, with a
	// retryAfter the model is shown.
	AtLimitRefuse AtLimit = "refuse"
	// AtLimitApproval (budgets only) asks a human instead of refusing; the
	// approval binds the input, and so the amount (not the usage the
	// approver was shown: two approved calls over budget may both run).
	AtLimitApproval AtLimit = "approval"
)

// Limit is one limit a capability declares on its Meta: the most attempts
// running at once, a rate, or a budget.
//
//	Limits: []executor.Limit{
//		{Kind: executor.LimitConcurrency, Max: 4, PrincipalMax: 3},
//		{Kind: executor.LimitConcurrency, Per: executor.LimitPerActor, Max: 1},
//		{Kind: executor.LimitRate, Per: executor.LimitPerActor, Max: 10, Interval: time.Minute, AtLimit: executor.AtLimitRefuse},
//		{Kind: executor.LimitBudget, Per: executor.LimitPerActor, Name: "amount", Max: 2000, Interval: 24 * time.Hour,
//			Amount: func(in any) (int64, error) { return in.(*Refund).Amount, nil }, AtLimit: executor.AtLimitApproval},
//	}
type Limit struct {
	// Kind is LimitConcurrency, LimitRate or LimitBudget; required.
	Kind LimitKind
	// Per is whose usage is counted: the capability's (zero value), each
	// principal's, or each actor's. An actor is counted within its
	// principal: two principals' actors of one name (two gateways'
	// user:123) have two counters.
	Per LimitPer
	// Max is the slots, the executions per Interval, or the budget's sum
	// over Interval.
	Max int64
	// PrincipalMax, on a concurrency limit of the capability's own (Per
	// unset), is the most of its Max slots one principal may hold at once:
	// the rest stay for the others, so that one principal's backlog of long
	// calls never holds every slot (Max 4, PrincipalMax 3: whatever one
	// principal sends, another's call finds a slot). 0: no share but Max.
	PrincipalMax int64
	// Interval is a rate's interval or a budget's window.
	Interval time.Duration
	// Name names a budget's number ("amount", "recipients"): describe,
	// `capstan limits` and approvers show it.
	Name string
	// Amount takes a budget's number from the validated input (a pointer to
	// the input type). An error, a panic or a negative number refuses the
	// call (INPUT_INVALID).
	Amount func(in any) (int64, error)
	// AtLimit is what a call over the limit does. Default AtLimitWait.
	AtLimit AtLimit
}

// LimitInfo is a limit as describe and the catalog show it.
type LimitInfo struct {
	Kind       LimitKind `json:"kind"`                 // Limit.Kind
	Per        LimitPer  `json:"per,omitempty"`        // Limit.Per, the default applied; empty for a concurrency limit
	Name       string    `json:"name,omitempty"`       // Limit.Name, a budget's number
	Max        int64     `json:"max"`                  // Limit.Max
	IntervalMs int64     `json:"intervalMs,omitempty"` // Limit.Interval in milliseconds; 0 for a concurrency limit
	AtLimit    AtLimit   `json:"atLimit"`              // Limit.AtLimit, the default applied
	// Text says it in words: "at most 4 running at once", "10 per 1m per
	// actor", "amount 2000 per 24h per actor".
	Text string `json:"text"`
	// PrincipalMax is Limit.PrincipalMax: the most slots one principal
	// holds of a concurrency limit.
	PrincipalMax int64 `json:"principalMax,omitempty"`
}

func (l Limit) per() LimitPer {
	if l.Per == "" {
		return LimitPerCapability
	}
	return l.Per
}

func (l Limit) atLimit() AtLimit {
	if l.AtLimit == "" {
		return AtLimitWait
	}
	return l.AtLimit
}

// info is how describe shows l.
func (l Limit) info(capability string) LimitInfo {
	li := LimitInfo{Kind: l.Kind, Name: l.Name, Max: l.Max, IntervalMs: l.Interval.Milliseconds(), AtLimit: l.atLimit(),
		Text: l.rule(capability, "").String(), PrincipalMax: l.PrincipalMax}
	if l.Kind != LimitConcurrency || l.per() != LimitPerCapability {
		li.Per = l.per()
	}
	return li
}

// rule is l as the limits' rules take it, for one execution: who is whose
// counter ("" for the capability's own).
func (l Limit) rule(capability, who string) limits.Limit {
	return limits.Limit{Kind: limits.Kind(l.Kind), Capability: capability, Per: limits.Per(l.per()), Who: who, Name: l.Name,
		Max: l.Max, Interval: l.Interval, PrincipalMax: l.PrincipalMax, Action: limits.Action(l.atLimit())}
}

func limitInfos(ls []Limit, capability string) []LimitInfo {
	if len(ls) == 0 {
		return nil
	}
	out := make([]LimitInfo, len(ls))
	for i, l := range ls {
		out[i] = l.info(capability)
	}
	return out
}

// validateLimits is what registration says of a capability's limits.
func validateLimits(ls []Limit) []string {
	var p []string
	seen := map[string]bool{}
	for i, l := range ls {
		at := fmt.Sprintf("limit #%d (%s)", i, l.Kind)
		switch l.Kind {
		case LimitConcurrency:
			if l.Interval != 0 || l.Amount != nil || l.Name != "" {
				p = append(p, at+": a concurrency limit has no interval, name or amount")
			}
			if l.PrincipalMax != 0 && l.per() != LimitPerCapability {
				p = append(p, at+": principalMax shares the capability's slots between principals; a limit per "+string(l.Per)+" is each one's already")
			}
			if l.PrincipalMax < 0 || l.PrincipalMax > l.Max {
				p = append(p, fmt.Sprintf("%s: principalMax %d is not between 1 and max %d", at, l.PrincipalMax, l.Max))
			}
		case LimitRate:
			if l.Amount != nil || l.Name != "" {
				p = append(p, at+": a rate has no name or amount")
			}
		case LimitBudget:
			if l.Amount == nil {
				p = append(p, at+": a budget needs an Amount function")
			}
			if !plainName(l.Name) {
				p = append(p, fmt.Sprintf("%s: a budget's name %q is not a plain name (letters, digits, '-', '_')", at, l.Name))
			}
		default:
			p = append(p, fmt.Sprintf("limit #%d: kind %q is not one of concurrency, rate, budget", i, l.Kind))
			continue
		}
		if l.Kind != LimitConcurrency && l.PrincipalMax != 0 {
			p = append(p, at+": only a concurrency limit has a principalMax")
		}
		switch l.per() {
		case LimitPerCapability, LimitPerActor, LimitPerPrincipal:
		default:
			p = append(p, fmt.Sprintf("%s: per %q is not one of capability, actor, principal", at, l.Per))
		}
		if l.Max <= 0 {
			p = append(p, fmt.Sprintf("%s: max %d is not positive", at, l.Max))
		}
		if l.Kind != LimitConcurrency && l.Interval < time.Second {
			p = append(p, fmt.Sprintf("%s: interval %v is under a second", at, l.Interval))
		}
		switch l.atLimit() {
		case AtLimitWait, AtLimitRefuse:
		case AtLimitApproval:
			if l.Kind != LimitBudget {
				p = append(p, at+": only a budget may require an approval at its limit")
			}
		default:
			p = append(p, fmt.Sprintf("%s: atLimit %q is not one of wait, refuse, approval", at, l.AtLimit))
		}
		key := string(l.Kind) + "/" + string(l.per()) + "/" + l.Name
		if seen[key] {
			p = append(p, at+": declared twice")
		}
		seen[key] = true
	}
	return p
}

func plainName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) < 0
}

// limits are the capability's limits as they apply to this execution: the
// actor's and principal's counters (an actor's within its principal), a
// budget's amount taken from the input.
// An amount that cannot be taken refuses the call (INPUT_INVALID). A
// takeover takes its slot again and nothing else (its rates and budgets were
// taken when it first started): it gets the concurrency limits alone, and
// no budget's Amount is asked.
func (a *admission) limits(takeover bool) ([]limits.Limit, *envelope.CapabilityError) {
	ls := a.b.meta.Limits
	if len(ls) == 0 {
		return nil, nil
	}
	out := make([]limits.Limit, 0, len(ls))
	for _, l := range ls {
		if takeover && l.Kind != LimitConcurrency {
			continue
		}
		who := ""
		switch l.per() {
		case LimitPerActor:
			who = limits.ActorWho(a.r.Principal, string(a.req.Actor.Kind)+":"+a.req.Actor.ID)
		case LimitPerPrincipal:
			who = a.r.Principal
		}
		r := l.rule(a.b.id, who)
		if l.Kind == LimitBudget {
			n, err := amountOf(l, a.input)
			if err != nil {
				return nil, &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput, ExposeToModel: true,
					Message: "The input is invalid.", Cause: err,
					Details: map[string]any{"issues": []envelope.Issue{{Message: "the " + l.Name + " it sets cannot be counted: " + err.Error()}}}}
			}
			r.Amount = n
		}
		out = append(out, r)
	}
	return out, nil
}

// amountOf asks a budget's Amount function, failing closed on a panic or a
// negative number.
func amountOf(l Limit, in any) (n int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("amount function panicked: %v", r)
		}
	}()
	if n, err = l.Amount(in); err == nil && n < 0 {
		err = fmt.Errorf("%s %d is negative", l.Name, n)
	}
	return n, err
}

// needsBudgetApproval reports whether a budget of the capability asks for
// an approval at its limit.
func (b *binding) needsBudgetApproval() bool {
	for _, l := range b.meta.Limits {
		if l.Kind == LimitBudget && l.atLimit() == AtLimitApproval {
			return true
		}
	}
	return false
}
