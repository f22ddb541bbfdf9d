package broker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A request's message id (the Nats-Msg-Id header the exec stream's duplicate
// window keys on) names its execution: its Key, <principal>.<executionId>,
// then, on a connection that signs with a key of its own, a dot and a tag only
// that key can make (DESIGN §2). The stream's duplicate window is one table for
// every principal, and a producer chooses its headers: an id the server could
// not tie to its sender would let one principal publish another's message id
// first, so that the other's request is dropped as a duplicate. The prefix
// scopes the id by principal (a worker refuses a request whose message id names
// another execution, see MsgIDNames); the tag makes the whole id one that no
// other principal can compute, even knowing the execution id.

// msgIDKeyText is what a connection signs to derive its tag key. An ed25519
// signature is deterministic: every connection of one principal derives the
// same key, so that a request submitted again by another of its processes is
// still dropped as a duplicate within the window.
const msgIDKeyText = "capstan message id key v1"

// msgIDTagLen is the length of a tag, in hex digits: 64 bits.
const msgIDTagLen = 16

// forwardTag begins the tag of a request a worker forwards from _unrouted
// (DESIGN §3): its own message id, since the original's is in the window.
const forwardTag = "fwd"

// MsgIDs makes the message ids of one connection's requests.
type MsgIDs struct {
	key []byte // nil: ids without a tag
}

// NewMsgIDs derives the tag key of nc's requests from its signing key (the
// seed of an nkey or of a .creds file). A connection that does not sign (an
// open server, a user and password, a token) makes ids without a tag: on such
// a server any client can publish any message id anyway.
func NewMsgIDs(nc *nats.Conn) (MsgIDs, error) {
	sign := nc.Opts.SignatureCB
	if sign == nil {
		return MsgIDs{}, nil
	}
	sig, err := sign([]byte(msgIDKeyText))
	if err != nil {
		return MsgIDs{}, fmt.Errorf("capstan: derive the message id key: %w", err)
	}
	sum := sha256.Sum256(sig)
	return MsgIDs{key: sum[:]}, nil
}

// tag is the tag of key's message ids, or "" without a key.
func (m MsgIDs) tag(key string) string {
	if m.key == nil {
		return ""
	}
	h := hmac.New(sha256.New, m.key)
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil))[:msgIDTagLen]
}

// Request is the message id of principal's request for executionID.
func (m MsgIDs) Request(principal, executionID string) string {
	key := Key(principal, executionID)
	if t := m.tag(key); t != "" {
		return key + "." + t
	}
	return key
}

// Forward is the message id of a worker's forward of principal's request for
// executionID from _unrouted to its capability's subject.
func (m MsgIDs) Forward(principal, executionID string) string {
	key := Key(principal, executionID)
	return key + "." + forwardTag + m.tag(key)
}

// MsgIDNames reports whether msgID may be the message id of principal's
// request for executionID: the execution's Key, alone or followed by a dot and
// a tag of letters, digits, '_' or '-' (at most 64). Requests of earlier
// versions named the execution id alone (and a forward the id and "-fwd");
// they are accepted as such.
func MsgIDNames(msgID, principal, executionID string) bool {
	if rest, ok := strings.CutPrefix(msgID, executionID); ok && (rest == "" || rest == "-fwd") {
		return true
	}
	// msgID begins with Key(principal, executionID), compared in place.
	rest, ok := strings.CutPrefix(msgID, principal)
	if !ok || len(rest) == 0 || rest[0] != '.' {
		return false
	}
	if rest, ok = strings.CutPrefix(rest[1:], executionID); !ok {
		return false
	}
	if rest == "" {
		return true
	}
	tag, ok := strings.CutPrefix(rest, ".")
	if !ok || tag == "" || len(tag) > 64 {
		return false
	}
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ExecutionOfMsgID is the execution id a message id of principal's names
// (see MsgIDNames), or "" when it names none of principal's.
func ExecutionOfMsgID(msgID, principal string) string {
	rest, ok := strings.CutPrefix(msgID, principal+".")
	if !ok {
		// Earlier versions: the execution id alone.
		if strings.Contains(msgID, ".") {
			return ""
		}
		return strings.TrimSuffix(msgID, "-fwd")
	}
	id, _, _ := strings.Cut(rest, ".")
	if !MsgIDNames(msgID, principal, id) {
		return ""
	}
	return id
}

// Owners returns the principals that have an execution of id: those with a
// record or an envelope under that id, sorted. Execution ids are unique per
// principal only (DESIGN §2); listing keys takes credentials that may read
// every principal's (an admin's, or an open server's).
func Owners(ctx context.Context, b *Broker, id string) ([]string, error) {
	owners := map[string]bool{}
	for _, kv := range []jetstream.KeyValue{b.Executions, b.Envelopes} {
		if kv == nil {
			continue
		}
		keys, err := kv.ListKeysFiltered(ctx, "*."+id)
		if err != nil {
			return nil, err
		}
		for key := range keys.Keys() {
			if p, _, ok := ParseKey(key); ok {
				owners[p] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(owners)), nil
}
