package notify

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
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

func slackConfig(url string) Config {
	return Config{
		ConsoleURL: "https://console.example.com",
		Retry:      Retry{Attempts: 3, Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Channels:   []Channel{{Name: "payments-slack", Kind: Slack, Types: []string{"payments"}, URL: Secret(url)}},
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
	n, _ := r.run(t, slackConfig(slack.url))

	id := r.request(t, "cards.charge", ChargeIn{Card: cardNumber, Amount: 4200, Note: "<!channel> see <https://evil.example|here>"})
	slack.waitKey(t, Key(id, Requested))
	r.decide(t, id, false, "not this card")
	slack.waitKey(t, Key(id, Rejected))
	r.idle(t, n, 0)

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
	_ = json.Unmarshal(slack.waitKey(t, Key(id, Requested)).body, &req)
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
	_ = json.Unmarshal(slack.waitKey(t, Key(id, Rejected)).body, &rm)
	rej := rm.texts()
	if !strings.Contains(rej, "Rejected by user:carol") || !strings.Contains(rej, "not this card") {
		t.Errorf("the rejection's message:\n%s", rej)
	}
}
