// Package inputcheck is stage 5's strict input check and the JSON Schema
// derived from the same compiled shape of a Go input type.
//
// A shape is compiled once per input type (ShapeOf). Decode walks an input's
// msgpack bytes against it, collecting every issue with its path, and decodes
// only an input without issues; JSONSchema describes the same shape to a
// model, so that what a model is shown and what an input must meet cannot
// drift apart.
//
// An input means what encoding/json makes of it: agents and the CLI send JSON
// (which reaches the worker as msgpack holding only what JSON holds), Go
// clients msgpack of their own types, and the check accepts both forms. The
// one walk that checks an input also rewrites it as JSON along its shape
// (inputWalk: one descent, checking alone or checking and writing), and an
// input without issues is decoded from that JSON by encoding/json
// (inputjson.go), so that times, durations, every number width, base64 bytes
// and types with their own JSON or text decoder arrive as the handler
// declares them; schemajson.go describes those forms.
package inputcheck

import (
	"reflect"

	"github.com/capstan-dev/capstan/envelope"
)

// Shape is a Go input type compiled for checking and describing.
type Shape = shape

// ShapeOf compiles (once per type) the shape of t.
func ShapeOf(t reflect.Type) *Shape { return shapeOf(t) }

// Decode checks raw against s and decodes it into a new In: an *InputError
// lists every issue of an input that does not fit.
func Decode[In any](raw envelope.Raw, s *Shape) (*In, error) { return decodeInput[In](raw, s) }

// JSONSchema is the JSON Schema of a shape's inputs.
func JSONSchema(s *Shape) map[string]any { return jsonSchema(s) }

// NewInputError lists issues found outside the check itself (a Validate
// method's); cause is kept for the logs and for errors.Is and errors.As.
func NewInputError(issues []Issue, cause error) *InputError {
	return &InputError{Issues: issues, Cause: cause}
}
