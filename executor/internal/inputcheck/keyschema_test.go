package inputcheck

import (
	"reflect"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// The schema of a map's integer keys accepts what the check (and
// encoding/json) accepts, and nothing more: "+5" names a key of a map of
// int, not of a map of uint.
func TestInputSchema_IntegerKeysAsTheCheckReadsThem(t *testing.T) {
	for _, c := range []struct {
		typ reflect.Type
		key string
	}{
		{reflect.TypeFor[map[uint8]int](), "+5"},
		{reflect.TypeFor[map[int8]int](), "+5"},
		{reflect.TypeFor[map[uint8]int](), "5"},
		{reflect.TypeFor[map[int8]int](), "-5"},
	} {
		j := `{"` + c.key + `":1}`
		raw, err := envelope.RawFromJSON([]byte(j))
		if err != nil {
			t.Fatal(err)
		}
		checked := len(checkInput(raw, shapeOf(c.typ))) == 0
		described := validates(t, compileSchema(t, c.typ), j) == nil
		if checked != described {
			t.Errorf("%v %s: the check accepts it: %v, the schema: %v", c.typ, j, checked, described)
		}
	}
}
