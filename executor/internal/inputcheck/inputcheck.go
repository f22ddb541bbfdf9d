package inputcheck

import (
	"encoding"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/msgpackhead"
	"github.com/vmihailenco/msgpack/v5"
)

// Stage 5 checks and decodes an input in one walk. The walk reads the
// msgpack bytes against a shape compiled once per Go input type, collects
// every issue with its path, and, for an input type encoding/json decodes,
// writes the value as the JSON encoding/json reads into that type (see
// inputjson.go); only an input without issues is then decoded. The check runs
// on every input, not only on failures: the msgpack library silently
// truncates integers that do not fit (300 into an int8, -1 into a uint8) and
// reads an array into a struct by position, and an input must not mean
// something else than what the caller sent. Checking alone allocates nothing
// unless it finds an issue.

// Issue and InputError are the public envelope.Issue and
// envelope.InputError.
type (
	Issue      = envelope.Issue
	InputError = envelope.InputError
)

// maxIssues bounds the issues reported for one input.
const maxIssues = 50

// maxInputDepth bounds how deeply the check follows nested values.
const maxInputDepth = 1000

// Issues travel in the INPUT_INVALID envelope and the record's cause, which
// the server refuses beyond its payload limit: an issue's path and message
// are shortened, so that a long key above many issues, or a long value a
// type's error quotes, cannot make the report outgrow the input.
const (
	maxKeyText   = 64  // a key in a path
	maxPathText  = 256 // a whole path, its last part kept
	maxIssueText = 256 // a message
)

type shapeKind uint8

const (
	shapeAny    shapeKind = iota // anything: interfaces, types with their own decoder
	shapeBool                    //
	shapeInt                     // signed integer of bits
	shapeUint                    // unsigned integer of bits
	shapeFloat                   // float of bits
	shapeString                  //
	shapeBytes                   // []byte: base64 text, or binary data
	shapeTime                    // time.Time: RFC 3339 text, or a msgpack timestamp
	shapeSlice                   //
	shapeArray                   // fixed length n
	shapeMap                     //
	shapeStruct                  //
)

// Shapes of types that encoding/json reads in their own way.
const (
	shapeDuration shapeKind = shapeStruct + 1 + iota // time.Duration: nanoseconds, or a duration string
	shapeText                                        // types decoding themselves from text (encoding.TextUnmarshaler)
	shapeJSON                                        // types decoding themselves from JSON (json.Unmarshaler)
)

// shape is a Go type as the input check and the JSON Schema see it.
type shape struct {
	kind   shapeKind
	bits   int
	n      int    // array length
	elem   *shape // slice, array and map values
	key    *shape // map keys
	fields map[string]*shapeField
	order  []*shapeField // declaration order
	name   string        // the Go type's name, for schema definitions
	typ    reflect.Type  // shapeText and shapeJSON: the type that decodes itself

	// msgpackOnly marks a type only the msgpack library can decode: one with
	// its own msgpack or binary decoder but none for JSON or text, or a map
	// whose keys JSON cannot name. An input type holding one is decoded by the
	// msgpack library rather than with encoding/json's meaning.
	msgpackOnly bool
}

type shapeField struct {
	name      string
	shape     *shape
	omitEmpty bool
	pointer   bool
	quoted    bool // the json "string" option: the value may come as a JSON string
	index     int  // in the struct's order
}

var shapes sync.Map // reflect.Type -> *shape

