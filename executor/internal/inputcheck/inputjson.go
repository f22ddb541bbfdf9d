package inputcheck

import (
	"encoding"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/envelope"
)

// An input means what encoding/json makes of it. Agents, the CLI and MCP hosts
// send JSON, which reaches a worker as msgpack holding only what JSON holds
// (null, booleans, integers, 64-bit floats, strings, arrays, objects); Go
// clients send msgpack written from their own types (timestamps, binary data,
// 32-bit floats). The check accepts both forms, and a checked input is then
// rewritten as JSON, shape by shape, and decoded by encoding/json, so that a
// handler sees the value encoding/json would give it:
//
//   - time.Time: an RFC 3339 string (or a msgpack timestamp);
//   - time.Duration: integer nanoseconds, as encoding/json reads it, or a Go
//     duration string such as "1h30m" or "250ms";
//   - integers of every width: a value that does not fit is an issue, never
//     truncated; floats: a finite number, within float32's range for float32;
//   - []byte: a base64 string (standard alphabet, padded), or binary data;
//   - types implementing json.Unmarshaler (json.RawMessage among them) get
//     their JSON; types implementing encoding.TextUnmarshaler (netip.Addr,
//     uuid.UUID) their string, or their binary form from a Go client;
//   - the json "string" option: the number or boolean as a JSON string (or as
//     itself, as the msgpack library writes it);
//   - a field without omitempty or omitzero that is not a pointer must be
//     present, as the schema's required list says.
//
// An input type holding a type that decodes itself from msgpack only keeps the
// msgpack library's decoding (see shape.msgpackOnly).

var (
	durationType        = reflect.TypeFor[time.Duration]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
)

// quotable tells whether encoding/json applies the "string" option to a field
// of type ft: booleans, numbers and strings, behind at most one pointer.
func quotable(ft reflect.Type, s *shape) bool {
	if ft.Name() == "" && ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	switch ft.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.String:
	default:
		return false
	}
	switch s.kind {
	case shapeBool, shapeInt, shapeUint, shapeFloat, shapeString:
		return true
	}
	return false
}

// rangeMessage says which integers an integer shape holds.
func rangeMessage(s *shape) string {
	if s.kind == shapeUint {
		return fmt.Sprintf("expected an integer from 0 to %d", uint64(math.MaxUint64)>>(64-s.bits))
	}
	limit := uint64(1) << (s.bits - 1)
	return fmt.Sprintf("expected an integer from %d to %d", -int64(limit-1)-1, int64(limit-1))
}

// wholeOutside tells a whole number outside an integer shape's range: JSON
// integers beyond 64 bits reach the worker as floats, and a number out of range
// is best said so rather than refused for its form.
func wholeOutside(s *shape, f float64) bool {
	if f != math.Trunc(f) || math.IsInf(f, 0) {
		return false
	}
	if s.kind == shapeUint {
		return f < 0 || f >= math.Ldexp(1, s.bits)
	}
	return f < -math.Ldexp(1, s.bits-1) || f >= math.Ldexp(1, s.bits-1)
}

func (w *inputWalk) floatRange(s *shape, h head) {
	switch {
	case math.IsNaN(h.fval) || math.IsInf(h.fval, 0):
		w.issue("expected a finite number") // JSON has no NaN or infinity
	case s.bits == 32 && math.IsInf(float64(float32(h.fval)), 0):
		w.issue(fmt.Sprintf("expected a number from %g to %g", -math.MaxFloat32, math.MaxFloat32))
	}
}

// base64 checks a string meant for a []byte, decoded as encoding/json does,
// and writes it as it came.
func (w *inputWalk) base64(h head) {
	b, ok := w.take(h.n)
	if !ok {
		return
	}
	if _, err := base64.StdEncoding.Decode(make([]byte, base64.StdEncoding.DecodedLen(len(b))), b); err != nil {
		w.issue("expected base64 (standard alphabet, with padding)")
	}
	w.putString(b)
}

