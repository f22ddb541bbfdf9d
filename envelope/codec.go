package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/internal/msgenc"
	"github.com/capstan-dev/capstan/internal/msgpackhead"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Version is the schema version every record carries in its "v" field.
const Version = 1

// ErrDecode marks bytes that are not a valid record. Compare with errors.Is.
var ErrDecode = errors.New("envelope: record does not decode")

// CheckVersion refuses a record of a schema version this reader does not
// know, as not decoding (docs/wire.md: a reader refuses a record whose v is
// not Version).
func CheckVersion(v int) error {
	if v != Version {
		return fmt.Errorf("%w: schema version %d, want %d", ErrDecode, v, Version)
	}
	return nil
}

type decoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

var decoders = sync.Pool{New: func() any {
	d := &decoder{dec: msgpack.NewDecoder(nil)}
	return d
}}

// Marshal encodes v as msgpack with the json tag names as field names. Every
// empty field is left out, and the keys of a map inside a record (an actor's
// attrs, an error's details, an audit event's data) are sorted by their
// bytes, so that a record's bytes follow from its value alone: decoded and
// encoded again, in Go or by a client in another language, it is the same
// bytes (docs/wire.md).
func Marshal(v any) ([]byte, error) { return msgenc.Marshal(v) }

// Unmarshal decodes msgpack into v. Unknown fields are ignored; malformed bytes,
// lengths beyond the end of b and nesting deeper than 10000 are an error
// wrapping ErrDecode, never a panic or an allocation larger than b calls for.
func Unmarshal(b []byte, v any) (err error) {
	return unmarshal(b, v, false)
}

// UnmarshalStrict is Unmarshal that refuses fields v does not declare.
func UnmarshalStrict(b []byte, v any) error {
	return unmarshal(b, v, true)
}

func unmarshal(b []byte, v any, strict bool) (err error) {
	if err := checkWellFormed(b); err != nil {
		return fmt.Errorf("%w: %v", ErrDecode, err)
	}
	d := decoders.Get().(*decoder)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrDecode, r)
		}
		d.r.Reset(nil)
		decoders.Put(d)
	}()
	d.r.Reset(b)
	d.dec.Reset(&d.r)
	d.dec.SetCustomStructTag("json")
	d.dec.DisallowUnknownFields(strict)
	d.dec.SetMapDecoder(decodeMap)
	if err := d.dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrDecode, err)
	}
	return nil
}

// maxDepth bounds how deeply arrays and maps nest in a record, as encoding/json
// bounds JSON.
const maxDepth = 10000

// checkWellFormed walks the msgpack value at the start of b without decoding
// it. The msgpack library sizes some allocations from a length prefix alone (a
// 5-byte header can ask for a slice of 2^32 elements) and recurses once per
// level of nesting; running out of memory or stack kills the process, and no
// recover catches that. Once every length is known to fit in the bytes that
// remain and nesting is bounded, decoding allocates in proportion to len(b).
func checkWellFormed(b []byte) error {
	w := walker{b: b}
	return w.value(0)
}

type walker struct {
	b   []byte
	off int
}

var errTruncated = errors.New("record is truncated or declares more than it holds")

func (w *walker) take(n uint64) error {
	if n > uint64(len(w.b)-w.off) {
		return errTruncated
	}
	w.off += int(n)
	return nil
}

func (w *walker) value(depth int) error {
	h, next, err := msgpackhead.Read(w.b, w.off)
	switch {
	case errors.Is(err, msgpackhead.ErrNotMsgpack):
		return fmt.Errorf("byte 0x%02x at offset %d is not a msgpack value", w.b[w.off], w.off)
	case err != nil:
		return errTruncated
	}
	w.off = next
	switch h.Class {
	case msgpackhead.String, msgpackhead.Binary, msgpackhead.Ext:
		return w.take(h.N)
	case msgpackhead.Array:
		return w.items(h.N, depth)
	case msgpackhead.Map:
		return w.items(2*h.N, depth)
	}
	return nil
}

