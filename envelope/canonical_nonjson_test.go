package envelope

import (
	"errors"
	"math"
	"testing"
	"time"
)

// An execution's input hash names the request a record was claimed for (a
// takeover refuses a different request under the same execution id) and
// stands for the input on the audit trail. A Go client's msgpack may hold
// what JSON has no form for (binary data, integer map keys, invalid UTF-8,
// NaN inside a type that decodes itself): such an input still has a hash,
// never the hash of another input, and the same bytes always hash alike.
func TestInputHash_ValuesWithoutJSONFormStillHashDistinctly(t *testing.T) {
	values := map[string]any{
		"byte string":         map[string]any{"data": []byte("raw")},
		"other byte string":   map[string]any{"data": []byte("rax")},
		"text of the bytes":   map[string]any{"data": "raw"},
		"base64 of the bytes": map[string]any{"data": "cmF3"},
		"integer map key":     map[int]string{1: "one"},
		"string map key":      map[string]string{"1": "one"},
		"invalid UTF-8":       "a\xff",
		"other invalid UTF-8": "a\xfe",
		"replacement":         "a\ufffd",
		"NaN":                 math.NaN(),
		"+Inf":                math.Inf(1),
		"year 10000":          map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year 20000":          map[string]any{"at": time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"empty at":            map[string]any{"at": nil},
	}
	seen := map[string]string{}
	for name, v := range values {
		r, err := NewRaw(v)
		if err != nil {
			t.Fatalf("%s: NewRaw: %v", name, err)
		}
		h, err := InputHash(r)
		if err != nil || h == "" {
			t.Errorf("%s: InputHash = %q, %v; want a hash", name, h, err)
			continue
		}
		if again, _ := InputHash(append(Raw(nil), r...)); again != h {
			t.Errorf("%s: the same bytes hash to %s and %s", name, h, again)
		}
		if other, dup := seen[h]; dup {
			t.Errorf("%s and %s have the same input hash %s", name, other, h)
		}
		seen[h] = name
	}
}

// A time JSON cannot write (a year beyond 9999) has no canonical JSON form;
// it is never written as nothing, which made `{"at":}` of every such time.
func TestCanonicalJSON_TimeWithoutRFC3339FormRefused(t *testing.T) {
	r := MustRaw(map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if c, err := CanonicalJSON(r); !errors.Is(err, ErrNotCanonical) {
		t.Errorf("CanonicalJSON = %s, %v; want ErrNotCanonical", c, err)
	}
}
