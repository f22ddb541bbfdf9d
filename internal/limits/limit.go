package limits

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Kind is what a limit bounds.
type Kind string

// Kinds of limits.
const (
	// Concurrency bounds the attempts running at once across the deployment.
	Concurrency Kind = "concurrency"
	// Rate bounds the executions started per interval.
	Rate Kind = "rate"
	// Budget bounds the sum of a number the inputs carry over a window.
	Budget Kind = "budget"
)

// Per is whose usage a limit counts.
type Per string

// Whose usage a limit counts.
const (
	PerCapability Per = "capability"
	PerActor      Per = "actor"
	PerPrincipal  Per = "principal"
)

// Action is what an execution over a limit does.
type Action string

// Actions at a limit.
const (
	// Wait: the request goes back to its queue with a delay, and ends
	// NOT_STARTED if its start deadline passes first.
	Wait Action = "wait"
	// Refuse: the execution ends RATE_LIMITED with a retryAfter.
	Refuse Action = "refuse"
	// Approve: a budget over its maximum asks a human; the approval binds
	// the amount (it is in the input), not the usage the approver was shown.
	Approve Action = "approval"
)

// Limit is one limit as it applies to one execution: which counter, its
// bound, and what to do over it.
type Limit struct {
	Kind       Kind
	Capability string
	Per        Per
	// Who is whose counter: the principal, or the actor as ActorWho makes
	// it (its principal's and its kind:id together); empty for a
	// capability's own.
	Who string
	// Name names a budget's number ("amount", "recipients").
	Name string
	// Max is the slots, the executions per Interval, or the budget's sum
	// over Interval.
	Max      int64
	Interval time.Duration
	// PrincipalMax, on a concurrency limit of the capability's own, bounds
	// the slots one principal may hold at once: the others always find
	// Max − PrincipalMax of them out of its reach. 0: no bound but Max.
	PrincipalMax int64
	// Amount is what this execution adds to a budget.
	Amount int64
	Action Action
}

// Key is the limit's counter in the limits bucket. Actors and principals are
// hashed: a key is a subject, and an actor's id may hold any printable
// character; the value names them in full.
// An empty Per is the capability's own, as in String.
func (l Limit) Key() string {
	per := string(l.Per)
	if per == "" {
		per = string(PerCapability)
	}
	switch l.Kind {
	case Concurrency:
		if per == string(PerCapability) {
			return SlotsKey(l.Capability)
		}
		return "s." + per[:1] + "." + whoToken(l.Who) + "." + l.Capability
	case Rate:
		return "r." + per[:1] + "." + whoToken(l.Who) + "." + l.Capability
	default:
		return "b." + per[:1] + "." + whoToken(l.Who) + "." + l.Name + "." + l.Capability
	}
}

// SlotsKey is the key of capability's concurrency slots (its own, not a
// principal's or an actor's).
func SlotsKey(capability string) string { return "c." + capability }

// ActorWho is whose counter an actor's is: its principal's and its own
// (kind:id) together, "alice/user:123", so that two principals' actors of
// one name (two gateways' user:123) count apart. A principal is one subject
// token and holds no "/".
func ActorWho(principal, actor string) string { return principal + "/" + actor }

// whoToken is a subject token standing for who: "_" for nobody, else the
// first 16 bytes of its SHA-256, in hex.
func whoToken(who string) string {
	if who == "" {
		return "_"
	}
	h := sha256.Sum256([]byte(who))
	return hex.EncodeToString(h[:16])
}

// String describes the limit as operators, approvers and models read it:
// "at most 2 running at once", "5 per 1m per actor", "amount 2000 per 24h0m0s
// per actor".
func (l Limit) String() string {
	switch l.Kind {
	case Concurrency:
		s := fmt.Sprintf("at most %d running at once%s", l.Max, perText(l.Per))
		if l.PrincipalMax > 0 {
			s += fmt.Sprintf(", %d per principal", l.PrincipalMax)
		}
		return s
	case Rate:
		return fmt.Sprintf("%d per %s%s", l.Max, Interval(l.Interval), perText(l.Per))
	default:
		return fmt.Sprintf("%s %d per %s%s", l.Name, l.Max, Interval(l.Interval), perText(l.Per))
	}
}

func perText(p Per) string {
	if p == PerCapability || p == "" {
		return ""
	}
	return " per " + string(p)
}

// Interval writes an interval the way people say it: 1s, 1m, 1h, 24h,
// 1h30m.
func Interval(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if strings.HasSuffix(s, "m"+zero) || strings.HasSuffix(s, "h"+zero) {
			s = strings.TrimSuffix(s, zero)
		}
	}
	return s
}
