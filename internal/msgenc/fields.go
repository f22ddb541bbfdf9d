package msgenc

import (
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Fields writes a record as the msgpack map its fields make, without
// reflection: a hot record's EncodeMsgpack adds each field in declaration
// order and Fields leaves out the empty ones, so the bytes are those the
// reflective encoder writes (json names, empty fields omitted). The
// reflective encoder allocates for every field it checks for emptiness; a
// record written on every execution is cheaper this way. Each field is
// written as it is added, into one buffer behind a placeholder for the map's
// header.
type Fields struct {
	b   []byte
	buf *[]byte // where b came from, back to fieldBufs once written
	n   int
	err error
}

// key writes the next field's key.
func (f *Fields) key(k string) {
	if f.b == nil {
		f.buf = fieldBufs.Get().(*[]byte)
		f.b = append((*f.buf)[:0], 0) // the header's place: a fixmap for up to 15 fields
	}
	f.n++
	f.b = appendString(f.b, k)
}

// String adds a string field, omitted when empty.
func (f *Fields) String(key, s string) {
	if s != "" {
		f.key(key)
		f.b = appendString(f.b, s)
	}
}

// Int adds an integer field, omitted when 0.
func (f *Fields) Int(key string, i int64) {
	if i != 0 {
		f.key(key)
		f.b = appendInt(f.b, i)
	}
}

// Bool adds a boolean field, omitted when false.
func (f *Fields) Bool(key string, b bool) {
	if b {
		f.key(key)
		f.b = append(f.b, 0xc3)
	}
}

// Float adds a float64 field, omitted when 0: always the 9 bytes of a
// float64, as the encoder writes one.
func (f *Fields) Float(key string, v float64) {
	if v != 0 {
		f.key(key)
		f.b = binary.BigEndian.AppendUint64(append(f.b, 0xcb), math.Float64bits(v))
	}
}

// Time adds a time field, omitted when zero.
func (f *Fields) Time(key string, t time.Time) {
	if !t.IsZero() {
		f.key(key)
		f.b = appendTime(f.b, t)
	}
}

// Raw adds a value already encoded (an envelope.Raw), embedded as is,
// omitted when empty.
func (f *Fields) Raw(key string, b []byte) {
	if len(b) > 0 {
		f.key(key)
		f.b = append(f.b, b...)
	}
}

// Actor adds an actor as a nested map, omitted when all its fields are empty.
func (f *Fields) Actor(key string, id, kind string, attrs map[string]string) {
	if id == "" && kind == "" && len(attrs) == 0 {
		return
	}
	f.key(key)
	n := 0
	for _, set := range []bool{id != "", kind != "", len(attrs) > 0} {
		if set {
			n++
		}
	}
	f.b = append(f.b, 0x80|byte(n))
	if id != "" {
		f.b = appendString(appendString(f.b, "id"), id)
	}
	if kind != "" {
		f.b = appendString(appendString(f.b, "kind"), kind)
	}
	if len(attrs) > 0 {
		f.b = appendString(f.b, "attrs")
		f.value(attrs)
	}
}

// Value adds any other value, written by the reflective encoder, unless empty
// says it is to be omitted.
func (f *Fields) Value(key string, v any, empty bool) {
	if !empty {
		f.key(key)
		f.value(v)
	}
}

func (f *Fields) value(v any) {
	if m, ok := v.(map[string]any); ok && m != nil && len(m) <= maxSortedInPlace {
		f.sortedMap(m)
		return
	}
	f.reflective(v)
}

// reflective writes v with the reflective encoder.
func (f *Fields) reflective(v any) {
	e := records.Get().(*encoder)
	defer records.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil && f.err == nil {
		f.err = err
	}
	f.b = append(f.b, e.buf.Bytes()...)
}

// maxSortedInPlace is the most keys of a map sortedMap sorts on the stack.
const maxSortedInPlace = 16

// sortedMap writes m as the reflective encoder does, its keys sorted by
// their bytes (an audit event's data on every execution): the header, then
// each key and its value, a value of the common kinds written in place and
// any other by the reflective encoder, which is what it writes for each
// value of a map.
func (f *Fields) sortedMap(m map[string]any) {
	var arr [maxSortedInPlace]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ { // insertion sort: a few keys
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	f.b = append(f.b, 0x80|byte(len(keys))) // a fixmap: at most 15 keys
	if len(keys) > 15 {
		f.b = append(f.b[:len(f.b)-1], 0xde, byte(len(keys)>>8), byte(len(keys)))
	}
	for _, k := range keys {
		f.b = appendString(f.b, k)
		switch v := m[k].(type) {
		case nil:
			f.b = append(f.b, 0xc0)
		case string:
			f.b = appendString(f.b, v)
		case bool:
			if v {
				f.b = append(f.b, 0xc3)
			} else {
				f.b = append(f.b, 0xc2)
			}
		case int:
			f.b = appendInt(f.b, int64(v))
		case int64:
			f.b = appendInt(f.b, v)
		default:
			f.reflective(v)
		}
	}
}

// Encode writes the map.
func (f *Fields) Encode(enc *msgpack.Encoder) error {
	if f.err != nil {
		return f.err
	}
	_, err := enc.Writer().Write(f.bytes())
	if f.buf != nil && cap(f.b) <= 4<<10 {
		*f.buf = f.b[:0]
		fieldBufs.Put(f.buf)
	}
	f.b, f.buf, f.n = nil, nil, 0
	return err
}

// fieldBufs keeps the buffers Fields write into between records.
var fieldBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 256)
	return &b
}}

