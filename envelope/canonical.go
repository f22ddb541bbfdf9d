package envelope

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/capstan-dev/capstan/internal/canonjson"
)

// canonicalBufs keep the buffers InputHash writes an input's canonical JSON
// into, once per execution, between executions.
var canonicalBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// inputHashOfJSON is the hex SHA-256 of r's canonical JSON, written into a
// pooled buffer; an error when r has no canonical JSON form.
func inputHashOfJSON(r Raw) (string, error) {
	v, err := r.Value()
	if err != nil {
		return "", err
	}
	buf := canonicalBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			canonicalBufs.Put(buf)
		}
	}()
	buf.Reset()
	if err := canonjson.Write(buf, v); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return hexString(sum[:]), nil
}

// InputHash is the hex SHA-256 of the raw value's canonical JSON. A value
// without a canonical JSON form (binary data, NaN, invalid UTF-8, keys that
// are not strings: a Go client's msgpack may hold them) hashes as its msgpack
// bytes behind a prefix no JSON text begins with: its hash is never a JSON
// value's, nor another value's, and the same bytes always hash alike. An
// execution's records and audit events name its input by this hash, so an
// input must never go without one. Only bytes that are not well-formed msgpack
// fail.
func InputHash(r Raw) (string, error) {
	h, err := inputHashOfJSON(r)
	if err == nil {
		return h, nil
	}
	// Not canonical, or not decodable as a plain value (an extension type
	// the msgpack library does not know): the bytes, if well formed.
	if werr := checkWellFormed(r); werr != nil {
		return "", fmt.Errorf("%w: %v", ErrDecode, werr)
	}
	sum := sha256.Sum256(append([]byte("msgpack:"), r...))
	return hexString(sum[:]), nil
}
