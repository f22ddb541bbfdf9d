package envelope

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Fields writes a record as the msgpack map its fields make, without
// reflection: a hot record's EncodeMsgpack adds each field in declaration
// order and Fields leaves out the empty ones, so the bytes are those the
// reflective encoder writes (json names, empty fields omitted). The
// reflective encoder allocates for every field it checks for emptiness; a
// record written on every execution is cheaper this way.
type Fields struct {
	n int
	f [24]field
}

type fieldKind uint8

const (
	kindString fieldKind = iota
	kindInt
	kindBool
	kindTime
	kindRaw
	kindActor
	kindValue
)

type field struct {
	key   string
	kind  fieldKind
	s, s2 string
	i     int64
	t     time.Time
	raw   []byte
	v     any
}

func (f *Fields) add(key string, kind fieldKind) *field {
	x := &f.f[f.n]
	f.n++
	*x = field{key: key, kind: kind}
	return x
}

// String adds a string field, omitted when empty.
func (f *Fields) String(key, s string) {
	if s != "" {
		f.add(key, kindString).s = s
	}
}

// Int adds an integer field, omitted when 0.
func (f *Fields) Int(key string, i int64) {
	if i != 0 {
		f.add(key, kindInt).i = i
	}
}

// Bool adds a boolean field, omitted when false.
func (f *Fields) Bool(key string, b bool) {
	if b {
		f.add(key, kindBool)
	}
}

// Time adds a time field, omitted when zero.
func (f *Fields) Time(key string, t time.Time) {
	if !t.IsZero() {
		f.add(key, kindTime).t = t
	}
}

// Raw adds an embedded value, omitted when empty.
func (f *Fields) Raw(key string, r Raw) {
	if len(r) > 0 {
		f.add(key, kindRaw).raw = r
	}
}

// Actor adds an actor as a nested map, omitted when all its fields are empty.
func (f *Fields) Actor(key string, id, kind string, attrs map[string]string) {
	if id == "" && kind == "" && len(attrs) == 0 {
		return
	}
	x := f.add(key, kindActor)
	x.s, x.s2 = id, kind
	if len(attrs) > 0 {
		x.v = attrs
	}
}

// Value adds any other value, written by the reflective encoder, unless empty
// says it is to be omitted.
func (f *Fields) Value(key string, v any, empty bool) {
	if !empty {
		f.add(key, kindValue).v = v
	}
}

// Encode writes the map.
func (f *Fields) Encode(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(f.n); err != nil {
		return err
	}
	for i := range f.n {
		x := &f.f[i]
		if err := enc.EncodeString(x.key); err != nil {
			return err
		}
		var err error
		switch x.kind {
		case kindString:
			err = enc.EncodeString(x.s)
		case kindInt:
			err = enc.EncodeInt(x.i)
		case kindBool:
			err = enc.EncodeBool(true)
		case kindTime:
			err = enc.EncodeTime(x.t)
		case kindRaw:
			_, err = enc.Writer().Write(x.raw)
		case kindActor:
			err = encodeActor(enc, x.s, x.s2, x.v)
		case kindValue:
			err = enc.Encode(x.v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// encodeActor writes an actor's non-empty fields as a map; attrs is nil or a
// non-empty map[string]string.
func encodeActor(enc *msgpack.Encoder, id, kind string, attrs any) error {
	n := 0
	for _, set := range []bool{id != "", kind != "", attrs != nil} {
		if set {
			n++
		}
	}
	if err := enc.EncodeMapLen(n); err != nil {
		return err
	}
	for _, kv := range [...]struct{ k, v string }{{"id", id}, {"kind", kind}} {
		if kv.v == "" {
			continue
		}
		if err := enc.EncodeString(kv.k); err != nil {
			return err
		}
		if err := enc.EncodeString(kv.v); err != nil {
			return err
		}
	}
	if attrs == nil {
		return nil
	}
	if err := enc.EncodeString("attrs"); err != nil {
		return err
	}
	return enc.Encode(attrs)
}

// EncodeMsgpack writes the request without reflection.
func (r Request) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f Fields
	f.Int("v", int64(r.V))
	f.String("executionId", r.ExecutionID)
	f.String("capabilityId", r.CapabilityID)
	f.Raw("input", r.Input)
	f.Actor("actor", r.Actor.ID, r.Actor.Kind, r.Actor.Attrs)
	f.String("surface", r.Surface)
	f.String("correlationId", r.CorrelationID)
	f.Time("submittedAt", r.SubmittedAt)
	if r.Deadline != nil {
		f.Time("deadline", *r.Deadline)
	}
	if r.StartBy != nil {
		f.Time("startBy", *r.StartBy)
	}
	f.String("approvalId", r.ApprovalID)
	f.String("traceparent", r.Traceparent)
	return f.Encode(enc)
}

// EncodeMsgpack writes the envelope without reflection.
func (e Envelope) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f Fields
	f.Int("v", int64(e.V))
	f.String("executionId", e.ExecutionID)
	f.String("capabilityId", e.CapabilityID)
	f.String("status", string(e.Status))
	f.Raw("output", e.Output)
	f.Value("error", e.Error, e.Error == nil)
	f.Int("attempts", int64(e.Attempts))
	f.Value("approval", e.Approval, e.Approval == nil)
	f.Int("durationMs", e.DurationMs)
	f.String("finalizedBy", e.FinalizedBy)
	f.Time("finalizedAt", e.FinalizedAt)
	return f.Encode(enc)
}
