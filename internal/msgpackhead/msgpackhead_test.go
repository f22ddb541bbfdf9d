package msgpackhead

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

func encode(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.UseCompactFloats(true)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestRead_EveryFormat reads the header of a value of every msgpack format
// the library writes: its class, an integer's sign and magnitude, a length,
// and where what follows the header begins.
func TestRead_EveryFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want Head
		// content is how many bytes of the value follow its header: a
		// string's, a binary's or an extension's, an array's or a map's items.
		content int
	}{
		{"positive fixint", 7, Head{Class: Int, Mag: 7}, 0},
		{"negative fixint", -3, Head{Class: Int, Neg: true, Mag: 3}, 0},
		{"uint8", 200, Head{Class: Int, Mag: 200}, 0},
		{"uint16", 60000, Head{Class: Int, Mag: 60000}, 0},
		{"uint32", uint32(4e9), Head{Class: Int, Mag: 4e9}, 0},
		{"uint64", uint64(math.MaxUint64), Head{Class: Int, Mag: math.MaxUint64}, 0},
		{"int8", -100, Head{Class: Int, Neg: true, Mag: 100}, 0},
		{"int16", -30000, Head{Class: Int, Neg: true, Mag: 30000}, 0},
		{"int32", -2e9, Head{Class: Int, Neg: true, Mag: 2e9}, 0},
		{"int64 min", int64(math.MinInt64), Head{Class: Int, Neg: true, Mag: 1 << 63}, 0},
		{"nil", nil, Head{Class: Nil}, 0},
		{"false", false, Head{Class: Bool}, 0},
		{"true", true, Head{Class: Bool, True: true}, 0},
		{"float32", float32(1.5), Head{Class: Float}, 0},
		{"float64", 1.1, Head{Class: Float, F64: true}, 0},
		{"fixstr", "abc", Head{Class: String, N: 3}, 3},
		{"str8", strings.Repeat("a", 40), Head{Class: String, N: 40}, 40},
		{"str16", strings.Repeat("a", 300), Head{Class: String, N: 300}, 300},
		{"str32", strings.Repeat("a", 70000), Head{Class: String, N: 70000}, 70000},
		{"bin8", []byte{1, 2}, Head{Class: Binary, N: 2}, 2},
		{"bin16", make([]byte, 300), Head{Class: Binary, N: 300}, 300},
		{"fixarray", []int{1, 2}, Head{Class: Array, N: 2}, 2},
		{"array16", make([]int, 20), Head{Class: Array, N: 20}, 20}, // twenty 0x00
		{"fixmap", map[string]int{"a": 1}, Head{Class: Map, N: 1}, 3},
		{"timestamp 32", time.Unix(1, 0), Head{Class: Ext, N: 4, Ext: -1}, 4},
		{"timestamp 64", time.Unix(1, 5), Head{Class: Ext, N: 8, Ext: -1}, 8},
		{"timestamp 96", time.Unix(1<<40, 5), Head{Class: Ext, N: 12, Ext: -1}, 12},
	} {
		b := encode(t, tc.v)
		h, next, err := Read(b, 0)
		if err != nil || h != tc.want || next != len(b)-tc.content {
			t.Errorf("%s (% x): %+v, next %d, err %v; want %+v, next %d", tc.name, b[:min(len(b), 12)], h, next, err,
				tc.want, len(b)-tc.content)
		}
		// Every header cut short is truncated, never read past its end.
		for n := 0; n < len(b)-tc.content; n++ {
			if _, _, err := Read(b[:n], 0); !errors.Is(err, ErrTruncated) {
				t.Errorf("%s cut to %d bytes: %v", tc.name, n, err)
			}
		}
	}
	if _, _, err := Read([]byte{0xc1}, 0); !errors.Is(err, ErrNotMsgpack) {
		t.Errorf("0xc1: %v", err)
	}
	if h, next, err := Read([]byte{0x01, 0x92}, 1); err != nil || h.Class != Array || h.N != 2 || next != 2 {
		t.Errorf("at an offset: %+v %d %v", h, next, err)
	}
}

func TestRead_AllocatesNothing(t *testing.T) {
	b := encode(t, map[string]any{"a": []any{1, "x", 2.5}})
	if n := testing.AllocsPerRun(100, func() {
		for off := 0; off < len(b); {
			h, next, err := Read(b, off)
			if err != nil {
				t.Fatal(err)
			}
			off = next
			if h.Class == String {
				off += int(h.N)
			}
		}
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xc7, 0x01, 0xff, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, next, err := Read(b, 0) // never panics
		if err == nil && (next > len(b) || next < 1 || h.Class > Ext) {
			t.Fatalf("% x: %+v next %d", b, h, next)
		}
	})
}
