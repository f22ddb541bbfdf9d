package msgenc

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// code is a named string type, as envelope.Code is: the reflective encoder
// writes it through reflection.
type code string

// A map[string]any written in place (an audit event's data) must be the
// bytes the reflective encoder writes for it, keys sorted: the trail's
// messages are hashed as stored.
func TestFieldsMap_WritesTheReflectiveEncodersBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 1))
	str := func() string {
		n := []int{0, 1, 5, 31, 32, 255, 256, 65535, 65536}[rng.IntN(9)]
		if rng.IntN(20) > 0 {
			n = rng.IntN(40)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = "aAbz09._-é\x00"[rng.IntN(12)]
		}
		return string(b)
	}
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	var value func(depth int) any
	value = func(depth int) any {
		switch rng.IntN(14) {
		case 0:
			return nil
		case 1, 2:
			return str()
		case 3:
			return rng.IntN(2) == 1
		case 4:
			return int(ints[rng.IntN(len(ints))])
		case 5:
			return ints[rng.IntN(len(ints))]
		case 6:
			return rng.NormFloat64() * 1e6
		case 7:
			return int32(rng.Int32())
		case 8:
			return uint64(rng.Uint64())
		case 9:
			return []string{str(), str()}
		case 10:
			return time.Unix(rng.Int64N(1<<40), rng.Int64N(1e9)).UTC()
		case 11:
			return code(str())
		case 12:
			if depth < 3 {
				return randomMap(rng, str, value, depth+1)
			}
			return map[string]any{}
		}
		return struct {
			A string `json:"a,omitempty"`
			B int    `json:"b"`
		}{A: str(), B: rng.IntN(300)}
	}
	for i := range 3000 {
		m := randomMap(rng, str, value, 0)
		if i%50 == 0 {
			m = nil
		}
		f := Fields{b: []byte{}}
		f.value(m)
		if f.err != nil {
			t.Fatal(f.err)
		}
		want, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(f.b, want) {
			t.Fatalf("map %d (%d keys) %v:\n got % x\nwant % x", i, len(m), m, f.b, want)
		}
		// And as a record's field, as an event's data is written.
		var rec Fields
		rec.Value("data", m, len(m) == 0)
		var got bytes.Buffer
		if err := rec.Encode(msgpack.NewEncoder(&got)); err != nil {
			t.Fatal(err)
		}
		wantRec, err := Marshal(struct {
			Data map[string]any `json:"data,omitempty"`
		}{m})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), wantRec) {
			t.Fatalf("record of map %d:\n got % x\nwant % x", i, got.Bytes(), wantRec)
		}
	}
}

// randomMap is a map of up to 20 keys (some more than are sorted in place),
// with values of value.
func randomMap(rng *rand.Rand, str func() string, value func(int) any, depth int) map[string]any {
	m := map[string]any{}
	for range rng.IntN(21) {
		m[str()] = value(depth)
	}
	return m
}
