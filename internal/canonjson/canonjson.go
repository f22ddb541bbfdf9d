// Package canonjson writes a decoded value as canonical JSON: object keys
// sorted by their UTF-8 bytes, no insignificant whitespace, whole numbers in
// digits, strings escaped as encoding/json escapes them. An input's hash
// (envelope.InputHash) and an approval's bound input are made of these bytes.
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// ErrNotCanonical marks a value that has no canonical JSON form (NaN, infinity,
// invalid UTF-8, non-string map keys, byte strings).
var ErrNotCanonical = errors.New("envelope: value has no canonical JSON form")

// Marshal returns v's canonical JSON.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := Write(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes v, a value as msgpack decodes into any, as canonical JSON.
func Write(buf *bytes.Buffer, v any) error {
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
			if err := Write(buf, x); err != nil {
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
			if err := Write(buf, t[k]); err != nil {
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
		return Write(buf, m)
	default:
		return fmt.Errorf("%w: value of type %T", ErrNotCanonical, v)
	}
	return nil
}

// WriteFloat writes f as Write writes a float64: an error for NaN and the
// infinities.
func WriteFloat(buf *bytes.Buffer, f float64) error { return writeFloat(buf, f) }

// AppendString appends s, valid UTF-8, as Write writes a string (as
// encoding/json does): for the bytes of a msgpack string read in place.
func AppendString(dst, s []byte) []byte { return appendJSONString(dst, s) }

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
func appendJSONString[S string | []byte](dst []byte, s S) []byte {
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
		c, size := decodeRune(s[i:])
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

// decodeRune is utf8.DecodeRune of a string or of bytes, read from a copy
// of its first bytes on the stack.
func decodeRune[S string | []byte](s S) (rune, int) {
	var first [utf8.UTFMax]byte
	return utf8.DecodeRune(first[:copy(first[:], s)])
}
