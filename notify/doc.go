// Package notify is the receiving end of capstan's notifications. capstan
// notify (or capstan worker --notify) tells approvers where they are that an
// approval waits for them, and follows up when it is decided or expires: a
// signed JSON webhook, a Slack-compatible incoming webhook, or an email over
// SMTP, chosen per approval type. A webhook's receiver written in Go checks
// each delivery with Verify and decodes its body as a Payload:
//
//	err := notify.Verify(secret, r.Header.Get(notify.SignatureHeader), body, time.Now(), 0)
//	var p notify.Payload
//	err = json.Unmarshal(body, &p)
//	if p.Event == notify.EventRequested { … } // p.IdempotencyKey: drop one already processed
//
// A notifier reads what the approvals bucket already holds, through a
// durable JetStream consumer per channel (notify-<channel>) that every
// notifier of a deployment shares: each change of an approval goes, for each
// channel, to one notifier, which acknowledges it once the channel has it. A
// channel whose receiver is down holds back no other. Nothing is added to a
// worker's path: an approval costs what it cost before.
//
// # What is sent, and when
//
// Each stored revision of an approval calls for one Event: a pending
// approval is "approval.requested", and comes back at its expiry to be
// "approval.expired" if nobody decided it; "approval.approved",
// "approval.rejected" and "approval.cancelled" follow a decision. A consumed approval adds nothing. What was decided or expired
// before the channel's consumer was created is not notified; an approval
// still pending then is. An approval that changed twice while no notifier ran is
// notified once, at its latest state.
//
// Delivery is at least once. Every notification carries the idempotency key
// "<approvalId>.<event>", "a1.requested" for instance (the Capstan-Idempotency-Key header, the payload's
// idempotencyKey, the email's Message-ID, the Slack message's footer): a
// notifier stopped or killed mid-delivery leaves the change unacknowledged,
// and the next notifier sends it again, on that channel, with the same key.
// Order is not promised: while a request's delivery is retried, its decision
// may arrive first (Payload.OccurredAt orders them).
//
// A failed delivery is retried with exponential backoff (by default 12
// attempts from 2 s, doubling, at most 10 min apart: about 37 minutes),
// honouring a receiver's Retry-After; a 4xx answer (but 408 and 429), a
// redirect or an SMTP 5xx is not retried. A notification given up is counted
// (capstan notify --status, the capstan_notifications_failed_total metric)
// and logged. Secrets never appear in a log line, an error or a status:
// errors name a URL's host only, and any text that would contain a secret
// has it replaced by "[redacted]".
//
// # Channels
//
// A webhook POSTs the JSON Payload, signed: Capstan-Signature is
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the channel's
// secret>". A receiver recomputes the HMAC over the raw body, refuses a
// timestamp more than five minutes from its clock (a replay), and drops a key
// it has processed; Verify does all but the last.
//
// A Slack channel posts a message to an incoming webhook: what is asked, by
// whom, why, a summary of the input as approvers see it, and a link to the
// console's approval page. Incoming webhooks cannot edit a message, so a
// decision or an expiry is a message of its own.
//
// An email channel sends a plain-text message per event, follow-ups threaded
// under the request (In-Reply-To). It upgrades with STARTTLS when the server
// offers it and refuses to send beyond loopback when it does not (unless the
// channel's tls is "optional"); "implicit" speaks TLS from the first byte.
// AUTH PLAIN is sent only over TLS or on loopback.
//
// A capability that redacts what approvers see of its input
// (executor.Meta.RedactApprovalInput) is shown by its display in every
// channel: the input itself never leaves the approvals bucket.
//
// # Configuration
//
// capstan notify --config FILE reads a JSON file, refused when anyone but its
// owner may read it; every secret may instead come from an environment
// variable named by the field of the same name ending in "Env":
//
//	{
//	  "consoleUrl": "https://capstan.example.com",
//	  "retry": {"attempts": 12, "initial": "2s", "max": "10m"},
//	  "timeout": "10s",
//	  "channels": [
//	    {"name": "finance-slack", "kind": "slack", "types": ["finance"],
//	     "urlEnv": "CAPSTAN_SLACK_FINANCE_URL"},
//	    {"name": "audit-hook", "kind": "webhook", "types": ["*"],
//	     "url": "https://hooks.example.com/capstan", "secretEnv": "CAPSTAN_HOOK_SECRET"},
//	    {"name": "finance-mail", "kind": "email", "types": ["finance"],
//	     "smtp": {"host": "smtp.example.com", "port": 587, "username": "capstan",
//	              "passwordEnv": "CAPSTAN_SMTP_PASSWORD", "tls": "starttls"},
//	     "from": "capstan@example.com", "to": ["finance-approvers@example.com"]}
//	  ]
//	}
//
// A channel receives the approvals of the types it lists ("*": every
// approval, those without types too); an approval of several types reaches
// every channel that lists one of them. Every notifier of a deployment should
// run the same configuration: a change goes to whichever notifier pulls it.
//
// # Credentials
//
// A notifier needs to read its consumers, not to write anything: the
// notifier role of package auth (capstan auth add NAME --role notifier) may
// pull from the approvals stream's consumers, acknowledge, and answer status
// requests, and nothing else. Such a notifier cannot create a consumer (a
// push consumer delivers wherever its creator says): an admin does, once per
// channel (capstan notify --init --config FILE), or a notifier running in a
// worker (capstan worker --notify FILE) does with the worker's rights. The notifier
// reads approval records whole, the input a capability redacts included,
// and sends only what approvers may see.
package notify
