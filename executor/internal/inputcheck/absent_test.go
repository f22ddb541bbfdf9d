package inputcheck

import (
	"errors"
	"reflect"
	"testing"
)

type absentRefund struct {
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
	Note    string `json:"note,omitempty"`
}

type absentOptional struct {
	Note string `json:"note,omitempty"`
}

// A call without an input (or with null) is an empty object to a struct
// input: each required field the schema lists is reported missing, as it is
// for {}; an input type without required fields still takes no input.
func TestInputCheck_AbsentInputMissesEveryRequiredField(t *testing.T) {
	s := shapeOf(reflect.TypeFor[absentRefund]())
	for name, raw := range map[string][]byte{"absent": nil, "null": {0xc0}, "empty object": {0x80}} {
		_, err := decodeInput[absentRefund](raw, s)
		var ie *InputError
		if !errors.As(err, &ie) || len(ie.Issues) != 2 || ie.Issues[0].Path != "amount" || ie.Issues[1].Path != "orderId" {
			t.Errorf("%s: %v, want amount and orderId missing", name, err)
		}
	}
	for name, raw := range map[string][]byte{"absent": nil, "null": {0xc0}} {
		if _, err := decodeInput[absentOptional](raw, shapeOf(reflect.TypeFor[absentOptional]())); err != nil {
			t.Errorf("%s, no required field: %v", name, err)
		}
	}
}