var (
	timeType            = reflect.TypeFor[time.Time]()
	customDecoderType   = reflect.TypeFor[msgpack.CustomDecoder]()
	unmarshalerType     = reflect.TypeFor[msgpack.Unmarshaler]()
	binaryUnmarshalType = reflect.TypeFor[encoding.BinaryUnmarshaler]()
	textUnmarshalType   = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// shapeOf compiles (once per type) how values of t are checked.
func shapeOf(t reflect.Type) *shape {
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	building := map[reflect.Type]*shape{}
	s := compileShape(t, building)
	for typ, sh := range building {
		shapes.LoadOrStore(typ, sh)
	}
	return s
}

func compileShape(t reflect.Type, building map[reflect.Type]*shape) *shape {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s, ok := building[t]; ok {
		return s // a recursive type: the shape is being filled in
	}
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	s := &shape{name: t.Name()}
	building[t] = s
	pt := reflect.PointerTo(t)
	switch {
	case t == timeType:
		s.kind = shapeTime
		return s
	case t == durationType:
		s.kind, s.bits = shapeDuration, 64
		return s
	case pt.Implements(jsonUnmarshalerType):
		s.kind, s.typ = shapeJSON, t
		return s
	case t.Implements(customDecoderType) || pt.Implements(customDecoderType) ||
		t.Implements(unmarshalerType) || pt.Implements(unmarshalerType):
		s.kind, s.msgpackOnly = shapeAny, true
		return s
	case pt.Implements(textUnmarshalType):
		s.kind, s.typ = shapeText, t
		return s
	case pt.Implements(binaryUnmarshalType):
		s.kind, s.msgpackOnly = shapeAny, true
		return s
	}
	switch t.Kind() {
	case reflect.Bool:
		s.kind = shapeBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		s.kind, s.bits = shapeInt, t.Bits()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		s.kind, s.bits = shapeUint, t.Bits()
	case reflect.Float32, reflect.Float64:
		s.kind, s.bits = shapeFloat, t.Bits()
	case reflect.String:
		s.kind = shapeString
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			s.kind = shapeBytes
			break
		}
		s.kind, s.elem = shapeSlice, compileShape(t.Elem(), building)
	case reflect.Array:
		s.kind, s.n, s.elem = shapeArray, t.Len(), compileShape(t.Elem(), building)
	case reflect.Map:
		s.kind, s.key, s.elem = shapeMap, compileShape(t.Key(), building), compileShape(t.Elem(), building)
		switch s.key.kind {
		case shapeString, shapeInt, shapeUint, shapeText:
		default: // encoding/json names keys by strings, integers or text only
			s.msgpackOnly = true
		}
	case reflect.Struct:
		s.kind, s.fields = shapeStruct, map[string]*shapeField{}
		addFields(s, t, building)
	default: // interfaces, and kinds that never decode (func, chan)
		s.kind = shapeAny
	}
	return s
}

// addFields adds t's fields under their json names, chosen as encoding/json
// chooses them, so that the field an input names is the one checked and the
// one decoded into. Embedded structs without a json name are inlined, level
// by level; of the fields sharing a name, the shallowest wins, then the one a
// tag names, and two left at par cancel each other: encoding/json fills
// neither, so the name is no field (an input naming it is refused).
func addFields(s *shape, t reflect.Type, building map[reflect.Type]*shape) {
	type candidate struct {
		f      reflect.StructField
		name   string
		opts   string
		depth  int
		tagged bool
	}
	var cands []candidate
	byName := map[string][]int{}
	visited := map[reflect.Type]bool{}
	level, count := []reflect.Type{t}, map[reflect.Type]int{t: 1}
	for depth := 0; len(level) > 0; depth++ {
		var next []reflect.Type
		nextCount := map[reflect.Type]int{}
		for _, typ := range level {
			if visited[typ] {
				continue
			}
			visited[typ] = true
			for i := range typ.NumField() {
				f := typ.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" && opts == "" {
					continue
				}
				if f.Anonymous && name == "" {
					et := f.Type
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if et.Kind() == reflect.Struct {
						if nextCount[et]++; nextCount[et] == 1 {
							next = append(next, et)
						}
						continue
					}
				}
				if !f.IsExported() {
					continue
				}
				tagged := name != ""
				if !tagged {
					name = f.Name
				}
				byName[name] = append(byName[name], len(cands))
				cands = append(cands, candidate{f: f, name: name, opts: opts, depth: depth, tagged: tagged})
				if count[typ] > 1 {
					// The type is embedded twice at this level: its fields
					// cancel each other, as encoding/json's do.
					byName[name] = append(byName[name], -1)
				}
			}
		}
		level, count = next, nextCount
	}
	for i, c := range cands {
		ids := byName[c.name]
		of := func(k int) (int, bool) {
			for ids[k] < 0 { // a twin: the candidate it copies
				k--
			}
			return cands[ids[k]].depth, cands[ids[k]].tagged
		}
		if w := dominant(len(ids), of); w < 0 || ids[w] != i {
			continue
		}
		ft := c.f.Type
		sf := &shapeField{name: c.name, shape: compileShape(ft, building), omitEmpty: hasOption(c.opts, "omitempty") || hasOption(c.opts, "omitzero"),
			pointer: ft.Kind() == reflect.Pointer}
		sf.quoted = hasOption(c.opts, "string") && quotable(ft, sf.shape)
		s.fields[c.name] = sf
		sf.index = len(s.order)
		s.order = append(s.order, sf)
	}
}

