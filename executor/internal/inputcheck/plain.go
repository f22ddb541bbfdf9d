package inputcheck

import (
	"encoding/binary"
	"math"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/internal/msgpackhead"
)

// An input typed map[string]any (a capability that takes any object) is
// what encoding/json reads from the walk's JSON: numbers as float64,
// objects as map[string]any, arrays as []any. plainObject builds that value
// from the msgpack bytes directly, without the JSON, for an input of nil,
// booleans, integers, 64-bit floats, strings of valid UTF-8, arrays, and
// maps of such string keys, within plainDepth; any other (a byte string, an
// extension, a 32-bit float, a key that is not a string) it leaves to the
// JSON, which reads it as it always did. A repeated key keeps its last value,
// as encoding/json keeps it.

// plainDepth is how deeply plainObject follows arrays and maps.
const plainDepth = 64

// plainObject is the map[string]any encoding/json reads from the JSON of the
// msgpack map b, and whether it could be built directly.
func plainObject(b []byte) (map[string]any, bool) {
	r := plainReader{b: b}
	h, ok := r.head()
	if !ok || h.Class != msgpackhead.Map {
		return nil, false
	}
	m, ok := r.object(h.N, 0)
	return m, ok && r.off == len(b)
}

type plainReader struct {
	b   []byte
	off int
}

func (r *plainReader) head() (msgpackhead.Head, bool) {
	h, next, err := msgpackhead.Read(r.b, r.off)
	if err != nil {
		return h, false
	}
	r.off = next
	return h, true
}

func (r *plainReader) value(depth int) (any, bool) {
	h, ok := r.head()
	if !ok {
		return nil, false
	}
	switch h.Class {
	case msgpackhead.Nil:
		return nil, true
	case msgpackhead.Bool:
		return h.True, true
	case msgpackhead.Int:
		if h.Neg {
			if h.Mag == 0 {
				return nil, false // "-0" reads as a negative zero: left to the JSON
			}
			return -float64(h.Mag), true
		}
		return float64(h.Mag), true
	case msgpackhead.Float:
		if !h.F64 {
			return nil, false
		}
		f := math.Float64frombits(binary.BigEndian.Uint64(r.b[r.off-8 : r.off]))
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, false
		}
		return f, true
	case msgpackhead.String:
		s, ok := r.str(h.N)
		return s, ok
	case msgpackhead.Array:
		if depth >= plainDepth || h.N > uint64(len(r.b)-r.off) {
			return nil, false
		}
		l := make([]any, h.N)
		for i := range l {
			if l[i], ok = r.value(depth + 1); !ok {
				return nil, false
			}
		}
		return l, true
	case msgpackhead.Map:
		if depth >= plainDepth {
			return nil, false
		}
		return r.object(h.N, depth)
	}
	return nil, false
}

// object reads the n members of a map.
func (r *plainReader) object(n uint64, depth int) (map[string]any, bool) {
	if 2*n > uint64(len(r.b)-r.off) { // every key and value takes a byte at least
		return nil, false
	}
	m := make(map[string]any, n)
	for range n {
		h, ok := r.head()
		if !ok || h.Class != msgpackhead.String {
			return nil, false
		}
		k, ok := r.str(h.N)
		if !ok {
			return nil, false
		}
		if m[k], ok = r.value(depth + 1); !ok {
			return nil, false
		}
	}
	return m, true
}

// str reads the n bytes of a string of valid UTF-8.
func (r *plainReader) str(n uint64) (string, bool) {
	if n > uint64(len(r.b)-r.off) {
		return "", false
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	if !utf8.Valid(s) {
		return "", false
	}
	return string(s), true
}
