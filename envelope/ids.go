package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaxIDLen is the longest capability or execution id, in bytes.
const MaxIDLen = 128

// ValidCapabilityID reports whether id may name a capability: subject tokens
// starting with a letter, [a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*, at most 128 bytes.
// Ids starting with "_" are reserved and refused here.
func ValidCapabilityID(id string) error {
	if id == "" {
		return fmt.Errorf("capability id is empty")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("capability id is %d bytes, at most %d", len(id), MaxIDLen)
	}
	if c := id[0]; c < 'a' || c > 'z' {
		return fmt.Errorf("capability id %q must start with a lower-case letter", id)
	}
	tokenLen := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c == '.':
			if tokenLen == 0 {
				return fmt.Errorf("capability id %q has an empty token", id)
			}
			tokenLen = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return fmt.Errorf("capability id %q has the character %q at byte %d", id, c, i)
		}
		tokenLen++
	}
	if tokenLen == 0 {
		return fmt.Errorf("capability id %q has an empty token", id)
	}
	return nil
}

// ValidExecutionID reports whether id may name an execution: 1 to 128 bytes of
// [A-Za-z0-9_-], so that it is one subject token and one KV key.
func ValidExecutionID(id string) error {
	if id == "" {
		return fmt.Errorf("execution id is empty")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("execution id is %d bytes, at most %d", len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("execution id %q has the character %q at byte %d", id, c, i)
		}
	}
	return nil
}

// NewExecutionID returns a new UUIDv7, ordered by time.
func NewExecutionID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// ExecutionIDTime returns when an execution id was made, for an id that is a
// UUIDv7 in its canonical form (what NewExecutionID makes): its first 48 bits
// are the Unix time in milliseconds of the clock that made it. ok is false for
// any other id, which says nothing of its age.
func ExecutionIDTime(id string) (t time.Time, ok bool) {
	if len(id) != 36 {
		return time.Time{}, false
	}
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		return time.Time{}, false
	}
	ms := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	return time.UnixMilli(ms).UTC(), true
}

// IdempotencyKeyVersion is the idempotency key's derivation a new
// execution's record names: 2, the principal's and the execution id's
// together (IdempotencyKey). Version 1 — and 0, a record that names none —
// is the execution id's alone (IdempotencyKeyFromID), the key of executions
// begun before v0.2. An execution's key is fixed when its record is created
// and kept for its whole life (DESIGN §6): every attempt, takeover and
// reconciliation of it uses the derivation its record names.
const IdempotencyKeyVersion = 2

// IdempotencyKey derives the idempotency key of principal's execution
// executionID (version 2): stable across retries, redeliveries and
// takeovers of one execution, distinct across executions and across
// principals. It is the hex of the first 16 bytes of
// SHA-256("capstan/idempotency/v2/" + principal + "." + executionID): the
// execution's key (P.ID, DESIGN §2) under its own prefix. On a server without
// authentication the principal is "_anon".
func IdempotencyKey(principal, executionID string) string {
	return derivedKey("capstan/idempotency/v2/", principal, ".", executionID)
}

// IdempotencyKeyOf is the key the derivation version gives principal's
// execution executionID: 1 (and 0, what a record written before versions
// were recorded names) the id alone, any other the principal's and the id's
// together.
func IdempotencyKeyOf(version int, principal, executionID string) string {
	if version <= 1 {
		return IdempotencyKeyFromID(executionID)
	}
	return IdempotencyKey(principal, executionID)
}

// IdempotencyKeyFromID is the key of an execution begun before v0.2
// (version 1): the hex of the first 16 bytes of
// SHA-256("capstan/idempotency/v1/" + executionID), the same for every
// principal. Such an execution keeps it until it ends; use it to look up
// effects stored under it.
func IdempotencyKeyFromID(executionID string) string {
	return derivedKey("capstan/idempotency/v1/", executionID)
}

// derivedKey is the hex of the first 16 bytes of the SHA-256 of parts
// joined, written on the stack: the key is the one allocation.
func derivedKey(parts ...string) string {
	var buf [160]byte
	text := buf[:0]
	for _, p := range parts {
		text = append(text, p...)
	}
	sum := sha256.Sum256(text)
	return hexString(sum[:16])
}

// hexString is hex.EncodeToString of a digest of at most 32 bytes, encoded
// on the stack: the string is the one allocation.
func hexString(sum []byte) string {
	var buf [64]byte
	return string(buf[:hex.Encode(buf[:], sum)])
}