// dominant picks, of n candidates sharing a name, the one encoding/json
// fills: the only one at the least depth, or the only tagged one there; -1
// when none is.
func dominant(n int, of func(int) (depth int, tagged bool)) int {
	least := -1
	for k := range n {
		if d, _ := of(k); least < 0 || d < least {
			least = d
		}
	}
	win, only, tagged, at := -1, -1, 0, 0
	for k := range n {
		d, tg := of(k)
		if d != least {
			continue
		}
		at++
		only = k
		if tg {
			tagged++
			win = k
		}
	}
	switch {
	case tagged == 1:
		return win
	case tagged == 0 && at == 1:
		return only
	}
	return -1
}

func hasOption(opts, want string) bool {
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		if o == want {
			return true
		}
	}
	return false
}

// decodeInput checks raw against the input type's shape and decodes it: the
// walk that checks it also writes the JSON that encoding/json decodes, unless
// the type is decoded by the msgpack library (decodesByMsgpack).
func decodeInput[In any](raw envelope.Raw, s *shape) (*In, error) {
	in := new(In)
	if len(raw) == 0 || len(raw) == 1 && raw[0] == 0xc0 {
		// No input, or null: an empty object to a struct, whose required
		// fields are then missing, as the schema's required list says.
		if s.kind == shapeStruct {
			if issues := checkInput([]byte{0x80}, s); len(issues) > 0 {
				return nil, &InputError{Issues: issues}
			}
		}
		return in, nil
	}
	byMsgpack := decodesByMsgpack(s)
	object, isObject := any(in).(*map[string]any)
	isObject = isObject && !byMsgpack
	issues, j := walk(raw, s, !byMsgpack && !isObject)
	if len(issues) > 0 {
		return nil, &InputError{Issues: issues}
	}
	if isObject {
		// Any object: built from the bytes, as encoding/json reads it from
		// the walk's JSON (plain.go); written as JSON when it cannot be.
		if m, ok := plainObject(raw); ok {
			*object = m
			return in, nil
		}
		_, j = walk(raw, s, true)
	}
	var err error
	if byMsgpack {
		err = envelope.UnmarshalStrict(raw, in)
	} else {
		// The walk has refused unknown fields already, names matched exactly.
		err = json.Unmarshal(j, in)
	}
	if err != nil {
		// The check found nothing the decoder refuses: a type with its own
		// decoder, or a case the check does not model.
		return nil, &InputError{Issues: []Issue{{Path: shortenPath(decodeErrorPath(err)), Message: "the input does not match the capability's input type"}}, Cause: err}
	}
	return in, nil
}

// checkInput walks one msgpack value against s and returns every issue.
func checkInput(raw []byte, s *shape) []Issue {
	issues, _ := walk(raw, s, false)
	return issues
}

