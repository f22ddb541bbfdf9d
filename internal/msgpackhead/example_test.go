package msgpackhead_test

import (
	"fmt"

	"github.com/capstan-dev/capstan/internal/msgpackhead"
)

// Walk a map of one string key and an array, header by header: a string's
// content is skipped by its length, a container's items follow its header.
func ExampleRead() {
	b := []byte{0x81, 0xa1, 'k', 0x92, 0x01, 0xd0, 0x9c} // {"k": [1, -100]}
	for off := 0; off < len(b); {
		h, next, err := msgpackhead.Read(b, off)
		if err != nil {
			fmt.Println(err)
			return
		}
		switch h.Class {
		case msgpackhead.Map:
			fmt.Println("map of", h.N, "pairs")
		case msgpackhead.String:
			fmt.Printf("string %q\n", b[next:next+int(h.N)])
			next += int(h.N)
		case msgpackhead.Array:
			fmt.Println("array of", h.N, "items")
		case msgpackhead.Int:
			sign := ""
			if h.Neg {
				sign = "-"
			}
			fmt.Printf("integer %s%d\n", sign, h.Mag)
		}
		off = next
	}
	// Output:
	// map of 1 pairs
	// string "k"
	// array of 2 items
	// integer 1
	// integer -100
}
