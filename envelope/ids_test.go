package envelope

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// capabilityIDPattern is the grammar of DESIGN §2, checked against the
// hand-written validator.
var capabilityIDPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$`)

func TestValidCapabilityID(t *testing.T) {
	tests := []struct {
		id    string
		valid bool
	}{
		{"demo.echo", true},
		{"orders.refund", true},
		{"a", true},
		{"a-b_c.d1", true},
		{"a.1", true},
		{"a0.b9", true}, // both ends of the digit range
		{"z.az", true},  // both ends of the letters, first and inside
		{"a._x", true},
		{"billing.invoices.v2-send", true},
		{strings.Repeat("a", MaxIDLen), true},
		{"a." + strings.Repeat("b", MaxIDLen-2), true},

		{"", false},
		{"orders.*", false},
		{"a.*", false},
		{"a..b", false},
		{">", false},
		{"orders.>", false},
		{"a b", false},
		{"a\tb", false},
		{"_unrouted", false},
		{"Demo.echo", false},
		{"demo.Echo", false},
		{".a", false},
		{"a.", false},
		{"1abc", false},
		{"-a", false},
		{"café", false},
		{"a\x00", false},
		{"a/b", false},
		{"a:b", false}, // the byte after '9'
		{"a/", false},  // the byte before '0'
		{"a`b", false}, // the byte before 'a'
		{"a{b", false}, // the byte after 'z'

		{strings.Repeat("a", MaxIDLen+1), false},
	}
	for _, tt := range tests {
		name := tt.id
		if len(name) > 24 {
			name = fmt.Sprintf("%d bytes", len(name))
		}
		t.Run(name, func(t *testing.T) {
			err := ValidCapabilityID(tt.id)
			if (err == nil) != tt.valid {
				t.Errorf("ValidCapabilityID(%q) = %v, want valid=%v", tt.id, err, tt.valid)
			}
			if grammar := capabilityIDPattern.MatchString(tt.id) && len(tt.id) <= MaxIDLen; grammar != tt.valid {
				t.Errorf("case disagrees with the design's grammar: %q grammar=%v", tt.id, grammar)
			}
		})
	}
}

func TestValidExecutionID(t *testing.T) {
	tests := []struct {
		id    string
		valid bool
	}{
		{NewExecutionID(), true},
		{"e1", true},
		{"A-Z_az09", true},
		{"-", true},
		{strings.Repeat("x", MaxIDLen), true},

		{"", false},
		{strings.Repeat("x", MaxIDLen+1), false},
		{"a.b", false},
		{"a b", false},
		{"*", false},
		{">", false},
		{"a/b", false},
		{"a:b", false},
		{"ü", false},
		{"a\n", false},
	}
	for _, tt := range tests {
		if err := ValidExecutionID(tt.id); (err == nil) != tt.valid {
			t.Errorf("ValidExecutionID(%q) = %v, want valid=%v", tt.id, err, tt.valid)
		}
	}
}

func TestNewExecutionID_IsUUIDv7InCreationOrder(t *testing.T) {
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = NewExecutionID()
		u, err := uuid.Parse(ids[i])
		if err != nil || u.Version() != 7 {
			t.Fatalf("NewExecutionID() = %q: version %v, err %v; want a UUIDv7", ids[i], u.Version(), err)
		}
		if err := ValidExecutionID(ids[i]); err != nil {
			t.Fatalf("NewExecutionID() = %q is not a valid execution id: %v", ids[i], err)
		}
	}
	if !slices.IsSorted(ids) {
		t.Error("successive execution ids do not sort in creation order")
	}
	if len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Error("NewExecutionID repeated an id")
	}
}

func TestIdempotencyKey_StablePerExecutionDistinctAcross(t *testing.T) {
	id := NewExecutionID()
	if first, again := IdempotencyKey("alice", id), IdempotencyKey("alice", id); first != again {
		t.Error("IdempotencyKey differs for one execution")
	}
	seen := map[string]string{}
	for _, principal := range []string{"alice", "bob", "_anon", "a"} {
		for _, id := range []string{"a", "b", "A", "e1", "e1-", "alice", testExecutionID, NewExecutionID(), NewExecutionID()} {
			k := IdempotencyKey(principal, id)
			if prev, ok := seen[k]; ok {
				t.Errorf("IdempotencyKey(%q, %q) == the key of %s", principal, id, prev)
			}
			seen[k] = principal + "." + id
			if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(k) {
				t.Errorf("IdempotencyKey(%q, %q) = %q, want 32 hex digits", principal, id, k)
			}
		}
	}
	// The same id under two principals is two executions: two keys, and
	// neither is the key the id alone gave before.
	if IdempotencyKey("alice", "refund-42") == IdempotencyKey("bob", "refund-42") {
		t.Error("two principals' executions of one id share a key")
	}
	if IdempotencyKey("alice", "refund-42") == IdempotencyKeyFromID("refund-42") {
		t.Error("the principal's key is the id-alone key")
	}
}

// Handlers hand the key to external systems, which remember it: each
// derivation must never change between releases, and an execution keeps the
// one its record names.
func TestIdempotencyKey_DerivationIsPinned(t *testing.T) {
	if got, want := IdempotencyKeyFromID(testExecutionID), "58febe7b500713b45da9f28a97b0dbb2"; got != want {
		t.Errorf("IdempotencyKeyFromID(%q) = %s, want %s", testExecutionID, got, want)
	}
	for _, v := range []int{0, 1} {
		if got := IdempotencyKeyOf(v, "alice", testExecutionID); got != IdempotencyKeyFromID(testExecutionID) {
			t.Errorf("IdempotencyKeyOf(%d) = %s, want the id-alone key", v, got)
		}
	}
	if got, want := IdempotencyKey("alice", testExecutionID), "b5948430f8a23b4aac726bc2f8645d1c"; got != want {
		t.Errorf("IdempotencyKey(alice, %q) = %s, want %s", testExecutionID, got, want)
	}
	if got := IdempotencyKeyOf(IdempotencyKeyVersion, "alice", testExecutionID); got != IdempotencyKey("alice", testExecutionID) {
		t.Errorf("IdempotencyKeyOf(2) = %s", got)
	}
}