// walk walks one msgpack value against s and returns every issue and, with
// emit, the value as JSON (meaningful only without issues).
func walk(raw []byte, s *shape, emit bool) ([]Issue, []byte) {
	w := walks.Get().(*inputWalk)
	w.b, w.off, w.path, w.issues, w.stopped = raw, 0, w.path[:0], nil, false
	w.msgpack = decodesByMsgpack(s)
	w.emit, w.out = emit, nil
	if emit {
		w.out = make([]byte, 0, len(raw)+len(raw)/2+16)
	}
	w.value(s, 0, false)
	if !w.stopped && w.off != len(w.b) {
		w.fail("the input has bytes after its value")
	}
	issues, out := w.issues, w.out
	w.b, w.issues, w.out = nil, nil, nil
	walks.Put(w)
	// Object keys come in no particular order (JSON objects are maps): sorted
	// by path, the same input always reads the same.
	slices.SortStableFunc(issues[:min(len(issues), maxIssues)], func(a, b Issue) int { return strings.Compare(a.Path, b.Path) })
	return issues, out
}

// valueClass is what a msgpack value is, in JSON's words.
type valueClass uint8

const (
	classNil    = valueClass(msgpackhead.Nil)
	classBool   = valueClass(msgpackhead.Bool)
	classInt    = valueClass(msgpackhead.Int)
	classFloat  = valueClass(msgpackhead.Float)
	classString = valueClass(msgpackhead.String)
	classBinary = valueClass(msgpackhead.Binary)
	classArray  = valueClass(msgpackhead.Array)
	classMap    = valueClass(msgpackhead.Map)
	classExt    = valueClass(msgpackhead.Ext)
)

func (c valueClass) String() string {
	switch c {
	case classNil:
		return "null"
	case classBool:
		return "a boolean"
	case classInt:
		return "an integer"
	case classFloat:
		return "a number with a fraction or exponent"
	case classString:
		return "a string"
	case classBinary:
		return "binary data"
	case classArray:
		return "an array"
	case classMap:
		return "an object"
	}
	return "an extension value"
}

// head is one value's header. Integers carry their value; strings, binaries,
// arrays, maps and extensions their length, with the content still to read.
type head struct {
	class valueClass
	neg   bool   // integers: negative
	mag   uint64 // integers: absolute value
	f64   bool   // floats: 64-bit
	n     uint64 // length: bytes, items, pairs
	ext   int8   // extension type

	fval float64 // floats: the value
}

// pathElem is one step of the path to a value.
type pathElem struct {
	key   []byte // a field name or a map's string key (a slice of the input)
	index int    // an array index, or -1
	other bool   // a map key that is not a string
}

// inputWalk is the one descent through an input: it checks each value
// against its shape and, with emit, writes each value it accepts to out as
// the JSON encoding/json reads into the shape's Go type. What it writes is
// meaningful only for an input without issues.
type inputWalk struct {
	b       []byte
	off     int
	path    []pathElem // rendered only when an issue is found
	issues  []Issue
	stopped bool
	msgpack bool // the input type is decoded by the msgpack library (see decodesByMsgpack)
	emit    bool
	out     []byte
}

// walks keeps walkers and their path stacks: a check of a valid input
// allocates nothing.
var walks = sync.Pool{New: func() any { return &inputWalk{path: make([]pathElem, 0, 16)} }}

func (w *inputWalk) push(e pathElem) { w.path = append(w.path, e) }
func (w *inputWalk) pop()            { w.path = w.path[:len(w.path)-1] }

func (w *inputWalk) issue(msg string) {
	if w.stopped {
		return
	}
	if len(w.issues) == maxIssues {
		w.issues = append(w.issues, Issue{Message: fmt.Sprintf("more than %d issues; the rest are not listed", maxIssues)})
		w.stopped = true
		return
	}
	w.issues = append(w.issues, Issue{Path: w.renderPath(), Message: shorten(msg, maxIssueText)})
}

// fail records an issue that ends the walk: the bytes cannot be followed.
func (w *inputWalk) fail(msg string) {
	w.issue(msg)
	w.stopped = true
}

func (w *inputWalk) renderPath() string {
	var b strings.Builder
	for _, e := range w.path {
		key := e.key
		if len(key) > maxKeyText {
			key = []byte(shorten(string(key), maxKeyText))
		}
		switch {
		case e.index >= 0:
			b.WriteString("[" + strconv.Itoa(e.index) + "]")
		case e.other:
			b.WriteString("[?]")
		case plainKey(string(key)):
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.Write(key)
		default:
			b.WriteString("[" + strconv.Quote(string(key)) + "]")
		}
	}
	return shortenPath(b.String())
}

