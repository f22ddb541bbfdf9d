package notify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
)

// PayloadVersion is the version of Payload's shape.
const PayloadVersion = 1

// Payload is the JSON body a webhook channel posts. Its IdempotencyKey is
// also in the Capstan-Idempotency-Key header; a receiver that has seen a key
// drops the delivery (it is at least once: a notifier that stopped
// mid-delivery sends again, with the same key).
type Payload struct {
	// V is PayloadVersion.
	V int `json:"v"`
	// IdempotencyKey names this event of this approval: the same on every
	// delivery of it.
	IdempotencyKey string `json:"idempotencyKey"`
	// Event is "approval." + the Event: approval.requested,
	// approval.approved, approval.rejected, approval.cancelled,
	// approval.expired.
	Event string `json:"event"`
	// OccurredAt is when the event happened: the request, the decision or
	// the expiry.
	OccurredAt time.Time `json:"occurredAt"`
	// URL is the approval's page in the console, when one is configured.
	URL string `json:"url,omitempty"`
	// Approval is the approval as of the event.
	Approval Approval `json:"approval"`
}

// maxInput is the largest input a webhook payload carries; a larger one is
// left out and its size given in inputOmittedBytes.
const maxInput = 64 << 10

// Approval is an approval as a notification shows it. Input is what an
// approver is shown: the capability's redacted display when it declares one
// (InputRedacted), and never then the input itself.
type Approval struct {
	// ID is the approval's.
	ID string `json:"id"`
	// CapabilityID, Surface and Actor are the call's: what it calls, where
	// it came from, who it runs for (the requester).
	CapabilityID string         `json:"capabilityId"`
	Surface      string         `json:"surface,omitempty"` // "direct", "mcp" or "http"
	Actor        envelope.Actor `json:"actor"`             // who the call runs for, not the approver
	// Principal is the authenticated principal that requested the call.
	Principal string `json:"principal,omitempty"`
	// Types are the kinds of approver that may decide it.
	Types []string `json:"types,omitempty"`
	// Reasons say why an approval is needed.
	Reasons []string `json:"reasons,omitempty"`
	// Risk and SideEffect are the capability's.
	Risk       string `json:"risk,omitempty"`
	SideEffect string `json:"sideEffect,omitempty"` // none, read, write, destructive or external
	// RequestedAt is when the call asked; ExpiresAt when the approval
	// stops being decidable or, once approved, consumable.
	RequestedAt time.Time `json:"requestedAt"`
	ExpiresAt   time.Time `json:"expiresAt"` // see RequestedAt
	// Status is the approval's status as of the event.
	Status approvals.Status `json:"status"`
	// Decision is the approver's, on a decision's event.
	Decision *Decision `json:"decision,omitempty"`
	// RequestedBy is the execution that asked; CorrelationID its.
	RequestedBy   string `json:"requestedBy"`
	CorrelationID string `json:"correlationId,omitempty"` // the requesting execution's; empty for none
	// InputHash is the SHA-256 of the whole input the approval binds.
	InputHash string `json:"inputHash"`
	// Input is what an approver is shown of it (canonical JSON), left out
	// beyond maxInput; InputRedacted says it is the capability's display,
	// InputOmittedBytes how large what was left out is.
	Input             json.RawMessage `json:"input,omitempty"`
	InputRedacted     bool            `json:"inputRedacted,omitempty"`     // Input is the capability's display, not the input
	InputOmittedBytes int             `json:"inputOmittedBytes,omitempty"` // the size of an Input left out; 0 when it is there
}

// Decision is who decided an approval, when and why.
type Decision struct {
	// Status is approved, rejected or cancelled.
	Status approvals.Status `json:"status"`
	// Approver decided (or cancelled), at DecidedAt, with Comment.
	Approver  envelope.Actor `json:"approver"`
	Comment   string         `json:"comment,omitempty"` // the approver's comment; empty for none
	DecidedAt time.Time      `json:"decidedAt"`         // when the decision was recorded
}