const timeHint = "a date and time in RFC 3339 format, like 2026-11-30T10:00:00Z"

// timeValue checks a time, and writes it in RFC 3339 (a timestamp as
// encoding/json writes a time.Time).
func (w *inputWalk) timeValue(h head, depth int) {
	switch {
	case h.class == classString:
		b, ok := w.take(h.n)
		if !ok {
			return
		}
		var t time.Time
		if t.UnmarshalText(b) != nil {
			w.issue("expected " + timeHint)
		}
		w.putString(b)
	case h.class == classExt && h.ext == -1:
		b, ok := w.take(h.n)
		if !ok {
			return
		}
		t, ok := extTime(b)
		switch {
		case !ok:
			w.issue("expected a msgpack timestamp of 4, 8 or 12 bytes")
		case t.Year() < 0 || t.Year() > 9999:
			w.issue("expected a time between the years 0 and 9999") // RFC 3339 has four digits
		default:
			w.putTime(t)
		}
	default:
		w.want(h, false, timeHint, depth)
	}
}

// extTime reads the msgpack timestamp extension (type -1).
func extTime(b []byte) (time.Time, bool) {
	switch len(b) {
	case 4:
		return time.Unix(int64(binary.BigEndian.Uint32(b)), 0).UTC(), true
	case 8:
		v := binary.BigEndian.Uint64(b)
		if v>>34 >= 1e9 {
			return time.Time{}, false
		}
		return time.Unix(int64(v&(1<<34-1)), int64(v>>34)).UTC(), true
	case 12:
		nsec := binary.BigEndian.Uint32(b)
		if nsec >= 1e9 {
			return time.Time{}, false
		}
		return time.Unix(int64(binary.BigEndian.Uint64(b[4:])), int64(nsec)).UTC(), true
	}
	return time.Time{}, false
}

const durationHint = `a duration: a string like "1h30m" or "250ms", or an integer of nanoseconds`

// duration checks a duration, and writes it as integer nanoseconds.
func (w *inputWalk) duration(s *shape, h head, depth int) {
	switch {
	case h.class == classString:
		b, ok := w.take(h.n)
		if !ok {
			return
		}
		d, err := time.ParseDuration(string(b))
		if err != nil {
			w.issue("expected " + durationHint)
		}
		if w.emit {
			w.out = strconv.AppendInt(w.out, int64(d), 10)
		}
	case h.class == classFloat && wholeOutside(s, h.fval):
		w.issue(rangeMessage(s))
	case w.want(h, h.class == classInt, durationHint, depth):
		w.intRange(s, h)
		w.putInt(h)
	}
}

// text checks a value for a type that decodes itself from text: a string it
// accepts, or its binary form as a Go client's msgpack writes it; it writes
// the value's text.
func (w *inputWalk) text(s *shape, h head, depth int) {
	if h.class != classString && h.class != classBinary {
		w.want(h, false, "a string", depth)
		return
	}
	b, ok := w.take(h.n)
	if !ok {
		return
	}
	if err := unmarshalText(s.typ, b, h.class == classBinary, w.to()); err != nil {
		w.issue("invalid " + s.typ.String() + ": " + err.Error())
	}
}

// unmarshalText decodes b into a new value of t (its binary form when bin and
// t has one), and appends the value's text form to out when out is not nil.
func unmarshalText(t reflect.Type, b []byte, bin bool, out *[]byte) error {
	v := reflect.New(t)
	if bu, ok := v.Interface().(encoding.BinaryUnmarshaler); ok && bin {
		if err := bu.UnmarshalBinary(b); err != nil {
			return err
		}
		if out == nil {
			return nil
		}
		if tm, ok := v.Interface().(encoding.TextMarshaler); ok {
			text, err := tm.MarshalText()
			if err != nil {
				return err
			}
			*out = appendJSONString(*out, text)
			return nil
		}
	} else if err := v.Interface().(encoding.TextUnmarshaler).UnmarshalText(b); err != nil {
		return err
	}
	if out != nil {
		*out = appendJSONString(*out, b)
	}
	return nil
}

