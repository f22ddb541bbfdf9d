package canonjson

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// appendJSONString must write what json.Marshal writes for a string, and
// the same of the string's bytes: an input's canonical JSON, and so its
// hash, is made of those bytes.
func TestAppendJSONString_WritesWhatJSONMarshalWrites(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(43, 2))
	special := []string{"", "plain", `"quoted"`, `back\slash`, "<script>&</script>", "\x00\x01\x1f\x7f",
		"\b\f\n\r\t", "é€😀", "\u2028\u2029", "a\u2028b", "\xff\xfe", "ok\xc3", strings.Repeat("x", 300)}
	alphabet := []rune{'a', 'Z', '0', ' ', '"', '\\', '<', '>', '&', '\n', '\t', 0, 0x1f, 0x7f, 'é', '€', '😀', 0x2028, 0x2029, 0xfffd}
	for i := range 20000 {
		var s string
		if i < len(special) {
			s = special[i]
		} else {
			var b strings.Builder
			for range rng.IntN(24) {
				if rng.IntN(30) == 0 {
					b.WriteByte(byte(0x80 + rng.IntN(0x80))) // a stray byte: invalid UTF-8
					continue
				}
				b.WriteRune(alphabet[rng.IntN(len(alphabet))])
			}
			s = b.String()
		}
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q:\n got %s\nwant %s", s, got, want)
		}
		if got := AppendString(nil, []byte(s)); !bytes.Equal(got, want) {
			t.Fatalf("%q as bytes:\n got %s\nwant %s", s, got, want)
		}
	}
}
