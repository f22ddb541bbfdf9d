package notify_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/notify"
)

// A receiver of the finance team's webhook channel: it checks each
// delivery's signature, drops a key it has already processed, and acts on
// the event. The deliveries here are made with Sign, as capstan notify signs
// them.
func Example() {
	secret := []byte("whsec-finance-0123456789")
	seen := map[string]bool{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		if err := notify.Verify(secret, r.Header.Get(notify.SignatureHeader), body, time.Now(), 0); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized) // 4xx: not retried
			return
		}
		var p notify.Payload
		if err := json.Unmarshal(body, &p); err != nil || p.V != notify.PayloadVersion {
			http.Error(w, "unknown payload", http.StatusBadRequest)
			return
		}
		if seen[p.IdempotencyKey] {
			return // delivered again: answered, not redone
		}
		seen[p.IdempotencyKey] = true
		switch p.Event {
		case notify.EventRequested:
			fmt.Printf("%s asks to run %s: %s\n", p.Approval.Actor, p.Approval.CapabilityID, p.URL)
		case notify.EventApproved, notify.EventRejected, notify.EventCancelled:
			fmt.Printf("%s %s by %s\n", p.Approval.CapabilityID, p.Approval.Decision.Status, p.Approval.Decision.Approver)
		case notify.EventExpired:
			fmt.Printf("%s expired\n", p.Approval.CapabilityID)
		}
	}))
	defer receiver.Close()

	deliver := func(p notify.Payload, key []byte) int {
		body, _ := json.Marshal(p)
		req, _ := http.NewRequest(http.MethodPost, receiver.URL, bytes.NewReader(body))
		req.Header.Set(notify.SignatureHeader, notify.Sign(key, body, time.Now()))
		req.Header.Set(notify.IdempotencyHeader, p.IdempotencyKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	requested := notify.Payload{V: notify.PayloadVersion, IdempotencyKey: "a1.requested", Event: notify.EventRequested,
		URL: "https://capstan.example.com/approvals/a1", Approval: notify.Approval{ID: "a1", CapabilityID: "orders.refund",
			Actor: envelope.Actor{Kind: "user", ID: "alice"}, Status: approvals.StatusPending}}
	approved := requested
	approved.IdempotencyKey, approved.Event, approved.Approval.Status = "a1.approved", notify.EventApproved, approvals.StatusApproved
	approved.Approval.Decision = &notify.Decision{Status: approvals.StatusApproved, Approver: envelope.Actor{Kind: "user", ID: "carol"}}

	fmt.Println(deliver(requested, secret))
	fmt.Println(deliver(requested, secret)) // at least once: the same key again
	fmt.Println(deliver(approved, []byte("someone else's secret")))
	fmt.Println(deliver(approved, secret))
	// Output:
	// user:alice asks to run orders.refund: https://capstan.example.com/approvals/a1
	// 200
	// 200
	// 401
	// orders.refund approved by user:carol
	// 200
}
