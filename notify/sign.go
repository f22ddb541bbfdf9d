package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Headers of a webhook delivery.
const (
	// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256 of
	// "<t>.<body>" under the channel's secret>".
	SignatureHeader = "Capstan-Signature"
	// IdempotencyHeader carries the payload's idempotency key.
	IdempotencyHeader = "Capstan-Idempotency-Key"
)

// defaultTolerance is how far a signature's timestamp may be from a
// receiver's clock when Verify is given no tolerance: a captured delivery
// replayed later is refused.
const defaultTolerance = 5 * time.Minute

// Sign returns the Capstan-Signature value of body sent at t under secret:
// "t=<unix>,v1=<hex hmac-sha256(secret, "<unix>.<body>")>". Each attempt of
// a delivery is signed anew, with its own time.
func Sign(secret []byte, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Errors of Verify.
var (
	ErrSignatureMalformed = errors.New("capstan: notify: malformed signature header")
	ErrSignatureMismatch  = errors.New("capstan: notify: signature does not match")
	ErrSignatureTooOld    = errors.New("capstan: notify: signature timestamp outside the tolerance")
)

// Verify checks a Capstan-Signature header against the body received, for a
// receiver written in Go: the timestamp must be within tolerance of now
// (five minutes when 0) and one v1 value must be the HMAC of "<t>.<body>"
// under secret (compared in constant time). After it, a receiver drops a
// payload whose idempotency key it has already processed.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = defaultTolerance
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrSignatureMalformed
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil {
				return ErrSignatureMalformed
			}
			sigs = append(sigs, b)
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrSignatureMalformed
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed %v from now", ErrSignatureTooOld, d.Round(time.Second))
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrSignatureMismatch
}
