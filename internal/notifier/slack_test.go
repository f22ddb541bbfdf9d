package notifier

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/notify"
)

// slackMessageBody is the part of an incoming webhook's body the tests read.
type slackMessageBody struct {
	Text   string `json:"text"`
	Blocks []struct {
		Type string `json:"type"`
		Text *struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"text"`
		Fields []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"fields"`
		Elements []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"elements"`
	} `json:"blocks"`
	UnfurlLinks *bool `json:"unfurl_links"`
}

// texts is every text of the message, one a line.
func (m slackMessageBody) texts() string {
	out := []string{m.Text}
	for _, b := range m.Blocks {
		if b.Text != nil {
			out = append(out, b.Text.Text)
		}
		for _, f := range b.Fields {
			out = append(out, f.Text)
		}
		for _, e := range b.Elements {
			out = append(out, e.Text)
		}
	}
	return strings.Join(out, "\n")
}

// slackShape checks a body as an incoming webhook does: a JSON object with a
// text, and blocks of known types within Slack's limits (a header's plain
// text of at most 150 characters, a section's text of at most 3,000 or at
// most 10 fields of 2,000, a context's at most 10 elements).
func slackShape(body []byte) error {
	var m slackMessageBody
	if err := json.Unmarshal(body, &m); err != nil {
		return fmt.Errorf("invalid_payload: %v", err)
	}
	if strings.TrimSpace(m.Text) == "" {
		return errors.New("no_text")
	}
	if len(m.Blocks) > 50 {
		return errors.New("invalid_blocks: more than 50")
	}
	for i, b := range m.Blocks {
		switch b.Type {
		case "header":
			if b.Text == nil || b.Text.Type != "plain_text" || utf8.RuneCountInString(b.Text.Text) > 150 {
				return fmt.Errorf("invalid_blocks: header %d", i)
			}
		case "section":
			if b.Text == nil && len(b.Fields) == 0 || len(b.Fields) > 10 {
				return fmt.Errorf("invalid_blocks: section %d", i)
			}
			if b.Text != nil && (utf8.RuneCountInString(b.Text.Text) > 3000 || b.Text.Text == "") {
				return fmt.Errorf("invalid_blocks: section %d text", i)
			}
			for _, f := range b.Fields {
				if f.Text == "" || utf8.RuneCountInString(f.Text) > 2000 || (f.Type != "plain_text" && f.Type != "mrkdwn") {
					return fmt.Errorf("invalid_blocks: section %d field", i)
				}
			}
		case "context":
			if len(b.Elements) == 0 || len(b.Elements) > 10 {
				return fmt.Errorf("invalid_blocks: context %d", i)
			}
		default:
			return fmt.Errorf("invalid_blocks: type %q", b.Type)
		}
	}
	return nil
}

func slackConfig(url string) Config {
	return Config{
		ConsoleURL: "https://console.example.com",
		Retry:      Retry{Attempts: 3, Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Channels:   []Channel{{Name: "payments-slack", Kind: KindSlack, Types: []string{"payments"}, URL: Secret(url)}},
	}
}

// A Slack message says what is asked, by whom and why, shows what
// approvers may see of the input, and links to the console; a capability
// that redacts the card number never has it sent, in any message. What the
// model wrote is plain text: no mention, no link, no markup.
func TestSlack_ShowsTheRedactedDisplayNeverTheInput(t *testing.T) {
	t.Parallel()
	r := newRig(t, charge())
	slack := newReceiver(t, "")
	var invalid []string
	var mu sync.Mutex
	slack.answer = func(_ int, d delivery) int {
		if err := slackShape(d.body); err != nil {
			mu.Lock()
			invalid = append(invalid, err.Error())
			mu.Unlock()
			return 400 // invalid_blocks, as Slack answers
		}
		return 200
	}
	n, _ := r.run(t, slackConfig(slack.url))

	id := r.request(t, "cards.charge", ChargeIn{Card: cardNumber, Amount: 4200, Note: "<!channel> see <https://evil.example|here>"})
	slack.waitKey(t, Key(id, notify.EventRequested))
	r.decide(t, id, false, "not this card")
	slack.waitKey(t, Key(id, notify.EventRejected))
	r.idle(t, n, 0)
	mu.Lock()
	if len(invalid) > 0 {
		t.Fatalf("messages Slack would refuse: %v", invalid)
	}
	mu.Unlock()

	for _, d := range slack.deliveries() {
		mustNotContain(t, "a Slack message", string(d.body), cardNumber, "411111")
		var m slackMessageBody
		if err := json.Unmarshal(d.body, &m); err != nil {
			t.Fatal(err)
		}
		if m.UnfurlLinks == nil || *m.UnfurlLinks {
			t.Errorf("links unfurl: %s", d.body)
		}
		for _, b := range m.Blocks {
			if b.Text != nil && b.Text.Type == "mrkdwn" && strings.Contains(b.Text.Text, "evil") {
				t.Errorf("the model's text reached mrkdwn: %q", b.Text.Text)
			}
		}
		if strings.Contains(m.Text, "<!channel>") || !strings.Contains(string(d.body), id+"."+strings.TrimPrefix(d.event, "approval.")) {
			t.Errorf("text %q; the key is not in the message", m.Text)
		}
	}
	var req slackMessageBody
	_ = json.Unmarshal(slack.waitKey(t, Key(id, notify.EventRequested)).body, &req)
	all := req.texts()
	for _, want := range []string{"Approval requested: cards.charge", "user:alice", "a card is charged", "•••• 1111",
		"4200", "input redacted by the capability", "<https://console.example.com/approvals/" + id + "|"} {
		if !strings.Contains(all, want) {
			t.Errorf("the request's message lacks %q:\n%s", want, all)
		}
	}
	if !strings.HasPrefix(req.Text, "Approval requested: cards.charge for user:alice https://console.example.com/approvals/") {
		t.Errorf("text %q", req.Text)
	}
	var rm slackMessageBody
	_ = json.Unmarshal(slack.waitKey(t, Key(id, notify.EventRejected)).body, &rm)
	rej := rm.texts()
	if !strings.Contains(rej, "Rejected by user:carol") || !strings.Contains(rej, "not this card") {
		t.Errorf("the rejection's message:\n%s", rej)
	}
}

// However large the input, the reasons or the names, a message stays within
// what Slack accepts, and says how many fields it left out.
func TestSlackMessage_LargeInputWithinSlacksLimits(t *testing.T) {
	t.Parallel()
	in := map[string]any{}
	for i := range 30 {
		in[fmt.Sprintf("field%02d", i)] = strings.Repeat("x\n", 3000)
	}
	input, hash, err := approvals.Canonical(envelope.MustRaw(in))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := &approvals.Record{ID: "0190e0c0-0000-7000-8000-000000000001", CapabilityID: "orders.refund",
		Actor: envelope.Actor{Kind: "user", ID: strings.Repeat("a", 500) + "\r\nBcc: x@example.com"},
		Input: input, InputHash: hash, Reasons: []string{strings.Repeat("why ", 1000)}, Types: []string{"finance"},
		Status: approvals.StatusRejected, RequestedAt: now, ExpiresAt: now.Add(time.Hour),
		Decision: &approvals.Decision{Status: approvals.StatusRejected, Approver: carol, Comment: strings.Repeat("c", 5000), DecidedAt: now}}
	for _, p := range []plan{{event: notify.EventRequested, at: now}, {event: notify.EventRejected, at: now}, {event: notify.EventExpired, at: now}} {
		n := newNotification(rec, p, "https://console.example.com")
		body, err := json.Marshal(slackMessage(n))
		if err != nil {
			t.Fatal(err)
		}
		if err := slackShape(body); err != nil {
			t.Fatalf("%s: %v\n%s", p.event, err, body)
		}
		if !strings.Contains(string(body), "22 more input fields") {
			t.Errorf("%s: no count of the fields left out", p.event)
		}
		mail := string(emailMessage(n, Channel{From: "capstan@example.com", To: []string{"a@example.com"}}, now))
		head, _, _ := strings.Cut(mail, "\r\n\r\n")
		if strings.Contains(head, "\nBcc:") {
			t.Errorf("%s: the actor's id injected a header:\n%s", p.event, head)
		}
	}
}