// selfDecoding checks a value for a type with its own JSON decoder: any JSON
// value, which the type's UnmarshalJSON then accepts or refuses.
func (w *inputWalk) selfDecoding(s *shape, h head, start, depth int) {
	if h.class == classBinary && s.typ == rawMessageType {
		// json.RawMessage as the msgpack library writes it: its JSON text.
		if b, ok := w.take(h.n); ok && w.emit {
			if json.Valid(b) {
				w.out = append(w.out, b...)
			} else {
				w.putString(b)
			}
		}
		return
	}
	before, mark := len(w.issues), len(w.out)
	w.jsonValue(h, depth)
	if w.stopped || len(w.issues) > before || s.typ == rawMessageType {
		return
	}
	// The value as JSON: what this walk wrote, or, when it writes nothing, a
	// walk of the value alone that does.
	j := w.out[mark:]
	var err error
	if !w.emit {
		j, err = transcode(w.b[start:w.off], &shape{kind: shapeAny})
	}
	if err == nil {
		err = reflect.New(s.typ).Interface().(json.Unmarshaler).UnmarshalJSON(j)
	}
	if err != nil {
		w.issue("invalid " + s.typ.String() + ": " + err.Error())
	}
}

// jsonValue checks that a value has a JSON form — finite numbers, timestamps
// with a year of four digits, no other extension, keys that are strings,
// integers or booleans — and writes it as encoding/json writes what it would
// decode into an interface: binary data as base64, timestamps in RFC 3339.
func (w *inputWalk) jsonValue(h head, depth int) {
	switch h.class {
	case classNil:
		w.put("null")
	case classBool:
		w.putBool(h.mag == 1)
	case classInt:
		w.putInt(h)
	case classFloat:
		if math.IsNaN(h.fval) || math.IsInf(h.fval, 0) {
			w.issue("expected a finite number")
			return
		}
		bits := 64
		if !h.f64 {
			bits = 32
		}
		w.putFloat(h.fval, bits)
	case classString:
		if b, ok := w.take(h.n); ok {
			w.putString(b)
		}
	case classBinary:
		if b, ok := w.take(h.n); ok {
			w.putBase64(b)
		}
	case classExt:
		if h.ext == -1 {
			w.timeValue(h, depth)
			return
		}
		w.issue("expected a JSON value, got " + h.class.String())
		w.take(h.n)
	case classArray, classMap:
		if _, ok := w.items(h, depth); !ok {
			return
		}
		open, end := "[", "]"
		if h.class == classMap {
			open, end = "{", "}"
		}
		w.put(open)
		for i := range h.n {
			if i > 0 {
				w.put(",")
			}
			e := pathElem{index: int(i)}
			if h.class == classMap {
				kh, ok := w.head()
				if !ok {
					return
				}
				switch kh.class {
				case classString, classBinary:
					k, ok := w.take(kh.n)
					if !ok {
						return
					}
					e = pathElem{key: k, index: -1}
					w.putString(k)
				case classInt, classBool:
					e = pathElem{index: -1, other: true}
					w.put(`"`)
					w.jsonValue(kh, depth+1)
					w.put(`"`)
				default:
					e = pathElem{index: -1, other: true}
					w.push(e)
					w.issue("object keys must be strings, got " + kh.class.String())
					w.pop()
					w.rest(kh, depth+1)
				}
				w.put(":")
			}
			w.push(e)
			if vh, ok := w.head(); ok {
				w.jsonValue(vh, depth+1)
			}
			w.pop()
			if w.stopped {
				return
			}
		}
		w.put(end)
	}
}

