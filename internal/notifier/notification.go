package notifier

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/notify"
)

// maxInput is the largest input a webhook payload carries; a larger one is
// left out and its size given in Approval.InputOmittedBytes.
const maxInput = 64 << 10

// notification is one event of one approval, ready for every channel.
type notification struct {
	key   string
	event notify.Event
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
	if n.event == notify.EventExpired {
		return approvals.StatusExpired
	}
	if n.event == notify.EventRequested {
		return approvals.StatusPending
	}
	return n.rec.Status
}

func (n *notification) payload() notify.Payload {
	r := n.rec
	a := notify.Approval{
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
	if d := r.Decision; d != nil && n.event != notify.EventRequested && n.event != notify.EventExpired {
		a.Decision = &notify.Decision{Status: d.Status, Approver: d.Approver, Comment: d.Comment, DecidedAt: d.DecidedAt}
	}
	return notify.Payload{V: notify.PayloadVersion, IdempotencyKey: n.key, Event: n.event, OccurredAt: n.at, URL: n.url, Approval: a}
}

// headline says what happened, in a few words.
func (n *notification) headline() string {
	r := n.rec
	switch n.event {
	case notify.EventRequested:
		return "Approval requested"
	case notify.EventApproved:
		return "Approved by " + r.Decision.Approver.String()
	case notify.EventRejected:
		return "Rejected by " + r.Decision.Approver.String()
	case notify.EventCancelled:
		return "Cancelled by " + r.Decision.Approver.String()
	case notify.EventExpired:
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
