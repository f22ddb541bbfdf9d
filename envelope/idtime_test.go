package envelope

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// A new id's time is when it was made, to the millisecond.
func TestExecutionIDTime_OfANewIDIsWhenItWasMade(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	id := NewExecutionID()
	after := time.Now()
	got, ok := ExecutionIDTime(id)
	if !ok || got.Before(before) || got.After(after) {
		t.Fatalf("ExecutionIDTime(%s) = %v %v, want between %v and %v", id, got, ok, before, after)
	}
}

// The time is read from the id's first 48 bits, not from anything else.
func TestExecutionIDTime_ReadsTheFirst48Bits(t *testing.T) {
	// 0x018f0a0b0c0d ms after the epoch.
	got, ok := ExecutionIDTime("018f0a0b-0c0d-7abc-8def-0123456789ab")
	if want := time.UnixMilli(0x018f0a0b0c0d).UTC(); !ok || !got.Equal(want) {
		t.Fatalf("got %v %v, want %v", got, ok, want)
	}
}

// Ids that are not canonical UUIDv7 say nothing of their age.
func TestExecutionIDTime_OnlyCanonicalUUIDv7(t *testing.T) {
	for _, id := range []string{
		"custom-id",
		uuid.NewString(),                       // v4
		"018f0a0b-0c0d-1abc-8def-0123456789ab", // v1
		"018f0a0b-0c0d-7abc-cdef-0123456789ab", // v7 digits, not the RFC variant
		strings.ReplaceAll("018f0a0b-0c0d-7abc-8def-0123456789ab", "-", ""), // v7 without dashes
		"",
	} {
		if got, ok := ExecutionIDTime(id); ok {
			t.Errorf("ExecutionIDTime(%q) = %v, want not ok", id, got)
		}
	}
}
