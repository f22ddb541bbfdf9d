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

// base64 checks a string meant for a []byte, decoded as encoding/json does.
func (w *inputWalk) base64(h head) {
	b, ok := w.take(h.n)
	if !ok {
		return
	}
	if _, err := base64.StdEncoding.Decode(make([]byte, base64.StdEncoding.DecodedLen(len(b))), b); err != nil {
		w.issue("expected base64 (standard alphabet, with padding)")
	}
}

const timeHint = "a date and time in RFC 3339 format, like 2026-11-30T10:00:00Z"

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

func (w *inputWalk) duration(s *shape, h head, depth int) {
	switch {
	case h.class == classString:
		b, ok := w.take(h.n)
		if !ok {
			return
		}
		if _, err := time.ParseDuration(string(b)); err != nil {
			w.issue("expected " + durationHint)
		}
	case h.class == classFloat && wholeOutside(s, h.fval):
		w.issue(rangeMessage(s))
	case w.want(h, h.class == classInt, durationHint, depth):
		w.intRange(s, h)
	}
}

// text checks a value for a type that decodes itself from text: a string it
// accepts, or its binary form as a Go client's msgpack writes it.
func (w *inputWalk) text(s *shape, h head, depth int) {
	if h.class != classString && h.class != classBinary {
		w.want(h, false, "a string", depth)
		return
	}
	b, ok := w.take(h.n)
	if !ok {
		return
	}
	if err := unmarshalText(s.typ, b, h.class == classBinary, nil); err != nil {
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
	before := len(w.issues)
	w.jsonValue(h, depth)
	if w.stopped || len(w.issues) > before || s.typ == rawMessageType {
		return
	}
	j, err := transcode(w.b[start:w.off], &shape{kind: shapeAny})
	if err == nil {
		err = reflect.New(s.typ).Interface().(json.Unmarshaler).UnmarshalJSON(j)
	}
	if err != nil {
		w.issue("invalid " + s.typ.String() + ": " + err.Error())
	}
}

// jsonValue checks that a value has a JSON form: finite numbers, timestamps
// with a year of four digits, no other extension, keys that are strings,
// integers or booleans.
func (w *inputWalk) jsonValue(h head, depth int) {
	switch h.class {
	case classFloat:
		if math.IsNaN(h.fval) || math.IsInf(h.fval, 0) {
			w.issue("expected a finite number")
		}
	case classString, classBinary:
		w.take(h.n)
	case classExt:
		if h.ext == -1 {
			w.timeValue(h, depth)
			return
		}
		w.issue("expected a JSON value, got " + h.class.String())
		w.take(h.n)
	case classArray, classMap:
		n := h.n
		if h.class == classMap {
			n *= 2
		}
		if !w.fits(n, depth) {
			return
		}
		for i := range h.n {
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
				case classInt, classBool:
					e = pathElem{index: -1, other: true}
				default:
					e = pathElem{index: -1, other: true}
					w.push(e)
					w.issue("object keys must be strings, got " + kh.class.String())
					w.pop()
					w.rest(kh, depth+1)
				}
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
	}
}

// quotedValue checks a field with the "string" option: its value as a JSON
// string, or as itself.
func (w *inputWalk) quotedValue(s *shape, depth int) {
	start := w.off
	h, ok := w.head()
	if !ok {
		return
	}
	if h.class != classString || s.kind == shapeString {
		w.off = start
		w.value(s, depth)
		return
	}
	b, ok := w.take(h.n)
	if !ok || string(b) == "null" {
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
// so), or as binary data (a Go client's key of a binary form).
func stringKey(ks *shape, k []byte, bin bool) string {
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
	case shapeText:
		if err := unmarshalText(ks.typ, k, bin, nil); err != nil {
			return "invalid " + ks.typ.String() + " key: " + err.Error()
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
	// The check has refused unknown fields already, names matched exactly.
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

// transcoder rewrites a checked msgpack value as the JSON encoding/json reads
// into the shape's Go type.
type transcoder struct {
	inputWalk
	out []byte
}

var errUntranscodable = errors.New("the input has no JSON form")

func transcode(raw []byte, s *shape) ([]byte, error) {
	t := &transcoder{inputWalk: inputWalk{b: raw}, out: make([]byte, 0, len(raw)+len(raw)/2+16)}
	t.value(s, false)
	if len(t.issues) > 0 {
		return nil, fmt.Errorf("%w: %s", errUntranscodable, t.issues[0].Message)
	}
	return t.out, nil
}

func (t *transcoder) value(s *shape, quoted bool) {
	if t.stopped {
		return
	}
	h, ok := t.head()
	if !ok {
		return
	}
	if h.class == classNil {
		t.out = append(t.out, "null"...)
		return
	}
	if h.class == classString {
		t.string(s, h, quoted)
		return
	}
	if quoted && (h.class == classBool || h.class == classInt || h.class == classFloat) {
		// A number or boolean as the msgpack library writes it, for a field
		// encoding/json reads from a string.
		t.out = append(t.out, '"')
		defer func() { t.out = append(t.out, '"') }()
	}
	switch s.kind {
	case shapeBool, shapeInt, shapeUint, shapeDuration:
		t.any(h)
	case shapeFloat:
		if h.class == classFloat {
			t.float(h.fval, s.bits)
			return
		}
		t.any(h)
	case shapeString:
		b, _ := t.take(h.n)
		t.out = appendJSONString(t.out, b)
	case shapeText:
		b, _ := t.take(h.n)
		if err := unmarshalText(s.typ, b, h.class == classBinary, &t.out); err != nil {
			t.fail(err.Error())
		}
	case shapeSlice, shapeArray:
		if h.class == classBinary { // a byte array
			b, _ := t.take(h.n)
			t.out = append(t.out, '[')
			for i, c := range b {
				if i > 0 {
					t.out = append(t.out, ',')
				}
				t.out = strconv.AppendUint(t.out, uint64(c), 10)
			}
			t.out = append(t.out, ']')
			return
		}
		t.out = append(t.out, '[')
		for i := range h.n {
			if i > 0 {
				t.out = append(t.out, ',')
			}
			t.value(s.elem, false)
		}
		t.out = append(t.out, ']')
	case shapeMap:
		t.out = append(t.out, '{')
		for i := range h.n {
			if i > 0 {
				t.out = append(t.out, ',')
			}
			t.key(s.key)
			t.out = append(t.out, ':')
			t.value(s.elem, false)
		}
		t.out = append(t.out, '}')
	case shapeStruct:
		t.out = append(t.out, '{')
		for i := range h.n {
			kh, _ := t.head()
			name, _ := t.take(kh.n)
			f := s.fields[string(name)]
			if f == nil {
				t.fail("unknown field")
				return
			}
			if i > 0 {
				t.out = append(t.out, ',')
			}
			t.out = appendJSONString(t.out, name)
			t.out = append(t.out, ':')
			t.value(f.shape, f.quoted)
		}
		t.out = append(t.out, '}')
	case shapeJSON:
		if h.class == classBinary && s.typ == rawMessageType {
			// json.RawMessage as the msgpack library writes it: its JSON text.
			if b, _ := t.take(h.n); json.Valid(b) {
				t.out = append(t.out, b...)
			} else {
				t.out = appendJSONString(t.out, b)
			}
			return
		}
		t.any(h)
	default: // shapeAny, and shapeBytes and shapeTime in msgpack's own forms
		t.any(h)
	}
}

// string rewrites a string for s.
func (t *transcoder) string(s *shape, h head, quoted bool) {
	b, ok := t.take(h.n)
	if !ok {
		return
	}
	switch {
	case s.kind == shapeDuration:
		d, err := time.ParseDuration(string(b))
		if err != nil {
			t.fail(err.Error())
			return
		}
		t.out = strconv.AppendInt(t.out, int64(d), 10)
	case s.kind == shapeText:
		if err := unmarshalText(s.typ, b, false, &t.out); err != nil {
			t.fail(err.Error())
		}
	case s.kind == shapeString && quoted && !(len(b) > 0 && b[0] == '"' && json.Valid(b)):
		// The "string" option wants a JSON string inside the string; a plain
		// one is a Go client's msgpack, which ignores the option.
		q, _ := json.Marshal(string(b))
		t.out = appendJSONString(t.out, q)
	default:
		t.out = appendJSONString(t.out, b)
	}
}

// key writes a map key as a JSON string.
func (t *transcoder) key(ks *shape) {
	h, ok := t.head()
	if !ok {
		return
	}
	switch h.class {
	case classString, classBinary:
		b, _ := t.take(h.n)
		if ks.kind == shapeText {
			if err := unmarshalText(ks.typ, b, h.class == classBinary, &t.out); err != nil {
				t.fail(err.Error())
			}
			return
		}
		t.out = appendJSONString(t.out, b)
	case classInt:
		t.out = append(t.out, '"')
		t.int(h)
		t.out = append(t.out, '"')
	case classBool:
		t.out = append(t.out, `"`+strconv.FormatBool(h.mag == 1)+`"`...)
	default:
		t.fail("object keys must be strings")
	}
}

func (t *transcoder) int(h head) {
	if h.neg {
		t.out = append(t.out, '-')
	}
	t.out = strconv.AppendUint(t.out, h.mag, 10)
}

func (t *transcoder) float(f float64, bits int) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		t.fail("expected a finite number")
		return
	}
	if bits == 32 {
		f = float64(float32(f))
	}
	t.out = strconv.AppendFloat(t.out, f, 'g', -1, bits)
}

// any rewrites a value whatever its shape: binary data as base64, timestamps
// as RFC 3339, as encoding/json writes []byte and time.Time.
func (t *transcoder) any(h head) {
	switch h.class {
	case classNil:
		t.out = append(t.out, "null"...)
	case classBool:
		t.out = strconv.AppendBool(t.out, h.mag == 1)
	case classInt:
		t.int(h)
	case classFloat:
		bits := 64
		if !h.f64 {
			bits = 32
		}
		t.float(h.fval, bits)
	case classString:
		b, _ := t.take(h.n)
		t.out = appendJSONString(t.out, b)
	case classBinary:
		b, _ := t.take(h.n)
		t.out = append(t.out, '"')
		t.out = base64.StdEncoding.AppendEncode(t.out, b)
		t.out = append(t.out, '"')
	case classExt:
		b, _ := t.take(h.n)
		tm, ok := extTime(b)
		if h.ext != -1 || !ok {
			t.fail("an extension value has no JSON form")
			return
		}
		t.out = append(t.out, '"')
		t.out = tm.AppendFormat(t.out, time.RFC3339Nano)
		t.out = append(t.out, '"')
	case classArray:
		t.out = append(t.out, '[')
		for i := range h.n {
			if i > 0 {
				t.out = append(t.out, ',')
			}
			if vh, ok := t.head(); ok {
				t.any(vh)
			}
		}
		t.out = append(t.out, ']')
	case classMap:
		t.out = append(t.out, '{')
		for i := range h.n {
			if i > 0 {
				t.out = append(t.out, ',')
			}
			t.key(&shape{kind: shapeString})
			t.out = append(t.out, ':')
			if vh, ok := t.head(); ok {
				t.any(vh)
			}
		}
		t.out = append(t.out, '}')
	}
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