// items walks the n values inside an array or map.
func (w *walker) items(n uint64, depth int) error {
	if depth >= maxDepth {
		return fmt.Errorf("values nest deeper than %d", maxDepth)
	}
	if n > uint64(len(w.b)-w.off) { // every value takes a byte at least
		return errTruncated
	}
	for range n {
		if err := w.value(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// decodeMap decodes a map inside an untyped value: as map[string]any, or as
// map[any]any when a key is not a string (msgpack written by other languages
// may use integer keys), which the msgpack library would refuse.
func decodeMap(d *msgpack.Decoder) (any, error) {
	n, err := d.DecodeMapLen()
	if err != nil || n == -1 {
		return nil, err
	}
	m := make(map[string]any, n)
	var u map[any]any // from the first key that is not a string
	for range n {
		c, err := d.PeekCode()
		if err != nil {
			return nil, err
		}
		var k any
		var s string
		isString := msgpcode.IsString(c) || msgpcode.IsBin(c) // binary keys read as strings, as msgpack does
		if isString {
			s, err = d.DecodeString()
		} else if k, err = d.DecodeInterface(); err == nil {
			k, err = mapKey(k)
		}
		if err != nil {
			return nil, err
		}
		v, err := d.DecodeInterface()
		if err != nil {
			return nil, err
		}
		if isString && u == nil {
			m[s] = v
			continue
		}
		if isString {
			k = s
		}
		if u == nil {
			u = make(map[any]any, n)
			for s, x := range m {
				u[s] = x
			}
		}
		u[k] = v
	}
	if u != nil {
		return u, nil
	}
	return m, nil
}

// mapKey makes a key that is not a string usable in a map[any]any. Integers
// become int64 (uint64 above its range) so that 1 written in one byte or in
// nine is one key, and re-encoding a map does not merge its keys.
func mapKey(k any) (any, error) {
	switch x := k.(type) {
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), nil
		}
	}
	if k != nil && !reflect.TypeOf(k).Comparable() {
		return nil, fmt.Errorf("map key of type %T", k)
	}
	return k, nil
}

// Raw is one msgpack-encoded value carried inside a record (an input or an
// output). In msgpack it is embedded as the value itself, not as a byte string;
// in JSON it is the same value as JSON.
type Raw []byte

// NewRaw encodes v as a Raw value. Struct fields are left out only when
// their json tag says omitempty, as encoding/json does (the msgpack library
// would count a struct without exported fields, a netip.Addr, as empty); a
// map's keys are sorted, as in records.
func NewRaw(v any) (Raw, error) {
	b, err := msgenc.MarshalValue(v)
	return Raw(b), err
}

// MustRaw is NewRaw for values known to encode, such as literals in examples.
func MustRaw(v any) Raw {
	r, err := NewRaw(v)
	if err != nil {
		panic(err)
	}
	return r
}

// RawFromJSON converts JSON text to a Raw value.
func RawFromJSON(j []byte) (Raw, error) {
	if len(bytes.TrimSpace(j)) == 0 {
		return nil, nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("input is not valid JSON: %w", err)
	}
	// dec.More would miss a stray closing bracket: only the end of input will do.
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("input is not valid JSON: more after the value")
	}
	v, err := jsonNumbers(v)
	if err != nil {
		return nil, err
	}
	return NewRaw(v)
}

// jsonNumbers turns json.Number into int64 or uint64 where it is a whole number
// that fits, else float64, so that integers survive the trip into msgpack as
// integers. A number beyond float64 is refused, as encoding/json refuses it,
// rather than turned into an infinity.
func jsonNumbers(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(t.String(), 10, 64); err == nil {
			return u, nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("input is not valid JSON: number %s is out of range", t)
		}
		return f, nil
	case map[string]any:
		for k, x := range t {
			y, err := jsonNumbers(x)
			if err != nil {
				return nil, err
			}
			t[k] = y
		}
	case []any:
		for i, x := range t {
			y, err := jsonNumbers(x)
			if err != nil {
				return nil, err
			}
			t[i] = y
		}
	}
	return v, nil
}

// Decode decodes the raw value into v.
func (r Raw) Decode(v any) error { return Unmarshal(r, v) }

// Value decodes the raw value into plain Go values (maps, slices, scalars).
func (r Raw) Value() (any, error) {
	if len(r) == 0 {
		return nil, nil
	}
	var v any
	err := Unmarshal(r, &v)
	return v, err
}

// EncodeMsgpack embeds the value as is.
func (r Raw) EncodeMsgpack(enc *msgpack.Encoder) error {
	if len(r) == 0 {
		return enc.EncodeNil()
	}
	_, err := enc.Writer().Write(r)
	return err
}

// DecodeMsgpack keeps the next value's bytes.
func (r *Raw) DecodeMsgpack(dec *msgpack.Decoder) error {
	b, err := dec.DecodeRaw()
	if err != nil {
		return err
	}
	if len(b) == 1 && b[0] == 0xc0 { // nil
		*r = nil
		return nil
	}
	*r = Raw(bytes.Clone(b))
	return nil
}

// MarshalJSON renders the value as JSON.
func (r Raw) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	v, err := r.Value()
	if err != nil {
		return nil, err
	}
	return json.Marshal(jsonSafe(v))
}

// UnmarshalJSON reads a JSON value.
func (r *Raw) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*r = nil
		return nil
	}
	raw, err := RawFromJSON(b)
	if err != nil {
		return err
	}
	*r = raw
	return nil
}

// jsonSafe converts msgpack-decoded values that encoding/json refuses (maps with
// non-string keys, byte strings) into JSON-friendly ones. A timestamp reads as
// RFC 3339 in UTC: msgpack keeps the instant, not the zone it was written in,
// and the decoder's local zone is no business of the reader.
func jsonSafe(v any) any {
	switch t := v.(type) {
	case time.Time:
		return t.UTC()
	case map[string]any:
		for k, x := range t {
			t[k] = jsonSafe(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = jsonSafe(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = jsonSafe(x)
		}
		return t
	}
	return v
}
