package inputcheck

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// Fields of embedded structs that share a name, arranged in each way
// encoding/json settles: the shallower field wins, then the one a tag
// names, and two left at par cancel each other (the name is no field).
type (
	embDeep    struct{ X []byte }
	embMiddle  struct{ embDeep }
	embShallow struct{ X string }
	embByDepth struct {
		embMiddle
		embShallow
	}

	embUntagged struct{ X []byte }
	embTagged   struct {
		Y string `json:"X"`
	}
	embByTag struct {
		embUntagged
		embTagged
	}

	embInner struct{ W int }
	embTwin  struct {
		X int
		embInner
	}
	embViaA    struct{ embTwin }
	embViaB    struct{ embTwin }
	embTwinned struct {
		embViaA
		embViaB
	}

	embLeft  struct{ X int }
	embRight struct{ X int }
	embAtPar struct {
		embLeft
		embRight
		Z int `json:"z,omitempty"`
	}
)

// The input check and the schema read a struct's fields as encoding/json
// does: the field an input names is the one checked, and decoded into, and
// a name encoding/json drops is an unknown field, not one accepted and lost.
func TestInputCheck_EmbeddedFieldsChosenAsEncodingJSONChooses(t *testing.T) {
	cases := []struct {
		name  string
		typ   reflect.Type
		input string
		into  func() any
	}{
		{"the shallower field wins", reflect.TypeFor[embByDepth](), `{"X":"not base64!"}`, func() any { return new(embByDepth) }},
		{"the tagged field wins", reflect.TypeFor[embByTag](), `{"X":"not base64!"}`, func() any { return new(embByTag) }},
		{"below a type embedded twice", reflect.TypeFor[embTwinned](), `{"W":7}`, func() any { return new(embTwinned) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.into()
			if err := json.Unmarshal([]byte(c.input), want); err != nil {
				t.Fatalf("encoding/json refuses %s: %v", c.input, err)
			}
			raw, err := envelope.RawFromJSON([]byte(c.input))
			if err != nil {
				t.Fatal(err)
			}
			if issues := checkInput(raw, shapeOf(c.typ)); len(issues) > 0 {
				t.Fatalf("the check refuses what encoding/json reads: %v", issues)
			}
			got := reflect.New(c.typ).Interface()
			if err := decodeChecked(raw, shapeOf(c.typ), got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decoded %+v, encoding/json reads %+v", got, want)
			}
		})
	}
	for typ, in := range map[reflect.Type]map[string]any{
		reflect.TypeFor[embAtPar]():   {"X": 5},
		reflect.TypeFor[embTwinned](): {"X": 5, "W": 1},
	} {
		t.Run("fields at par cancel in "+typ.Name(), func(t *testing.T) {
			raw := envelope.MustRaw(in)
			issues := checkInput(raw, shapeOf(typ))
			if len(issues) != 1 || issues[0].Path != "X" || issues[0].Message != "unknown field" {
				t.Errorf("issues %v, want X: unknown field", issues)
			}
			props := jsonSchema(shapeOf(typ))["properties"].(map[string]any)
			if _, ok := props["X"]; ok {
				t.Errorf("the schema lists X, which encoding/json never fills")
			}
		})
	}
}