// notification is one event of one approval, ready for every channel.
type notification struct {
	key   string
	event Event
	at    time.Time
	url   string
	rec   *approvals.Record
	// shown is what approvers see of the input (canonical JSON) and
	// whether the capability redacted it.
	shown    json.RawMessage
	redacted bool
}

func newNotification(r *approvals.Record, p plan, consoleURL string) *notification {
	n := &notification{key: Key(r.ID, p.event), event: p.event, at: p.at, rec: r, shown: r.Input}
	if len(r.Display) > 0 {
		n.shown, n.redacted = r.Display, true
	}
	if consoleURL != "" {
		n.url = strings.TrimSuffix(consoleURL, "/") + "/approvals/" + url.PathEscape(r.ID)
	}
	return n
}

// status is the approval's status as of the event.
func (n *notification) status() approvals.Status {
	if n.event == EventExpired {
		return approvals.StatusExpired
	}
	if n.event == EventRequested {
		return approvals.StatusPending
	}
	return n.rec.Status
}

func (n *notification) payload() Payload {
	r := n.rec
	a := Approval{
		ID: r.ID, CapabilityID: r.CapabilityID, Surface: r.Surface, Actor: r.Actor, Principal: r.Principal,
		Types: r.Types, Reasons: r.Reasons, Risk: r.Risk, SideEffect: r.SideEffect,
		RequestedAt: r.RequestedAt, ExpiresAt: r.ExpiresAt, Status: n.status(),
		RequestedBy: r.RequestedBy, CorrelationID: r.CorrelationID, InputHash: r.InputHash,
		InputRedacted: n.redacted,
	}
	if len(n.shown) <= maxInput {
		a.Input = n.shown
	} else {
		a.InputOmittedBytes = len(n.shown)
	}
	if d := r.Decision; d != nil && n.event != EventRequested && n.event != EventExpired {
		a.Decision = &Decision{Status: d.Status, Approver: d.Approver, Comment: d.Comment, DecidedAt: d.DecidedAt}
	}
	return Payload{V: PayloadVersion, IdempotencyKey: n.key, Event: "approval." + string(n.event), OccurredAt: n.at, URL: n.url, Approval: a}
}

// headline says what happened, in a few words.
func (n *notification) headline() string {
	r := n.rec
	switch n.event {
	case EventRequested:
		return "Approval requested"
	case EventApproved:
		return "Approved by " + r.Decision.Approver.String()
	case EventRejected:
		return "Rejected by " + r.Decision.Approver.String()
	case EventCancelled:
		return "Cancelled by " + r.Decision.Approver.String()
	case EventExpired:
		return "Expired without a decision"
	}
	return string(n.event)
}

// Limits of an input summary (Slack, email).
const (
	summaryFields = 8
	summaryValue  = 80
)

// summaryField is one line of an input summary.
type summaryField struct{ name, value string }

// summary is what approvers are shown of the input, as a few short fields:
// the top-level fields of an object (at most summaryFields, each value cut
// at summaryValue runes), or the value itself. more counts the fields left
// out.
func (n *notification) summary() (fields []summaryField, more int) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(n.shown, &obj) != nil || obj == nil {
		return []summaryField{{"input", cut(compact(n.shown), summaryValue*2)}}, 0
	}
	// The canonical form has its keys sorted: read them in that order.
	dec := json.NewDecoder(bytes.NewReader(n.shown))
	_, _ = dec.Token()
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			break
		}
		k, _ := t.(string)
		if len(fields) == summaryFields {
			more++
			continue
		}
		v := compact(obj[k])
		var s string
		if json.Unmarshal(obj[k], &s) == nil {
			v = s
		}
		fields = append(fields, summaryField{k, cut(v, summaryValue)})
	}
	return fields, more
}

func compact(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}

// cut shortens s to at most n runes, marking the cut, and makes it one line
// of valid UTF-8.
func cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// describeRequester is "user:alice" with the surface it called from.
func (n *notification) describeRequester() string {
	s := n.rec.Actor.String()
	if n.rec.Surface != "" {
		s += fmt.Sprintf(" (via %s)", n.rec.Surface)
	}
	return s
}
