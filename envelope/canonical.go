package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/internal/canonjson"
	"github.com/capstan-dev/capstan/internal/msgpackhead"
)

// canonicalBufs keep the buffers InputHash writes an input's canonical JSON
// into, once per execution, between executions.
var canonicalBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// inputHashOfJSON is the hex SHA-256 of r's canonical JSON, written into a
// pooled buffer; an error when r has no canonical JSON form. A value of
// plain JSON types is written from its bytes directly (writeCanonical);
// any other is decoded first, and written from the decoded value.
func inputHashOfJSON(r Raw) (string, error) {
	buf := canonicalBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			canonicalBufs.Put(buf)
		}
	}()
	buf.Reset()
	if !writeCanonical(buf, r) {
		buf.Reset()
		v, err := r.Value()
		if err != nil {
			return "", err
		}
		if err := canonjson.Write(buf, v); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256(buf.Bytes())
	return hexString(sum[:]), nil
}

// canonicalDepth is how deeply writeCanonical follows arrays and maps; a
// value nested deeper is decoded first.
const canonicalDepth = 16

// writeCanonical writes the msgpack value b as canonjson.Write writes the
// value it decodes to, reading the bytes in place, and reports whether it
// did: it takes nil, booleans, integers, floats, strings of valid UTF-8,
// arrays, and maps whose keys are such strings, none twice, within
// canonicalDepth. Anything else (a byte string, an extension, a repeated
// key, bytes that are not well formed) returns false, and is left to the
// decoder.
func writeCanonical(buf *bytes.Buffer, b []byte) bool {
	w := canonicalWriter{b: b, buf: buf}
	return w.value(0) && w.off == len(b)
}

type canonicalWriter struct {
	b   []byte
	off int
	buf *bytes.Buffer
}

func (w *canonicalWriter) value(depth int) bool {
	h, next, err := msgpackhead.Read(w.b, w.off)
	if err != nil {
		return false
	}
	w.off = next
	buf := w.buf
	switch h.Class {
	case msgpackhead.Nil:
		buf.WriteString("null")
	case msgpackhead.Bool:
		buf.Write(strconv.AppendBool(buf.AvailableBuffer(), h.True))
	case msgpackhead.Int:
		if h.Neg && h.Mag != 0 {
			buf.WriteByte('-')
		}
		buf.Write(strconv.AppendUint(buf.AvailableBuffer(), h.Mag, 10))
	case msgpackhead.Float:
		var f float64
		if h.F64 {
			f = math.Float64frombits(binary.BigEndian.Uint64(w.b[next-8 : next]))
		} else {
			f = float64(math.Float32frombits(binary.BigEndian.Uint32(w.b[next-4 : next])))
		}
		return canonjson.WriteFloat(buf, f) == nil
	case msgpackhead.String:
		s, ok := w.str(h.N)
		if !ok {
			return false
		}
		buf.Write(canonjson.AppendString(buf.AvailableBuffer(), s))
	case msgpackhead.Array:
		if depth >= canonicalDepth || h.N > uint64(len(w.b)-w.off) {
			return false
		}
		buf.WriteByte('[')
		for i := range h.N {
			if i > 0 {
				buf.WriteByte(',')
			}
			if !w.value(depth + 1) {
				return false
			}
		}
		buf.WriteByte(']')
	case msgpackhead.Map:
		return depth < canonicalDepth && w.object(h.N, depth)
	default:
		return false
	}
	return true
}

// str reads the n bytes of a string, valid UTF-8.
func (w *canonicalWriter) str(n uint64) ([]byte, bool) {
	if n > uint64(len(w.b)-w.off) {
		return nil, false
	}
	s := w.b[w.off : w.off+int(n)]
	w.off += int(n)
	return s, utf8.Valid(s)
}

// canonicalMember is a map's key and the offset of its value.
type canonicalMember struct {
	key []byte
	at  int
}

// object writes a map of n members, its keys sorted by their bytes.
func (w *canonicalWriter) object(n uint64, depth int) bool {
	if 2*n > uint64(len(w.b)-w.off) { // every key and value takes a byte at least
		return false
	}
	var room [8]canonicalMember // an input's few keys sort on the stack
	members := room[:0]
	for range n {
		h, next, err := msgpackhead.Read(w.b, w.off)
		if err != nil || h.Class != msgpackhead.String {
			return false
		}
		w.off = next
		key, ok := w.str(h.N)
		if !ok {
			return false
		}
		members = append(members, canonicalMember{key: key, at: w.off})
		if w.off, ok = skipValue(w.b, w.off); !ok {
			return false
		}
	}
	end := w.off
	slices.SortFunc(members, func(a, b canonicalMember) int { return bytes.Compare(a.key, b.key) })
	buf := w.buf
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if bytes.Equal(members[i-1].key, m.key) {
				return false // the decoder keeps the last
			}
			buf.WriteByte(',')
		}
		buf.Write(canonjson.AppendString(buf.AvailableBuffer(), m.key))
		buf.WriteByte(':')
		w.off = m.at
		if !w.value(depth + 1) {
			return false
		}
	}
	buf.WriteByte('}')
	w.off = end
	return true
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
	return hexString(sum[:]), nil
}
