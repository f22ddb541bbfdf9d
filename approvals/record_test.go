package approvals_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
)

// A pending or approved approval past its expiry reads as expired, whatever
// the record says yet; a decided one keeps its status for ever.
func TestStatusAt_ExpiryTurnsPendingAndApprovedIntoExpired(t *testing.T) {
	t.Parallel()
	expires := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		status        approvals.Status
		before, after approvals.Status
	}{
		{approvals.StatusPending, approvals.StatusPending, approvals.StatusExpired},
		{approvals.StatusApproved, approvals.StatusApproved, approvals.StatusExpired},
		{approvals.StatusRejected, approvals.StatusRejected, approvals.StatusRejected},
		{approvals.StatusCancelled, approvals.StatusCancelled, approvals.StatusCancelled},
		{approvals.StatusConsumed, approvals.StatusConsumed, approvals.StatusConsumed},
		{approvals.StatusExpired, approvals.StatusExpired, approvals.StatusExpired},
	} {
		r := approvals.Record{Status: c.status, ExpiresAt: expires}
		if got := r.StatusAt(expires.Add(-time.Nanosecond)); got != c.before {
			t.Errorf("%s before its expiry: %s, want %s", c.status, got, c.before)
		}
		if got := r.StatusAt(expires); got != c.after {
			t.Errorf("%s at its expiry: %s, want %s", c.status, got, c.after)
		}
	}
}

// CheckInput accepts the input that hashes to InputHash, and refuses any
// change to it, in meaning or only in form.
func TestCheckInput_RefusesAnInputChangedAfterItWasRequested(t *testing.T) {
	t.Parallel()
	input := []byte(`{"amount":900,"orderId":"o1"}`)
	sum := sha256.Sum256(input)
	r := approvals.Record{Input: input, InputHash: hex.EncodeToString(sum[:])}
	if err := r.CheckInput(); err != nil {
		t.Fatalf("the input approved: %v", err)
	}
	raw, err := r.Raw()
	if err != nil {
		t.Fatal(err)
	}
	var in struct {
		Amount  int    `json:"amount"`
		OrderID string `json:"orderId"`
	}
	if err := raw.Decode(&in); err != nil || in.Amount != 900 || in.OrderID != "o1" {
		t.Fatalf("Raw: %+v, %v", in, err)
	}
	for _, changed := range []string{`{"amount":9000,"orderId":"o1"}`, `{"orderId":"o1","amount":900}`, `{"amount":900, "orderId":"o1"}`} {
		r.Input = []byte(changed)
		if err := r.CheckInput(); !errors.Is(err, approvals.ErrInputMismatch) {
			t.Errorf("input changed to %s: %v, want ErrInputMismatch", changed, err)
		}
	}
	r.Input = []byte(`{"amount":`)
	sum = sha256.Sum256(r.Input)
	r.InputHash = hex.EncodeToString(sum[:])
	if err := r.CheckInput(); !errors.Is(err, approvals.ErrInputMismatch) {
		t.Errorf("an input that is not JSON, hashed anew: %v, want ErrInputMismatch", err)
	}
}
