package inputcheck

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

type sizeItem struct {
	A int `json:"a"`
	B int `json:"b"`
	C int `json:"c"`
	D int `json:"d"`
}

type sizeInput struct {
	Items map[string][]sizeItem `json:"items"`
	Addrs []netip.Addr          `json:"addrs,omitempty"`
}

// issuesSize is what an INPUT_INVALID envelope carries of the issues, and
// what the record's cause keeps of the error.
func issuesSize(issues []Issue) int {
	n := len((&InputError{Issues: issues}).Error())
	for _, is := range issues {
		n += len(is.Path) + len(is.Message)
	}
	return n
}

// An input's issues go into its INPUT_INVALID envelope (details) and its
// record (cause): however the input is crafted, their size stays a small
// bound, not a multiple of the input's, or the envelope outgrows what the
// server accepts and the request never ends.
func TestInputCheck_IssuesStayBoundedWhateverTheInput(t *testing.T) {
	const limit = 64 << 10
	long := strings.Repeat("k", 200<<10)
	cases := map[string]any{
		// one long key, repeated in the path of every issue below it
		"long key above many issues": map[string]any{"items": map[string]any{long: emptyObjects(20)}},
		// a long value echoed by the type's own error
		"long text echoed": map[string]any{"items": map[string]any{}, "addrs": []any{long}},
		// a long unknown field name
		"long unknown field": map[string]any{"items": map[string]any{}, long: 1},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			issues := issuesOf(t, in, reflect.TypeFor[sizeInput]())
			if len(issues) == 0 {
				t.Fatal("no issue reported")
			}
			if n := issuesSize(issues); n > limit {
				t.Fatalf("%d issues take %d bytes, more than %d", len(issues), n, limit)
			}
		})
	}
}

func emptyObjects(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{}
	}
	return out
}
