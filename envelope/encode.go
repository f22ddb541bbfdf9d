package envelope

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/capstan-dev/capstan/internal/msgenc"
)

// EncodeMsgpack writes the request without reflection.
func (r Request) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.Int("v", int64(r.V))
	f.String("executionId", r.ExecutionID)
	f.String("capabilityId", r.CapabilityID)
	f.Raw("input", r.Input)
	f.Actor("actor", r.Actor.ID, r.Actor.Kind, r.Actor.Attrs)
	f.String("surface", r.Surface)
	f.String("correlationId", r.CorrelationID)
	f.Time("submittedAt", r.SubmittedAt)
	if r.Deadline != nil {
		f.Time("deadline", *r.Deadline)
	}
	if r.StartBy != nil {
		f.Time("startBy", *r.StartBy)
	}
	f.String("approvalId", r.ApprovalID)
	f.String("traceparent", r.Traceparent)
	return f.Encode(enc)
}

// EncodeMsgpack writes the envelope without reflection.
func (e Envelope) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.Int("v", int64(e.V))
	f.String("executionId", e.ExecutionID)
	f.String("capabilityId", e.CapabilityID)
	f.String("status", string(e.Status))
	f.Raw("output", e.Output)
	f.Value("error", e.Error, e.Error == nil)
	f.Int("attempts", int64(e.Attempts))
	f.Value("approval", e.Approval, e.Approval == nil)
	f.Int("durationMs", e.DurationMs)
	f.String("finalizedBy", e.FinalizedBy)
	f.Time("finalizedAt", e.FinalizedAt)
	f.Value("recovered", e.Recovered, e.Recovered == nil)
	return f.Encode(enc)
}

// EncodeMsgpack writes the error as the reflective encoder writes it, but for
// its details: they are written as the generic values a decoder reads back
// (a struct as a map, every map's keys sorted), so that an envelope decoded
// and encoded again is the same bytes, in Go and in every other client
// (docs/wire.md). A handler's details may hold its own structs, whose fields
// the reflective encoder writes in declaration order and a decoder reads
// back as a map.
func (e Error) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f msgenc.Fields
	f.String("code", string(e.Code))
	f.String("message", e.Message)
	f.Bool("retryable", e.Retryable)
	f.Bool("exposeToModel", e.ExposeToModel)
	if len(e.Details) > 0 {
		d, err := canonicalValue(e.Details)
		if err != nil {
			return fmt.Errorf("envelope: error details: %w", err)
		}
		f.Raw("details", d)
	}
	f.String("stage", e.Stage)
	return f.Encode(enc)
}

// canonicalValue encodes v as a record's value, decodes it into generic
// values and encodes those: the form a decoder reads back and writes again
// unchanged.
func canonicalValue(v any) (Raw, error) {
	b, err := Marshal(v)
	if err != nil {
		return nil, err
	}
	var g any
	if err := Unmarshal(b, &g); err != nil {
		return nil, err
	}
	return Marshal(g)
}
