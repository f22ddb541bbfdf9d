package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/internal/canonjson"
)

// writeCanonical and InputHash write and hash what they did when strings were
// written by json.Marshal and integers by fmt: referenceCanonical is that
// writer, kept here to compare with.
func TestCanonicalJSON_SameBytesAsTheReferenceWriter(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(43, 3))
	str := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteRune([]rune{'a', 'b', 'Z', '"', '\\', '<', '&', '\n', 0x01, 'é', '😀', 0x2028}[rng.IntN(12)])
		}
		return b.String()
	}
	var value func(depth int) any
	value = func(depth int) any {
		switch rng.IntN(13) {
		case 0:
			return nil
		case 1:
			return rng.IntN(2) == 0
		case 2, 3:
			return str()
		case 4:
			return []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1 << 40}[rng.IntN(6)]
		case 5:
			return []uint64{0, 255, math.MaxUint64}[rng.IntN(3)]
		case 6:
			return int8(rng.Int32())
		case 7:
			return uint16(rng.Int32())
		case 8:
			return []float64{0, math.Copysign(0, -1), 2, 0.1, 1e21, 1e15, -3.5e-7, 123456789.125}[rng.IntN(8)]
		case 9:
			return time.Unix(rng.Int64N(1<<35), rng.Int64N(1e9))
		case 10:
			if depth > 3 {
				return "leaf"
			}
			l := make([]any, rng.IntN(4))
			for i := range l {
				l[i] = value(depth + 1)
			}
			return l
		}
		if depth > 3 {
			return map[string]any{}
		}
		m := map[string]any{}
		for range rng.IntN(12) { // some beyond the keys sorted on the stack
			m[str()] = value(depth + 1)
		}
		return m
	}
	for i := range 5000 {
		v := value(0)
		raw, err := NewRaw(v)
		if err != nil {
			t.Fatal(err)
		}
		g, err := raw.Value() // the generic values an input decodes to
		if err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		wantErr := referenceCanonical(&want, g)
		got, gotErr := CanonicalJSON(raw)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("value %d %#v: error %v, reference %v", i, g, gotErr, wantErr)
		}
		if gotErr != nil {
			continue
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("value %d %#v:\n got %s\nwant %s", i, g, got, want.Bytes())
		}
		sum := sha256.Sum256(want.Bytes())
		if h, err := InputHash(raw); err != nil || h != hex.EncodeToString(sum[:]) {
			t.Fatalf("value %d: hash %s (%v), want %x", i, h, err, sum)
		}
	}
}

// referenceCanonical is the canonical writer as it was: strings and keys by
// json.Marshal, integers by fmt.
func referenceCanonical(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case string:
		if !utf8.ValidString(t) {
			return ErrNotCanonical
		}
		b, _ := json.Marshal(t)
		buf.Write(b)
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		fmt.Fprintf(buf, "%d", t)
	case float32:
		return referenceFloat(buf, float64(t))
	case float64:
		return referenceFloat(buf, t)
	case time.Time:
		b, err := json.Marshal(t.UTC())
		if err != nil {
			return err
		}
		buf.Write(b)
	case []any:
		buf.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := referenceCanonical(buf, x); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			if !utf8.ValidString(k) {
				return ErrNotCanonical
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := referenceCanonical(buf, t[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			s, ok := k.(string)
			if !ok {
				return ErrNotCanonical
			}
			m[s] = x
		}
		return referenceCanonical(buf, m)
	default:
		return ErrNotCanonical
	}
	return nil
}

func referenceFloat(buf *bytes.Buffer, f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return ErrNotCanonical
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e21 {
		if f == 0 {
			f = 0
		}
		buf.WriteString(strconv.FormatFloat(f, 'f', 0, 64))
		return nil
	}
	buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	return nil
}

// An input of plain JSON types is written from its bytes directly, and
// writes what the decoded value writes; one the direct writer does not
// take (a time, a byte string, a repeated key, nesting past its depth) is
// decoded first, and hashes as it always did.
func TestCanonicalJSON_ReadInPlaceAsDecoded(t *testing.T) {
	t.Parallel()
	for _, j := range []string{`null`, `true`, `-0`, `0`, `-1`, `18446744073709551615`, `-9223372036854775808`, `1.5`,
		`"a\u2028<é>"`, `[]`, `{}`, `[1,[2,[3]],{"b":1,"a":[null,false]}]`, `{"z":1,"a":{"y":2,"b":3},"é":"x","":0}`} {
		raw := mustRawFromJSON(t, j)
		var direct bytes.Buffer
		if !writeCanonical(&direct, raw) {
			t.Fatalf("%s: the direct writer refused a plain value", j)
		}
		assertCanonicalAsDecoded(t, raw, direct.Bytes())
	}
	float32Raw := MustRaw(float32(0.1))
	var direct bytes.Buffer
	if !writeCanonical(&direct, float32Raw) {
		t.Fatal("the direct writer refused a float32")
	}
	assertCanonicalAsDecoded(t, float32Raw, direct.Bytes())
	nested := Raw(append(bytes.Repeat([]byte{0x91}, canonicalDepth+1), 0x01))
	twice := Raw([]byte{0x82, 0xa1, 'k', 0x01, 0xa1, 'k', 0x02})
	for _, raw := range []Raw{MustRaw(time.Unix(1, 2)), MustRaw([]byte("bin")), MustRaw(math.Inf(1)), nested, twice,
		MustRaw(map[int]any{1: "x"}), {0xa2, 0xff, 0xfe}, {0x92, 0x01}, {0x01, 0x01}} {
		direct.Reset()
		if writeCanonical(&direct, raw) {
			t.Fatalf("% x: the direct writer took what it leaves to the decoder", []byte(raw))
		}
	}
	if h1, h2 := mustHash(t, twice), mustHash(t, mustRawFromJSON(t, `{"k":2}`)); h1 != h2 {
		t.Fatalf("a repeated key hashes as its last value does not: %s, %s", h1, h2)
	}
}

// assertCanonicalAsDecoded fails unless direct is what raw's decoded value
// writes as canonical JSON.
func assertCanonicalAsDecoded(t testing.TB, raw Raw, direct []byte) {
	t.Helper()
	v, err := raw.Value()
	if err != nil {
		t.Fatalf("% x: the direct writer took what does not decode: %v", []byte(raw), err)
	}
	var want bytes.Buffer
	if err := canonjson.Write(&want, v); err != nil {
		t.Fatalf("% x: the direct writer took what has no canonical form: %v", []byte(raw), err)
	}
	if !bytes.Equal(direct, want.Bytes()) {
		t.Fatalf("% x:\n direct %s\ndecoded %s", []byte(raw), direct, want.Bytes())
	}
}

// FuzzCanonicalInPlace: whatever the direct writer takes, it writes as the
// decoded value writes; it never panics.
func FuzzCanonicalInPlace(f *testing.F) {
	for _, j := range []string{`{"message":"hello","n":[1,2.5,-3,null,true]}`, `[[[[{"a":"é"}]]]]`, `"\u0000<>&"`} {
		f.Add([]byte(mustRawFromJSON(f, j)))
	}
	f.Add([]byte{0x82, 0xa1, 'k', 0x01, 0xa1, 'k', 0x02})
	f.Add([]byte{0xca, 0x7f, 0xc0, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var direct bytes.Buffer
		if writeCanonical(&direct, b) {
			assertCanonicalAsDecoded(t, b, direct.Bytes())
		}
	})
}