// stringValue writes a string (or binary data) meant for a string. A field
// with the "string" option wants a JSON string inside the string; a plain one
// is a Go client's msgpack, which ignores the option.
func (w *inputWalk) stringValue(h head, quoted bool) {
	b, ok := w.take(h.n)
	if !ok || !w.emit {
		return
	}
	if quoted && h.class == classString && !(len(b) > 0 && b[0] == '"' && json.Valid(b)) {
		q, _ := json.Marshal(string(b))
		w.putString(q)
		return
	}
	w.putString(b)
}

// quotedString checks a string for a boolean or number field with the
// "string" option, which encoding/json reads from the string, and writes it.
func (w *inputWalk) quotedString(s *shape, h head) {
	b, ok := w.take(h.n)
	if !ok {
		return
	}
	w.putString(b)
	if string(b) == "null" {
		return
	}
	var err error
	switch s.kind {
	case shapeBool:
		if string(b) != "true" && string(b) != "false" {
			w.issue(`expected "true" or "false"`)
		}
		return
	case shapeInt:
		if err = jsonNumber(b); err == nil {
			_, err = strconv.ParseInt(string(b), 10, s.bits)
		}
	case shapeUint:
		if err = jsonNumber(b); err == nil {
			_, err = strconv.ParseUint(string(b), 10, s.bits)
		}
	case shapeFloat:
		if err = jsonNumber(b); err == nil {
			_, err = strconv.ParseFloat(string(b), s.bits)
		}
	}
	switch {
	case errors.Is(err, strconv.ErrRange) && s.kind != shapeFloat:
		w.issue(rangeMessage(s) + ", in a string")
	case err != nil && s.kind == shapeFloat:
		w.issue("expected a number in a string")
	case err != nil:
		w.issue("expected an integer in a string")
	}
}

var errNotJSONNumber = errors.New("not a JSON number")

// jsonNumber checks JSON's number syntax, which strconv's parsers exceed.
func jsonNumber(b []byte) error {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return errNotJSONNumber
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return errNotJSONNumber
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return errNotJSONNumber
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i != len(b) {
		return errNotJSONNumber
	}
	return nil
}

// stringKey checks a map key that came as a string (JSON names every key
// so), or as binary data, for a key type other than one that decodes itself
// from text (see mapKey).
func stringKey(ks *shape, k []byte) string {
	switch ks.kind {
	case shapeString, shapeBytes, shapeAny, shapeJSON:
		return ""
	case shapeInt:
		if _, err := strconv.ParseInt(string(k), 10, ks.bits); err != nil {
			return "expected a key that is an integer from " + rangeMessage(ks)[len("expected an integer from "):]
		}
		return ""
	case shapeUint:
		if _, err := strconv.ParseUint(string(k), 10, ks.bits); err != nil {
			return "expected a key that is an integer from " + rangeMessage(ks)[len("expected an integer from "):]
		}
		return ""
	}
	return "unexpected key type: a string"
}

// decodeChecked decodes a checked input into v.
func decodeChecked(raw []byte, s *shape, v any) error {
	if decodesByMsgpack(s) {
		return envelope.UnmarshalStrict(raw, v)
	}
	j, err := transcode(raw, s)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}

// decodeErrorPath is the path encoding/json names in its error, if any.
func decodeErrorPath(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	return ""
}

var msgpackRoutes sync.Map // *shape -> bool

// decodesByMsgpack tells whether an input type holds a msgpackOnly type.
func decodesByMsgpack(s *shape) bool {
	if v, ok := msgpackRoutes.Load(s); ok {
		return v.(bool)
	}
	seen := map[*shape]bool{}
	var walk func(*shape) bool
	walk = func(s *shape) bool {
		if s == nil || seen[s] {
			return false
		}
		seen[s] = true
		if s.msgpackOnly || walk(s.elem) || walk(s.key) {
			return true
		}
		for _, f := range s.order {
			if walk(f.shape) {
				return true
			}
		}
		return false
	}
	r := walk(s)
	msgpackRoutes.Store(s, r)
	return r
}

var errUntranscodable = errors.New("the input has no JSON form")

