package envelope

import (
	"errors"
	"math"
	"testing"
	"time"
)

func mustRawFromJSON(t testing.TB, j string) Raw {
	t.Helper()
	r, err := RawFromJSON([]byte(j))
	if err != nil {
		t.Fatalf("RawFromJSON(%s): %v", j, err)
	}
	return r
}

func TestCanonicalJSON(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"keys sorted", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"nested keys sorted", `{"z":{"y":[3,{"b":true,"a":null}],"x":"s"},"a":[]}`, `{"a":[],"z":{"x":"s","y":[3,{"a":null,"b":true}]}}`},
		{"no whitespace", " {\n \"a\" : [ 1 , 2 ] ,\t\"b\" : { } }\n", `{"a":[1,2],"b":{}}`},
		{"keys sorted by UTF-8 bytes", `{"é":1,"z":2,"Z":3,"aa":4,"a":5}`, `{"Z":3,"a":5,"aa":4,"z":2,"é":1}`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"integer-valued float as integer", `2.0`, `2`},
		{"negative integer-valued float", `-7.00`, `-7`},
		{"negative zero", `-0.0`, `0`},
		{"exponent that is an integer", `1.5e3`, `1500`},
		{"large integer-valued float", `1e15`, `1000000000000000`},
		{"larger integer-valued float", `1e20`, `100000000000000000000`},
		{"fraction", `0.25`, `0.25`},
		{"int64 extremes", `[-9223372036854775808,9223372036854775807]`, `[-9223372036854775808,9223372036854775807]`},
		{"uint64 max", `18446744073709551615`, `18446744073709551615`},
		{"string escapes", `"a\"b\\c\n"`, `"a\"b\\c\n"`},
		{"null", `null`, `null`},
		{"booleans", `[true,false]`, `[true,false]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalJSON(mustRawFromJSON(t, tt.in))
			if err != nil {
				t.Fatalf("CanonicalJSON: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("CanonicalJSON(%s) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestInputHash_SameValueSameHash(t *testing.T) {
	type refund struct {
		B int `json:"b"`
		A int `json:"a"`
	}
	want := mustHash(t, mustRawFromJSON(t, `{"a":2,"b":1}`))
	for name, r := range map[string]Raw{
		"keys in the other order": mustRawFromJSON(t, `{"b":1,"a":2}`),
		"with whitespace":         mustRawFromJSON(t, ` { "b" : 1 , "a" : 2 } `),
		"floats that are whole":   mustRawFromJSON(t, `{"b":1.0,"a":2e0}`),
		"from a Go map":           MustRaw(map[string]any{"a": 2, "b": 1}),
		"from a Go struct":        MustRaw(refund{B: 1, A: 2}),
		"from other int types":    MustRaw(map[string]any{"a": uint8(2), "b": int64(1)}),
	} {
		if got := mustHash(t, r); got != want {
			t.Errorf("%s: hash %s, want %s", name, got, want)
		}
	}
}

// An integer and a float of the same whole value hash the same at any size, so
// the hash does not depend on how a producer happened to spell the number.
func TestInputHash_IntegerAndWholeFloatAgree(t *testing.T) {
	for _, n := range []int64{0, 1, -1, 1 << 40, 1e15, -1e15, 1e18, 1 << 53} {
		if hi, hf := mustHash(t, MustRaw(n)), mustHash(t, MustRaw(float64(n))); hi != hf {
			t.Errorf("%d: integer hash %s, float hash %s", n, hi, hf)
		}
	}
}

func TestInputHash_DifferentValueDifferentHash(t *testing.T) {
	pairs := [][2]string{
		{`{"a":1}`, `{"a":2}`},
		{`{"a":1}`, `{"a":"1"}`},
		{`{"a":1}`, `{"b":1}`},
		{`{"a":null}`, `{}`},
		{`[1,2]`, `[2,1]`},
		{`[1,[2]]`, `[[1],2]`},
		{`1`, `true`},
		{`0.1`, `0.10000000000000002`},
		{`""`, `null`},
		{`{"a":{"b":1}}`, `{"a.b":1}`},
	}
	for _, p := range pairs {
		if mustHash(t, mustRawFromJSON(t, p[0])) == mustHash(t, mustRawFromJSON(t, p[1])) {
			t.Errorf("%s and %s hash the same", p[0], p[1])
		}
	}
}

func TestInputHash_IsHexSHA256(t *testing.T) {
	// sha256 of the 2 bytes "{}".
	if got, want := mustHash(t, mustRawFromJSON(t, `{}`)), "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"; got != want {
		t.Errorf("InputHash({}) = %s, want %s", got, want)
	}
}

func TestCanonicalJSON_RefusesValuesWithoutJSONForm(t *testing.T) {
	tests := map[string]any{
		"NaN":               math.NaN(),
		"+Inf":              math.Inf(1),
		"-Inf nested":       map[string]any{"x": []any{math.Inf(-1)}},
		"float32 NaN":       float32(math.NaN()),
		"byte string":       []byte("raw"),
		"invalid UTF-8":     "\xff\xfe",
		"invalid UTF-8 key": map[string]any{"\xff": 1},
		"integer map key":   map[int]string{1: "one"},
	}
	for name, v := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := NewRaw(v)
			if err != nil {
				t.Fatalf("NewRaw: %v", err)
			}
			if c, err := CanonicalJSON(r); !errors.Is(err, ErrNotCanonical) {
				t.Errorf("CanonicalJSON = %s, %v; want ErrNotCanonical", c, err)
			}
		})
	}
}

func TestCanonicalJSON_TimeAsUTCString(t *testing.T) {
	at := time.Date(2026, 3, 1, 13, 0, 0, 5, time.FixedZone("CET", 3600))
	got, err := CanonicalJSON(MustRaw(map[string]any{"at": at}))
	if err != nil {
		t.Fatalf("CanonicalJSON: %v", err)
	}
	if want := `{"at":"2026-03-01T12:00:00.000000005Z"}`; string(got) != want {
		t.Errorf("CanonicalJSON = %s, want %s", got, want)
	}
}

func TestCanonicalJSON_BrokenRawIsErrDecode(t *testing.T) {
	if _, err := CanonicalJSON(Raw{0x92, 0x01}); !errors.Is(err, ErrDecode) {
		t.Errorf("err = %v, want ErrDecode", err)
	}
}

func mustHash(t testing.TB, r Raw) string {
	t.Helper()
	h, err := InputHash(r)
	if err != nil {
		t.Fatalf("InputHash: %v", err)
	}
	return h
}