// bytes returns the map, its header in place.
func (f *Fields) bytes() []byte {
	switch {
	case f.b == nil:
		return []byte{0x80}
	case f.n < 16:
		f.b[0] = 0x80 | byte(f.n)
		return f.b
	}
	// map16: two more bytes for the header.
	f.b = append(f.b, 0, 0)
	copy(f.b[3:], f.b[1:len(f.b)-2])
	f.b[0], f.b[1], f.b[2] = 0xde, byte(f.n>>8), byte(f.n)
	return f.b
}

// appendString writes s as the msgpack encoder does.
func appendString(b []byte, s string) []byte {
	switch l := len(s); {
	case l < 32:
		b = append(b, 0xa0|byte(l))
	case l < 256:
		b = append(b, 0xd9, byte(l))
	case l <= math.MaxUint16:
		b = append(b, 0xda, byte(l>>8), byte(l))
	default:
		b = append(b, 0xdb, byte(l>>24), byte(l>>16), byte(l>>8), byte(l))
	}
	return append(b, s...)
}

// appendInt writes i in the fewest bytes, as the encoder with compact
// integers does.
func appendInt(b []byte, i int64) []byte {
	if i >= 0 {
		switch u := uint64(i); {
		case u <= math.MaxInt8:
			return append(b, byte(u))
		case u <= math.MaxUint8:
			return append(b, 0xcc, byte(u))
		case u <= math.MaxUint16:
			return append(b, 0xcd, byte(u>>8), byte(u))
		case u <= math.MaxUint32:
			return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
		default:
			return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
		}
	}
	switch {
	case i >= -32:
		return append(b, byte(i))
	case i >= math.MinInt8:
		return append(b, 0xd0, byte(i))
	case i >= math.MinInt16:
		return append(b, 0xd1, byte(i>>8), byte(i))
	case i >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(i))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(i))
}

// appendTime writes t as the msgpack timestamp extension (type -1), in 4, 8
// or 12 bytes, as the encoder does.
func appendTime(b []byte, t time.Time) []byte {
	secs := uint64(t.Unix())
	if secs>>34 == 0 {
		data := uint64(t.Nanosecond())<<34 | secs
		if data&0xffffffff00000000 == 0 {
			return binary.BigEndian.AppendUint32(append(b, 0xd6, 0xff), uint32(data))
		}
		return binary.BigEndian.AppendUint64(append(b, 0xd7, 0xff), data)
	}
	b = binary.BigEndian.AppendUint32(append(b, 0xc7, 12, 0xff), uint32(t.Nanosecond()))
	return binary.BigEndian.AppendUint64(b, secs)
}