// shorten cuts s to at most max bytes, at a character's start, marking the
// cut with an ellipsis.
func shorten(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const more = "…"
	cut := max - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

// shortenPath keeps a long path's last part, where the issue is.
func shortenPath(p string) string {
	if len(p) <= maxPathText {
		return p
	}
	const more = "…"
	cut := len(p) - (maxPathText - len(more))
	for cut < len(p) && !utf8.RuneStart(p[cut]) {
		cut++
	}
	return more + p[cut:]
}

func plainKey(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '-'):
		default:
			return false
		}
	}
	return true
}

func (w *inputWalk) take(n uint64) ([]byte, bool) {
	if n > uint64(len(w.b)-w.off) {
		w.fail("the input is truncated or not msgpack")
		return nil, false
	}
	b := w.b[w.off : w.off+int(n)]
	w.off += int(n)
	return b, true
}

// head reads one value's header; for scalars, the whole value.
func (w *inputWalk) head() (h head, ok bool) {
	mh, next, err := msgpackhead.Read(w.b, w.off)
	switch {
	case errors.Is(err, msgpackhead.ErrNotMsgpack):
		w.fail("the input is not msgpack")
		return h, false
	case err != nil:
		w.fail("the input is truncated or not msgpack")
		return h, false
	}
	h = head{class: valueClass(mh.Class), neg: mh.Neg, mag: mh.Mag, f64: mh.F64, n: mh.N, ext: mh.Ext}
	switch {
	case mh.Class == msgpackhead.Bool && mh.True:
		h.mag = 1
	case mh.Class == msgpackhead.Float && mh.F64:
		h.fval = math.Float64frombits(binary.BigEndian.Uint64(w.b[next-8 : next]))
	case mh.Class == msgpackhead.Float:
		h.fval = float64(math.Float32frombits(binary.BigEndian.Uint32(w.b[next-4 : next])))
	}
	w.off = next
	return h, true
}

// rest skips what follows a header: content, items or pairs.
func (w *inputWalk) rest(h head, depth int) {
	switch h.class {
	case classString, classBinary, classExt:
		w.take(h.n)
	case classArray, classMap:
		n, ok := w.items(h, depth)
		if !ok {
			return
		}
		for range n {
			if w.stopped {
				return
			}
			w.skip(depth + 1)
		}
	}
}

func (w *inputWalk) skip(depth int) {
	if h, ok := w.head(); ok {
		w.rest(h, depth)
	}
}

// items is how many values follow a container's header (an array's items,
// a map's keys and values), if fits lets them.
func (w *inputWalk) items(h head, depth int) (uint64, bool) {
	n := h.n
	if h.class == classMap {
		n *= 2
	}
	return n, w.fits(n, depth)
}

// fits refuses a container that claims more items than bytes remain, or that
// nests too deeply, before anything loops over it.
func (w *inputWalk) fits(n uint64, depth int) bool {
	if depth >= maxInputDepth {
		w.fail(fmt.Sprintf("the input nests deeper than %d levels", maxInputDepth))
		return false
	}
	if n > uint64(len(w.b)-w.off) {
		w.fail("the input is truncated or not msgpack")
		return false
	}
	return true
}

