package notifier

import (
	"fmt"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

// slackMessage is the body posted to a Slack-compatible incoming webhook:
// a short text (what a notification shows) and blocks. Everything a model or
// a requester wrote (the input, actor ids, comments) goes in plain_text
// objects, which Slack neither formats nor turns into mentions or links;
// the mrkdwn the message has is capstan's own, with &, < and > escaped.
// Incoming webhooks cannot edit a message: a decision or an expiry is a
// message of its own.
func slackMessage(n *notification) map[string]any {
	r := n.rec
	title := cut(n.headline()+": "+r.CapabilityID, 150)
	text := fmt.Sprintf("%s: %s for %s", n.headline(), r.CapabilityID, r.Actor.String())
	if n.url != "" {
		text += " " + n.url
	}
	facts := []any{
		plain("Requested by\n" + cut(n.describeRequester(), summaryValue)),
		plain("Types\n" + cut(orNone(strings.Join(r.Types, ", ")), summaryValue)),
	}
	if r.Risk != "" || r.SideEffect != "" {
		facts = append(facts, plain("Risk\n"+strings.TrimSpace(r.Risk+" "+r.SideEffect)))
	}
	switch n.event {
	case notify.EventRequested:
		facts = append(facts, plain("Expires\n"+r.ExpiresAt.UTC().Format(time.DateTime)+" UTC"))
	case notify.EventApproved, notify.EventRejected, notify.EventCancelled:
		if c := r.Decision.Comment; c != "" {
			facts = append(facts, plain("Comment\n"+cut(c, summaryValue*2)))
		}
	}
	blocks := []any{
		map[string]any{"type": "header", "text": plainText(title)},
		map[string]any{"type": "section", "fields": facts},
	}
	if len(r.Reasons) > 0 {
		blocks = append(blocks, map[string]any{"type": "section", "text": plainText(cut("Why: "+strings.Join(r.Reasons, "; "), 600))})
	}
	fields, more := n.summary()
	var input []any
	for _, f := range fields {
		input = append(input, plain(cut(f.name, 40)+"\n"+f.value))
	}
	if len(input) > 0 {
		blocks = append(blocks, map[string]any{"type": "section", "fields": input})
	}
	var notes []string
	if more > 0 {
		notes = append(notes, fmt.Sprintf("%d more input fields", more))
	}
	if n.redacted {
		notes = append(notes, "input redacted by the capability: what approvers see")
	}
	if len(notes) > 0 {
		blocks = append(blocks, map[string]any{"type": "context", "elements": []any{plain(strings.Join(notes, " · "))}})
	}
	if n.url != "" {
		blocks = append(blocks, map[string]any{"type": "section",
			"text": map[string]any{"type": "mrkdwn", "text": "<" + slackEscape(n.url) + "|Open approval " + shortID(r.ID) + " in the console>"}})
	}
	blocks = append(blocks, map[string]any{"type": "context", "elements": []any{
		plain("approval " + r.ID + " · idempotency key " + n.key)}})
	return map[string]any{
		"text":         slackEscape(text),
		"blocks":       blocks,
		"unfurl_links": false,
		"unfurl_media": false,
	}
}

func plainText(s string) map[string]any {
	return map[string]any{"type": "plain_text", "text": s, "emoji": false}
}

func plain(s string) any { return plainText(s) }

// slackEscape escapes what Slack's mrkdwn reads as markup: &, < and >
// (links, mentions, channel pings).
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:8] + "…" + id[len(id)-4:]
	}
	return id
}
