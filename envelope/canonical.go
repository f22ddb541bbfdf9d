package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync"
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

// canonicalBufs keep the buffers InputHash writes an input's canonical JSON
// into, once per execution, between executions.
var canonicalBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// inputHashOfJSON is the hex SHA-256 of r's canonical JSON, written into a
// pooled buffer; an error when r has no canonical JSON form.
func inputHashOfJSON(r Raw) (string, error) {
	v, err := r.Value()
	if err != nil {
		return "", err
	}
	buf := canonicalBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			canonicalBufs.Put(buf)
		}
	}()
	buf.Reset()
	if err := writeCanonical(buf, v); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), nil
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
	h, err := inputHashOfJSON(r)
	if err == nil {
		return h, nil
	}
	// Not canonical, or not decodable as a plain value (an extension type
	// the msgpack library does not know): the bytes, if well formed.
	if werr := checkWellFormed(r); werr != nil {
		return "", fmt.Errorf("%w: %v", ErrDecode, werr)
	}
	sum := sha256.Sum256(append([]byte("msgpack:"), r...))
	return hex.EncodeToString(sum[:]), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.Write(strconv.AppendBool(buf.AvailableBuffer(), t))
	case string:
		if !utf8.ValidString(t) {
			return fmt.Errorf("%w: invalid UTF-8 in a string", ErrNotCanonical)
		}
		buf.Write(appendJSONString(buf.AvailableBuffer(), t))
	case int8, int16, int32, int64, int:
		buf.Write(strconv.AppendInt(buf.AvailableBuffer(), reflect.ValueOf(t).Int(), 10))
	case uint8, uint16, uint32, uint64, uint:
		buf.Write(strconv.AppendUint(buf.AvailableBuffer(), reflect.ValueOf(t).Uint(), 10))
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
		var room [8]string // an input's few keys sort on the stack
		keys := room[:0]
		for k := range t {
			if !utf8.ValidString(k) {
				return fmt.Errorf("%w: invalid UTF-8 in a key", ErrNotCanonical)
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.Write(appendJSONString(buf.AvailableBuffer(), k))
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
		buf.Write(strconv.AppendFloat(buf.AvailableBuffer(), f, 'f', 0, 64))
		return nil
	}
	buf.Write(strconv.AppendFloat(buf.AvailableBuffer(), f, 'g', -1, 64))
	return nil
}

// appendJSONString appends s as encoding/json writes a string (json.Marshal,
// HTML characters escaped): the bytes an input's canonical JSON, and so its
// hash, have always been made of. s is valid UTF-8 (checked before).
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' { // as encoding/json: not for JSONP
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