// value checks the next value against s (written as a JSON string for a
// field with the "string" option when quoted), and writes it.
func (w *inputWalk) value(s *shape, depth int, quoted bool) {
	if w.stopped {
		return
	}
	start := w.off
	h, ok := w.head()
	if !ok {
		return
	}
	if h.class == classNil {
		w.put("null") // null leaves the zero value, as in encoding/json
		return
	}
	if quoted && h.class == classString && s.kind != shapeString {
		w.quotedString(s, h)
		return
	}
	if w.msgpack && w.msgpackReadsOtherwise(s, h, depth) {
		return
	}
	if quoted && (h.class == classBool || h.class == classInt || h.class == classFloat) {
		// A number or boolean as the msgpack library writes it, for a field
		// encoding/json reads from a string.
		w.put(`"`)
		defer w.put(`"`)
	}
	switch s.kind {
	case shapeAny:
		if s.msgpackOnly {
			w.rest(h, depth)
			return
		}
		w.jsonValue(h, depth)
	case shapeJSON:
		w.selfDecoding(s, h, start, depth)
	case shapeText:
		w.text(s, h, depth)
	case shapeDuration:
		w.duration(s, h, depth)
	case shapeBool:
		if w.want(h, h.class == classBool, "a boolean", depth) {
			w.putBool(h.mag == 1)
		}
	case shapeInt, shapeUint:
		if h.class == classFloat && wholeOutside(s, h.fval) {
			w.issue(rangeMessage(s))
			return
		}
		if w.want(h, h.class == classInt, "an integer", depth) {
			w.intRange(s, h)
			w.putInt(h)
		}
	case shapeFloat:
		if !w.want(h, h.class == classInt || h.class == classFloat, "a number", depth) {
			return
		}
		if h.class == classInt {
			w.putInt(h)
			return
		}
		w.floatRange(s, h)
		w.putFloat(h.fval, s.bits)
	case shapeString:
		if w.want(h, h.class == classString || h.class == classBinary, "a string", depth) {
			w.stringValue(h, quoted)
		}
	case shapeBytes:
		if h.class == classString {
			w.base64(h)
			return
		}
		if w.want(h, h.class == classBinary, "a base64 string", depth) {
			if b, ok := w.take(h.n); ok {
				w.putBase64(b)
			}
		}
	case shapeTime:
		w.timeValue(h, depth)
	case shapeSlice, shapeArray:
		if s.kind == shapeArray && h.class == classBinary && s.elem.kind == shapeUint && s.elem.bits == 8 {
			// The msgpack library writes a byte array as binary data.
			if h.n > uint64(s.n) {
				w.issue(fmt.Sprintf("expected at most %d items, got %d", s.n, h.n))
			}
			if b, ok := w.take(h.n); ok {
				w.putByteList(b)
			}
			return
		}
		if !w.want(h, h.class == classArray, "an array", depth) || !w.fits(h.n, depth) {
			return
		}
		if s.kind == shapeArray && h.n > uint64(s.n) {
			w.issue(fmt.Sprintf("expected at most %d items, got %d", s.n, h.n))
		}
		w.put("[")
		for i := range h.n {
			if i > 0 {
				w.put(",")
			}
			w.push(pathElem{index: int(i)})
			w.value(s.elem, depth+1, false)
			w.pop()
			if w.stopped {
				return
			}
		}
		w.put("]")
	case shapeMap:
		if !w.want(h, h.class == classMap, "an object", depth) || !w.fits(2*h.n, depth) {
			return
		}
		w.put("{")
		for i := range h.n {
			if i > 0 {
				w.put(",")
			}
			key, ok := w.mapKey(s.key, depth)
			if !ok {
				return
			}
			w.put(":")
			w.push(key)
			w.value(s.elem, depth+1, false)
			w.pop()
			if w.stopped {
				return
			}
		}
		w.put("}")
	case shapeStruct:
		if !w.want(h, h.class == classMap, "an object", depth) || !w.fits(2*h.n, depth) {
			return
		}
		w.put("{")
		var present fieldSet
		written := false
		for range h.n {
			kh, ok := w.head()
			if !ok {
				return
			}
			if kh.class != classString && kh.class != classBinary {
				w.issue("field names must be strings, got " + kh.class.String())
				w.rest(kh, depth+1)
				w.skip(depth + 1)
				continue
			}
			name, ok := w.take(kh.n)
			if !ok {
				return
			}
			w.push(pathElem{key: name, index: -1})
			if f := s.fields[string(name)]; f != nil {
				present.add(f.index)
				if written {
					w.put(",")
				}
				written = true
				w.putString(name)
				w.put(":")
				w.value(f.shape, depth+1, f.quoted)
			} else {
				w.issue("unknown field")
				w.skip(depth + 1)
			}
			w.pop()
			if w.stopped {
				return
			}
		}
		w.put("}")
		w.missing(s, &present)
	}
}

