package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// ErrNotCanonical marks a value that has no canonical JSON form (NaN, infinity,
// invalid UTF-8, non-string map keys, byte strings).
var ErrNotCanonical = errors.New("envelope: value has no canonical JSON form")

// CanonicalJSON renders a raw value as canonical JSON: object keys sorted by
// their UTF-8 bytes, no insignificant whitespace, integers without exponent.
func CanonicalJSON(r Raw) ([]byte, error) {
	v, err := r.Value()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// InputHash is the hex SHA-256 of the raw value's canonical JSON. A value
// without a canonical JSON form (binary data, NaN, invalid UTF-8, keys that
// are not strings: a Go client's msgpack may hold them) hashes as its msgpack
// bytes behind a prefix no JSON text begins with: its hash is never a JSON
// value's, nor another value's, and the same bytes always hash alike. An
// execution's records and audit events name its input by this hash, so an
// input must never go without one. Only bytes that are not well-formed msgpack
// fail.
func InputHash(r Raw) (string, error) {
	c, err := CanonicalJSON(r)
	if err != nil {
		// Not canonical, or not decodable as a plain value (an extension
		// type the msgpack library does not know): the bytes, if well formed.
		if werr := checkWellFormed(r); werr != nil {
			return "", fmt.Errorf("%w: %v", ErrDecode, werr)
		}
		c = append([]byte("msgpack:"), r...)
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case string:
		if !utf8.ValidString(t) {
			return fmt.Errorf("%w: invalid UTF-8 in a string", ErrNotCanonical)
		}
		b, _ := json.Marshal(t)
		buf.Write(b)
	case int8, int16, int32, int64, int:
		fmt.Fprintf(buf, "%d", t)
	case uint8, uint16, uint32, uint64, uint:
		fmt.Fprintf(buf, "%d", t)
	case float32:
		return writeFloat(buf, float64(t))
	case float64:
		return writeFloat(buf, t)
	case time.Time:
		b, err := json.Marshal(t.UTC())
		if err != nil { // a year RFC 3339 cannot write
			return fmt.Errorf("%w: %v", ErrNotCanonical, err)
		}
		buf.Write(b)
	case []any:
		buf.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, x); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			if !utf8.ValidString(k) {
				return fmt.Errorf("%w: invalid UTF-8 in a key", ErrNotCanonical)
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := writeCanonical(buf, t[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			s, ok := k.(string)
			if !ok {
				return fmt.Errorf("%w: map key of type %T", ErrNotCanonical, k)
			}
			m[s] = x
		}
		return writeCanonical(buf, m)
	default:
		return fmt.Errorf("%w: value of type %T", ErrNotCanonical, v)
	}
	return nil
}

func writeFloat(buf *bytes.Buffer, f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: %v", ErrNotCanonical, f)
	}
	// A whole number is written in digits, as the integer of the same value is,
	// so that 2.0 and 2, or 1e15 and 1000000000000000, hash the same.
	if f == math.Trunc(f) && math.Abs(f) < 1e21 {
		if f == 0 {
			f = 0 // not "-0"
		}
		buf.WriteString(strconv.FormatFloat(f, 'f', 0, 64))
		return nil
	}
	buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	return nil
}
