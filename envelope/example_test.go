package envelope_test

import (
	"encoding/json"
	"fmt"

	"github.com/capstan-dev/capstan/envelope"
)

// A model sees a failure only through ForModel: an error that is not exposed
// becomes a generic internal error, so a private message never reaches it, and
// details travel only with INPUT_INVALID.
func ExampleEnvelope_ForModel() {
	env := envelope.Envelope{
		V:            envelope.Version,
		ExecutionID:  envelope.NewExecutionID(),
		CapabilityID: "orders.refund",
		Status:       envelope.StatusFailed,
		Error: &envelope.Error{
			Code:      envelope.CodeExecutionFailed,
			Message:   "dial tcp 10.0.0.7:5432: connection refused",
			Retryable: true,
			Stage:     envelope.StageHandler,
		},
	}
	show(env.ForModel())

	invalid := &envelope.CapabilityError{Code: envelope.CodeInputInvalid, Stage: envelope.StageInput,
		Message: "amount must be positive", ExposeToModel: true, Details: map[string]any{"field": "amount"}}
	env.Error = invalid.Wire()
	show(env.ForModel())

	env.Status, env.Error = envelope.StatusCompleted, nil
	fmt.Println(env.ForModel() == nil)
	// Output:
	// {"code":"INTERNAL_ERROR","message":"The operation failed.","retryable":false}
	// {"code":"INPUT_INVALID","message":"amount must be positive","retryable":false,"details":{"field":"amount"}}
	// true
}

func show(m *envelope.ModelError) {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))
}
