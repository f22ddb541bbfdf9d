// Package msgenc writes capstan's records as msgpack: the reflective
// encoder's settings every record and value is written with (fields named by
// their json tags, compact integers, a map's keys sorted by their bytes, so
// that a record's bytes follow from its value alone), a pooled encoding for
// writes that copy the bytes before they return (Encode), and Fields, the
// reflection-free writer of a hot record's map.
//
// envelope.Marshal and envelope.NewRaw are Marshal and MarshalValue; a hot
// record's EncodeMsgpack (envelope, audit, execution) is a Fields:
//
//	func (r Record) EncodeMsgpack(enc *msgpack.Encoder) error {
//		var f msgenc.Fields
//		f.Int("v", int64(r.V))
//		f.String("executionId", r.ExecutionID)
//		return f.Encode(enc)
//	}
package msgenc

import (
	"bytes"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

// records write records. Besides leaving every empty field out, they write
// the keys of a map inside a record (an actor's attrs, an error's details, a
// descriptor's input schema, an audit event's data) sorted by their bytes, so
// that a record's bytes follow from its value alone: decoded and encoded
// again, in Go or by a client in another language, it is the same bytes
// (docs/wire.md).
var records = sync.Pool{New: func() any { return newEncoder(true) }}

// values write the values records carry (envelope.NewRaw: inputs, outputs).
// A field is left out only when its tag says omitempty, as encoding/json
// does: the msgpack library counts a struct without exported fields
// (netip.Addr) as empty, and a value must not lose it, nor a zero its
// handler meant to send. A map's keys are sorted, as in records: a value's
// bytes follow from the value (a JSON input, decoded into a map, keeps no
// order to follow).
var values = sync.Pool{New: func() any { return newEncoder(false) }}

// newEncoder is an encoder of fields named by their json tags, with compact
// integers and sorted map keys; omitEmpty leaves every empty field out.
func newEncoder(omitEmpty bool) *encoder {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.SetCustomStructTag("json")
	e.enc.SetOmitEmpty(omitEmpty)
	e.enc.UseCompactInts(true)
	e.enc.SetSortMapKeys(true)
	return e
}

// Marshal encodes v as a record: every empty field left out.
func Marshal(v any) ([]byte, error) { return marshal(&records, v) }

// MarshalValue encodes v as a value a record carries: a field left out only
// when its tag says omitempty.
func MarshalValue(v any) ([]byte, error) { return marshal(&values, v) }

func marshal(pool *sync.Pool, v any) ([]byte, error) {
	e := pool.Get().(*encoder)
	defer pool.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// Encoded is a record encoded as Marshal does, left in a pooled buffer: for a
// write that copies the bytes before it returns, as a NATS publish does.
// Bytes is valid until Release, which hands the buffer back.
type Encoded struct{ e *encoder }

// Encode is Marshal into a pooled buffer. Call Release when the bytes have
// been written.
func Encode(v any) (Encoded, error) {
	e := records.Get().(*encoder)
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		records.Put(e)
		return Encoded{}, err
	}
	return Encoded{e}, nil
}

// Bytes returns the encoding; it is overwritten after Release.
func (x Encoded) Bytes() []byte { return x.e.buf.Bytes() }

// Release hands the buffer back to the pool.
func (x Encoded) Release() { records.Put(x.e) }