// transcode writes a checked value as the JSON encoding/json reads into the
// shape's Go type: the walk that checks it, writing.
func transcode(raw []byte, s *shape) ([]byte, error) {
	issues, j := walk(raw, s, true)
	if len(issues) > 0 {
		return nil, fmt.Errorf("%w: %s", errUntranscodable, issues[0].Message)
	}
	return j, nil
}

// Writing: each is a no-op unless the walk writes (inputWalk.emit).

func (w *inputWalk) put(s string) {
	if w.emit {
		w.out = append(w.out, s...)
	}
}

func (w *inputWalk) putString(b []byte) {
	if w.emit {
		w.out = appendJSONString(w.out, b)
	}
}

func (w *inputWalk) putBool(v bool) {
	if w.emit {
		w.out = strconv.AppendBool(w.out, v)
	}
}

func (w *inputWalk) putInt(h head) {
	if !w.emit {
		return
	}
	if h.neg {
		w.out = append(w.out, '-')
	}
	w.out = strconv.AppendUint(w.out, h.mag, 10)
}

// putFloat writes f as a float of bits, as encoding/json reads it back
// exactly; the check has refused NaN and the infinities.
func (w *inputWalk) putFloat(f float64, bits int) {
	if !w.emit {
		return
	}
	if bits == 32 {
		f = float64(float32(f))
	}
	w.out = strconv.AppendFloat(w.out, f, 'g', -1, bits)
}

// putBase64 writes binary data as encoding/json writes a []byte.
func (w *inputWalk) putBase64(b []byte) {
	if !w.emit {
		return
	}
	w.out = append(w.out, '"')
	w.out = base64.StdEncoding.AppendEncode(w.out, b)
	w.out = append(w.out, '"')
}

// putByteList writes a byte array, which the msgpack library writes as
// binary data, as encoding/json reads an array: its numbers.
func (w *inputWalk) putByteList(b []byte) {
	if !w.emit {
		return
	}
	w.out = append(w.out, '[')
	for i, c := range b {
		if i > 0 {
			w.out = append(w.out, ',')
		}
		w.out = strconv.AppendUint(w.out, uint64(c), 10)
	}
	w.out = append(w.out, ']')
}

func (w *inputWalk) putTime(t time.Time) {
	if !w.emit {
		return
	}
	w.out = append(w.out, '"')
	w.out = t.AppendFormat(w.out, time.RFC3339Nano)
	w.out = append(w.out, '"')
}

// to is where a value's text form is written: out, or nowhere.
func (w *inputWalk) to() *[]byte {
	if w.emit {
		return &w.out
	}
	return nil
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD,
// as encoding/json writes it.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// fieldSet is the fields an object names, by index; a struct of up to 128
// fields needs no allocation.
type fieldSet struct {
	small [2]uint64
	more  []uint64
}

func (fs *fieldSet) add(i int) {
	if i < 128 {
		fs.small[i/64] |= 1 << (i % 64)
		return
	}
	i -= 128
	for len(fs.more) <= i/64 {
		fs.more = append(fs.more, 0)
	}
	fs.more[i/64] |= 1 << (i % 64)
}

func (fs *fieldSet) has(i int) bool {
	if i < 128 {
		return fs.small[i/64]&(1<<(i%64)) != 0
	}
	i -= 128
	return i/64 < len(fs.more) && fs.more[i/64]&(1<<(i%64)) != 0
}

// required tells a field the input must name, as the schema's required
// list says: one without omitempty or omitzero that is not a pointer.
func (f *shapeField) required() bool { return !f.omitEmpty && !f.pointer }

// missing reports each required field an object did not name.
func (w *inputWalk) missing(s *shape, present *fieldSet) {
	for _, f := range s.order {
		if f.required() && !present.has(f.index) {
			w.push(pathElem{key: []byte(f.name), index: -1})
			w.issue("missing required field")
			w.pop()
		}
	}
}
