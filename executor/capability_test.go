package executor

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

type normalized struct {
	Email string `json:"email"`
}

func (n *normalized) Validate() error {
	if n.Email == "" {
		return &envelope.InputError{Issues: []envelope.Issue{{Path: "email", Message: "required"}}}
	}
	n.Email = strings.ToLower(n.Email)
	return nil
}

type panicky struct{}

func (panicky) Validate() error { panic("boom") }

type plainErr struct{}

func (plainErr) Validate() error { return errors.New("the dates are in the wrong order") }

func TestDecode_ValidateRunsAfterDecodingAndMayNormalize(t *testing.T) {
	t.Parallel()
	c := Define("n.x", Meta{}, func(_ context.Context, c Call[normalized]) (struct{}, error) { return struct{}{}, nil })
	in, err := c.binding().decode(envelope.MustRaw(map[string]any{"email": "A@B.C"}))
	if err != nil || in.(*normalized).Email != "a@b.c" {
		t.Fatalf("in %+v, err %v", in, err)
	}
	_, err = c.binding().decode(envelope.MustRaw(map[string]any{}))
	var ie *envelope.InputError
	if !errors.As(err, &ie) || ie.Issues[0].Path != "email" {
		t.Fatalf("err %v", err)
	}

	p := Define("p.x", Meta{}, func(_ context.Context, c Call[panicky]) (struct{}, error) { return struct{}{}, nil })
	_, err = p.binding().decode(nil)
	if ce := inputInvalid(err); ce.Code != envelope.CodeInternalError || ce.ExposeToModel {
		t.Fatalf("a panicking Validate gave %+v", ce)
	}

	e := Define("e.x", Meta{}, func(_ context.Context, c Call[plainErr]) (struct{}, error) { return struct{}{}, nil })
	_, err = e.binding().decode(nil)
	if ce := inputInvalid(err); ce.Code != envelope.CodeInputInvalid ||
		ce.Details["issues"].([]envelope.Issue)[0].Message != "the dates are in the wrong order" {
		t.Fatalf("a plain Validate error gave %+v", ce)
	}
}
