// Package msgpackhead reads the header of one msgpack value without decoding
// it: what the value is, an integer's value, the length of a string, binary,
// array, map or extension. The envelope codec's well-formedness walk and
// stage 5's input check both follow msgpack bytes with it, so that the two
// read every byte alike.
//
// It allocates nothing and never reads past the bytes it is given.
package msgpackhead

import (
	"encoding/binary"
	"errors"
)

// Class is what a msgpack value is.
type Class uint8

// Classes.
const (
	Nil Class = iota
	Bool
	Int
	Float
	String
	Binary
	Array
	Map
	Ext
)

// Head is one value's header. Integers carry their value, floats and
// booleans are read whole; strings, binaries, arrays, maps and extensions
// carry their length, with their content still to read.
type Head struct {
	Class Class
	Neg   bool   // Int: negative
	Mag   uint64 // Int: absolute value
	F64   bool   // Float: 64-bit
	True  bool   // Bool: its value
	N     uint64 // String, Binary, Ext: bytes; Array: items; Map: pairs
	Ext   int8   // Ext: the extension type
}

// Errors of Read.
var (
	// ErrTruncated: the bytes end inside the header or scalar.
	ErrTruncated = errors.New("msgpack value truncated")
	// ErrNotMsgpack: the first byte begins no msgpack value (0xc1).
	ErrNotMsgpack = errors.New("not a msgpack value")
)

// Read reads the header of the value at b[off:] (for a scalar, the whole
// value) and returns it with the offset of what follows.
func Read(b []byte, off int) (h Head, next int, err error) {
	if off >= len(b) {
		return h, off, ErrTruncated
	}
	c := b[off]
	r := reader{b: b, off: off + 1}
	switch {
	case c <= 0x7f:
		h = Head{Class: Int, Mag: uint64(c)}
	case c >= 0xe0:
		h = Head{Class: Int}
		h.Neg, h.Mag = signed(int64(int8(c)))
	case c <= 0x8f:
		h = Head{Class: Map, N: uint64(c & 0x0f)}
	case c <= 0x9f:
		h = Head{Class: Array, N: uint64(c & 0x0f)}
	case c <= 0xbf:
		h = Head{Class: String, N: uint64(c & 0x1f)}
	case c == 0xc0:
		h = Head{Class: Nil}
	case c == 0xc2 || c == 0xc3:
		h = Head{Class: Bool, True: c == 0xc3}
	case c >= 0xc4 && c <= 0xc6:
		h = Head{Class: Binary, N: r.uint(1 << (c - 0xc4))}
	case c >= 0xc7 && c <= 0xc9:
		h = Head{Class: Ext, N: r.uint(1 << (c - 0xc7))}
		h.Ext = int8(r.uint(1))
	case c == 0xca || c == 0xcb:
		r.take(4 << (c - 0xca))
		h = Head{Class: Float, F64: c == 0xcb}
	case c >= 0xcc && c <= 0xcf:
		h = Head{Class: Int, Mag: r.uint(1 << (c - 0xcc))}
	case c >= 0xd0 && c <= 0xd3:
		h = Head{Class: Int}
		h.Neg, h.Mag = signed(r.sint(1 << (c - 0xd0)))
	case c >= 0xd4 && c <= 0xd8:
		h = Head{Class: Ext, N: 1 << (c - 0xd4)}
		h.Ext = int8(r.uint(1))
	case c >= 0xd9 && c <= 0xdb:
		h = Head{Class: String, N: r.uint(1 << (c - 0xd9))}
	case c == 0xdc || c == 0xdd:
		h = Head{Class: Array, N: r.uint(2 << (c - 0xdc))}
	case c == 0xde || c == 0xdf:
		h = Head{Class: Map, N: r.uint(2 << (c - 0xde))}
	default:
		return Head{}, off, ErrNotMsgpack
	}
	if r.short {
		return Head{}, off, ErrTruncated
	}
	return h, r.off, nil
}

// reader reads big-endian numbers, remembering whether the bytes ran out.
type reader struct {
	b     []byte
	off   int
	short bool
}

func (r *reader) take(n int) []byte {
	if r.short || n > len(r.b)-r.off {
		r.short = true
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) uint(size int) uint64 {
	p := r.take(size)
	switch {
	case p == nil:
		return 0
	case size == 1:
		return uint64(p[0])
	case size == 2:
		return uint64(binary.BigEndian.Uint16(p))
	case size == 4:
		return uint64(binary.BigEndian.Uint32(p))
	}
	return binary.BigEndian.Uint64(p)
}

func (r *reader) sint(size int) int64 {
	u := r.uint(size)
	switch size {
	case 1:
		return int64(int8(u))
	case 2:
		return int64(int16(u))
	case 4:
		return int64(int32(u))
	}
	return int64(u)
}

// signed splits an integer into sign and magnitude (math.MinInt64 included).
func signed(i int64) (neg bool, mag uint64) {
	if i < 0 {
		return true, uint64(-(i + 1)) + 1
	}
	return false, uint64(i)
}
