package inputcheck

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

type checkLine struct {
	SKU string `json:"sku"`
	Qty int32  `json:"qty"`
}

type checkOrder struct {
	OrderID string            `json:"orderId"`
	Amount  int64             `json:"amount"`
	Lines   []checkLine       `json:"lines,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Ship    *checkAddress     `json:"ship,omitempty"`
	Small   uint8             `json:"small,omitempty"`
	Ratio   float64           `json:"ratio,omitempty"`
	Extra   any               `json:"extra,omitempty"`
	At      time.Time         `json:"at,omitzero"`
	Pair    [2]int            `json:"pair,omitzero"`
	checkEmbedded
	//lint:ignore U1000 unexported fields are not part of the input
	hidden int
}

type checkEmbedded struct {
	Note string `json:"note,omitempty"`
}

type checkAddress struct {
	City string `json:"city"`
}

func issuesOf(t *testing.T, in any, into reflect.Type) []Issue {
	t.Helper()
	raw, err := envelope.NewRaw(in)
	if err != nil {
		t.Fatal(err)
	}
	return checkInput(raw, shapeOf(into))
}

var orderType = reflect.TypeFor[checkOrder]()

func TestInputCheck_ReportsEveryIssueWithItsPath(t *testing.T) {
	got := issuesOf(t, map[string]any{
		"orderId": 1,
		"amount":  "x",
		"lines":   []any{map[string]any{"sku": "a", "qty": 1}, map[string]any{"sku": true, "qty": 1.5, "colour": "red"}},
		"labels":  map[string]any{"ok": "yes", "bad key": 3},
		"ship":    map[string]any{"city": []any{}},
		"small":   300,
		"bogus":   1,
	}, orderType)
	want := map[string]string{
		"orderId":           "expected a string, got an integer",
		"amount":            "expected an integer, got a string",
		"lines[1].sku":      "expected a string, got a boolean",
		"lines[1].qty":      "expected an integer, got a number with a fraction or exponent",
		"lines[1].colour":   "unknown field",
		`labels["bad key"]`: "expected a string, got an integer",
		"ship.city":         "expected a string, got an array",
		"small":             "expected an integer from 0 to 255",
		"bogus":             "unknown field",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d issues, want %d: %+v", len(got), len(want), got)
	}
	for _, is := range got {
		if want[is.Path] != is.Message {
			t.Errorf("issue at %q: %q, want %q", is.Path, is.Message, want[is.Path])
		}
	}
}

func TestInputCheck_IntegersRefuseFractionsAndOutOfRange(t *testing.T) {
	type ints struct {
		I8  int8    `json:"i8,omitempty"`
		U8  uint8   `json:"u8,omitempty"`
		I64 int64   `json:"i64,omitempty"`
		U64 uint64  `json:"u64,omitempty"`
		I   int     `json:"i,omitempty"`
		F32 float32 `json:"f32,omitempty"`
	}
	typ := reflect.TypeFor[ints]()
	for _, c := range []struct {
		name  string
		in    map[string]any
		issue string // empty: accepted
	}{
		{"int8 max", map[string]any{"i8": 127}, ""},
		{"int8 min", map[string]any{"i8": -128}, ""},
		{"int8 over", map[string]any{"i8": 128}, "expected an integer from -128 to 127"},
		{"int8 under", map[string]any{"i8": -129}, "expected an integer from -128 to 127"},
		{"uint8 negative", map[string]any{"u8": -1}, "expected an integer from 0 to 255"},
		{"uint8 over", map[string]any{"u8": 256}, "expected an integer from 0 to 255"},
		{"int64 from uint64 2^63", map[string]any{"i64": uint64(1) << 63}, "expected an integer from -9223372036854775808 to 9223372036854775807"},
		{"int64 min", map[string]any{"i64": int64(-1) << 63}, ""},
		{"uint64 max", map[string]any{"u64": ^uint64(0)}, ""},
		{"uint64 negative", map[string]any{"u64": -5}, "expected an integer from 0 to 18446744073709551615"},
		{"int fraction", map[string]any{"i": 1.5}, "expected an integer, got a number with a fraction or exponent"},
		{"int whole float", map[string]any{"i": 2.0}, "expected an integer, got a number with a fraction or exponent"},
		{"int string", map[string]any{"i": "2"}, "expected an integer, got a string"},
		{"float32 from int", map[string]any{"f32": 2}, ""},
		{"float32 from float64", map[string]any{"f32": 2.5}, ""},
		{"float32 beyond its range", map[string]any{"f32": 1e39}, "expected a number from -3.4028234663852886e+38 to 3.4028234663852886e+38"},
		{"int64 beyond 64 bits", map[string]any{"i64": 1e19}, "expected an integer from -9223372036854775808 to 9223372036854775807"},
		{"null is the zero value", map[string]any{"i": nil}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := issuesOf(t, c.in, typ)
			switch {
			case c.issue == "" && len(got) > 0:
				t.Fatalf("refused: %+v", got)
			case c.issue != "" && (len(got) != 1 || got[0].Message != c.issue):
				t.Fatalf("issues %+v, want one %q", got, c.issue)
			}
			// What the check accepts, the decoder decodes.
			if len(got) == 0 {
				raw, _ := envelope.NewRaw(c.in)
				if err := decodeChecked(raw, shapeOf(typ), new(ints)); err != nil {
					t.Fatalf("accepted, but the decoder refuses: %v", err)
				}
			}
		})
	}
}

func TestInputCheck_ShapesTheDecoderWouldBendAreRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		in   any
		path string
		msg  string
	}{
		// The msgpack library reads an array into a struct by position.
		{"array for an object", []any{"o1", 5}, "", "expected an object, got an array"},
		{"object for an array", map[string]any{"orderId": "o1", "amount": 5, "lines": map[string]any{}}, "lines", "expected an array, got an object"},
		{"too many items", map[string]any{"orderId": "o1", "amount": 5, "pair": []any{1, 2, 3}}, "pair", "expected at most 2 items, got 3"},
		{"a timestamp not in RFC 3339", map[string]any{"orderId": "o1", "amount": 5, "at": "2024-01-01 00:00"}, "at", "expected " + timeHint},
		// Embedded structs are inlined: their name is not a field.
		{"embedded by name", map[string]any{"orderId": "o1", "amount": 5, "checkEmbedded": map[string]any{}}, "checkEmbedded", "unknown field"},
		// What the schema lists as required, the check requires.
		{"a required field missing", map[string]any{"orderId": "o1"}, "amount", "missing required field"},
		{"scalar input", "hello", "", "expected an object, got a string"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := issuesOf(t, c.in, orderType)
			if len(got) != 1 || got[0].Path != c.path || got[0].Message != c.msg {
				t.Fatalf("issues %+v, want %q at %q", got, c.msg, c.path)
			}
		})
	}
	if got := issuesOf(t, map[string]any{"orderId": "o1", "amount": 0, "note": "inlined", "extra": map[string]any{"any": []any{1, "x"}},
		"at": time.Unix(5, 0), "ship": nil}, orderType); len(got) > 0 {
		t.Fatalf("refused a valid input: %+v", got)
	}
}

func TestInputCheck_BoundsIssuesAndMalformedBytes(t *testing.T) {
	many := map[string]any{}
	for i := range 200 {
		many["f"+strings.Repeat("x", i)] = i
	}
	got := issuesOf(t, many, orderType)
	if len(got) != maxIssues+1 || !strings.Contains(got[maxIssues].Message, "more than") {
		t.Fatalf("%d issues, want %d and a last one saying more were left out", len(got), maxIssues+1)
	}
	for _, b := range [][]byte{{0xc1}, {0x81, 0xa1}, {0xdd, 0xff, 0xff, 0xff, 0xff}, {0x91}} {
		if got := checkInput(b, shapeOf(orderType)); len(got) == 0 {
			t.Errorf("% x: no issue", b)
		}
	}
}

// The check runs on every input; on a valid one it must cost no allocation.
func TestInputCheck_ValidInputAllocatesNothing(t *testing.T) {
	raw := envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 5, "lines": []any{map[string]any{"sku": "a", "qty": 1}},
		"labels": map[string]any{"a": "b"}, "ship": map[string]any{"city": "Oslo"}})
	s := shapeOf(orderType)
	if n := testing.AllocsPerRun(100, func() { _ = checkInput(raw, s) }); n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}

func FuzzInputCheck(f *testing.F) {
	for _, v := range []any{
		map[string]any{"orderId": "o", "amount": 3, "lines": []any{map[string]any{"qty": 2}}},
		map[string]any{"small": 300, "pair": []any{1}},
		[]any{1, "x"},
		map[string]any{"labels": map[string]any{"k": "v"}, "at": time.Unix(9, 9)},
	} {
		f.Add([]byte(envelope.MustRaw(v)))
	}
	s := shapeOf(orderType)
	f.Fuzz(func(t *testing.T, b []byte) {
		issues := checkInput(b, s) // never panics
		if len(issues) > 0 {
			return
		}
		// What the check accepts, the decoder decodes.
		if err := decodeChecked(b, s, new(checkOrder)); err != nil {
			t.Fatalf("accepted % x, decoder: %v", b, err)
		}
	})
}

func BenchmarkDecodeInput(b *testing.B) {
	raw := envelope.MustRaw(map[string]any{"orderId": "o1", "amount": 5, "lines": []any{map[string]any{"sku": "a", "qty": 1}}})
	s := shapeOf(orderType)
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = checkInput(raw, s)
		}
	})
	b.Run("check+decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeInput[checkOrder](raw, s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := envelope.UnmarshalStrict(raw, new(checkOrder)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
