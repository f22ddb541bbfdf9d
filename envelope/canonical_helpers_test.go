package envelope

import "github.com/capstan-dev/capstan/internal/canonjson"

// ErrNotCanonical and CanonicalJSON name, for this package's tests, what
// InputHash hashes.
var ErrNotCanonical = canonjson.ErrNotCanonical

func CanonicalJSON(r Raw) ([]byte, error) {
	v, err := r.Value()
	if err != nil {
		return nil, err
	}
	return canonjson.Marshal(v)
}