// mapKey checks a map key, writes it as a JSON string, and returns the path
// step it names.
func (w *inputWalk) mapKey(ks *shape, depth int) (pathElem, bool) {
	start := w.off
	kh, ok := w.head()
	if !ok {
		return pathElem{}, false
	}
	if kh.class == classString || kh.class == classBinary {
		k, ok := w.take(kh.n)
		if !ok {
			return pathElem{}, false
		}
		e := pathElem{key: k, index: -1}
		var msg string
		if ks.kind == shapeText {
			// Its text form, as encoding/json names the key.
			if err := unmarshalText(ks.typ, k, kh.class == classBinary, w.to()); err != nil {
				msg = "invalid " + ks.typ.String() + " key: " + err.Error()
			}
		} else {
			msg = stringKey(ks, k)
			w.putString(k)
		}
		if w.msgpack && kh.class == classString && ks.kind == shapeText && hasBinaryForm(ks) {
			msg = msgpackBinaryHint
		}
		if msg != "" {
			w.push(e)
			w.issue(msg)
			w.pop()
		}
		return e, true
	}
	// A key that is not a string: check it as a value of the key type, and
	// write it in a string, as encoding/json names an integer key.
	w.off = start
	e := pathElem{index: -1, other: true}
	w.push(e)
	w.put(`"`)
	w.value(ks, depth+1, false)
	w.put(`"`)
	w.pop()
	return e, !w.stopped
}

// want reports a mismatch and skips the value when ok is false. A matching
// value is left for the caller to read: a string's, binary's or extension's
// content, an array's items, a map's pairs.
func (w *inputWalk) want(h head, ok bool, what string, depth int) bool {
	if ok {
		return true
	}
	w.issue("expected " + what + ", got " + h.class.String())
	w.rest(h, depth)
	return false
}

// intRange refuses an integer the field cannot hold.
func (w *inputWalk) intRange(s *shape, h head) {
	if s.kind == shapeUint {
		if h.neg || s.bits < 64 && h.mag > 1<<s.bits-1 {
			w.issue(rangeMessage(s))
		}
		return
	}
	limit := uint64(1) << (s.bits - 1) // |min|; max is limit-1
	if h.neg && h.mag > limit || !h.neg && h.mag > limit-1 {
		w.issue(rangeMessage(s))
	}
}

// The msgpack library, which decodes an input type holding a msgpack-only
// type, reads some JSON forms the check accepts as something else: a string
// into []byte as its bytes, not base64; a string into a type with a binary
// form (netip.Addr) as that form; a string into json.RawMessage as JSON text;
// and a type with its own JSON decoder by its fields, not by that decoder. An
// input must not mean something else than what was checked: the first three
// are refused, the last is left to the library unchecked, as msgpack-only
// types are.
const msgpackBinaryHint = "expected binary data: this input type is decoded from msgpack, where text is not read as this type's text form"

// msgpackReadsOtherwise handles a value the msgpack library would read
// otherwise than the check, and reports whether it did.
func (w *inputWalk) msgpackReadsOtherwise(s *shape, h head, depth int) bool {
	switch {
	case h.class != classString && s.kind != shapeJSON:
		return false
	case s.kind == shapeBytes, s.kind == shapeText && hasBinaryForm(s), s.kind == shapeJSON && s.typ == rawMessageType && h.class == classString:
		w.issue(msgpackBinaryHint)
		w.take(h.n)
		return true
	case s.kind == shapeJSON && s.typ != rawMessageType:
		w.rest(h, depth)
		return true
	}
	return false
}

// hasBinaryForm tells a type that decodes itself from binary data too.
func hasBinaryForm(s *shape) bool {
	return s.typ != nil && reflect.PointerTo(s.typ).Implements(binaryUnmarshalType)
}
