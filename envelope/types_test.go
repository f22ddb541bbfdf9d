package envelope

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestForModel(t *testing.T) {
	details := map[string]any{"field": "amount", "rule": "positive"}
	generic := &ModelError{Code: CodeInternalError, Message: "The operation failed.", Retryable: false}
	tests := []struct {
		name string
		err  Error
		want *ModelError
	}{
		{
			name: "exposed error gives its code, message and retryability",
			err:  Error{Code: CodeExecutionFailed, Message: "card declined", Retryable: true, ExposeToModel: true, Stage: StageHandler},
			want: &ModelError{Code: CodeExecutionFailed, Message: "card declined", Retryable: true},
		},
		{
			name: "exposed INPUT_INVALID carries its details",
			err:  Error{Code: CodeInputInvalid, Message: "amount must be positive", ExposeToModel: true, Details: details, Stage: StageInput},
			want: &ModelError{Code: CodeInputInvalid, Message: "amount must be positive", Details: details},
		},
		{
			name: "exposed error of another code drops its details",
			err:  Error{Code: CodePolicyDenied, Message: "over the limit", ExposeToModel: true, Details: details},
			want: &ModelError{Code: CodePolicyDenied, Message: "over the limit"},
		},
		{
			name: "unexposed error is a generic internal error",
			err:  Error{Code: CodeExecutionFailed, Message: "dial tcp 10.0.0.7:5432: connection refused", Retryable: true, Stage: StageHandler},
			want: generic,
		},
		{
			name: "unexposed INPUT_INVALID keeps its details private",
			err:  Error{Code: CodeInputInvalid, Message: "secret schema", Details: details},
			want: generic,
		},
		{
			name: "unexposed retryable error is not retryable for the model",
			err:  Error{Code: CodeTimeout, Message: "handler slow", Retryable: true},
			want: generic,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.ForModel(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Error.ForModel() = %+v, want %+v", got, tt.want)
			}
			env := &Envelope{V: Version, Status: StatusFailed, Error: &tt.err}
			if got := env.ForModel(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Envelope.ForModel() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestForModel_NilWithoutError(t *testing.T) {
	if got := (*Envelope)(nil).ForModel(); got != nil {
		t.Errorf("nil envelope: ForModel() = %+v, want nil", got)
	}
	if got := (&Envelope{Status: StatusCompleted}).ForModel(); got != nil {
		t.Errorf("completed envelope: ForModel() = %+v, want nil", got)
	}
}

// What a model sees in JSON has only the model-safe fields: never the stage,
// the exposure flag or details of anything but INPUT_INVALID.
func TestForModel_JSONHasOnlyModelFields(t *testing.T) {
	for _, e := range []Error{
		{Code: CodeInputInvalid, Message: "bad", ExposeToModel: true, Details: map[string]any{"f": 1}, Stage: StageInput},
		{Code: CodeExecutionFailed, Message: "boom", ExposeToModel: true, Details: map[string]any{"f": 1}, Stage: StageHandler},
		{Code: CodeExecutionFailed, Message: "secret", Details: map[string]any{"f": 1}, Stage: StageHandler},
	} {
		b, err := json.Marshal(e.ForModel())
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("json.Unmarshal: %v", err)
		}
		want := []string{"code", "message", "retryable"}
		if e.Code == CodeInputInvalid && e.ExposeToModel {
			want = append(want, "details")
		}
		if got := keysOf(m); !reflect.DeepEqual(got, sorted(want...)) {
			t.Errorf("%s exposed=%v: model JSON keys = %v, want %v", e.Code, e.ExposeToModel, got, sorted(want...))
		}
		if !e.ExposeToModel && strings.Contains(string(b), e.Message) {
			t.Errorf("unexposed message leaked to the model: %s", b)
		}
	}
}

func TestCapabilityError_WireDropsCause(t *testing.T) {
	cause := io.ErrUnexpectedEOF
	ce := &CapabilityError{Code: CodeExecutionFailed, Message: "upstream failed", Stage: StageHandler,
		Retryable: true, Details: map[string]any{"k": "v"}, Cause: cause}

	if !errors.Is(ce, cause) {
		t.Error("CapabilityError does not unwrap to its cause")
	}
	var target *CapabilityError
	if !errors.As(errors.Join(errors.New("context"), ce), &target) || target != ce {
		t.Error("errors.As does not find the CapabilityError")
	}
	if got := ce.Error(); got != "EXECUTION_FAILED: upstream failed: unexpected EOF" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&CapabilityError{Code: CodeTimeout, Message: "too slow"}).Error(); got != "TIMEOUT: too slow" {
		t.Errorf("Error() without cause = %q", got)
	}

	want := &Error{Code: CodeExecutionFailed, Message: "upstream failed", Retryable: true,
		Details: map[string]any{"k": "v"}, Stage: StageHandler}
	if got := ce.Wire(); !reflect.DeepEqual(got, want) {
		t.Errorf("Wire() = %+v, want %+v", got, want)
	}
	b, err := Marshal(ce.Wire())
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if strings.Contains(string(b), "unexpected EOF") {
		t.Error("the private cause reached the wire")
	}
}

func TestExposedError_ModelSeesItsMessage(t *testing.T) {
	ce := &CapabilityError{Code: CodeInputInvalid, Stage: StageInput, Message: "amount must be positive", ExposeToModel: true}
	if m := ce.Wire().ForModel(); m.Code != CodeInputInvalid || m.Message != "amount must be positive" {
		t.Errorf("model sees %+v", m)
	}
}

func TestActor_String(t *testing.T) {
	if got := (Actor{ID: "alice", Kind: ActorUser}).String(); got != "user:alice" {
		t.Errorf("String() = %q, want user:alice", got)
	}
}
