package execution

import (
	"bytes"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/codectest"
)

// plainRecord is Record without its EncodeMsgpack method.
type plainRecord Record

func TestRecordEncoder_WritesTheReflectiveEncodersBytes(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	var filled Record
	codectest.Fill(&filled)
	for name, r := range map[string]Record{
		"every field": filled,
		"zero":        {},
		"claimed":     {V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: "demo.echo", State: StateClaimed, Worker: "w1", LeaseUntil: now, CreatedAt: now, UpdatedAt: now},
		"full": {V: envelope.Version, ExecutionID: envelope.NewExecutionID(), CapabilityID: "demo.echo", State: StateBackoff, Attempt: 3,
			Worker: "w1", LeaseUntil: now, StartedAt: now, LastError: envelope.CodeTimeout, CancelRequested: true, CancelRequestedAt: now,
			ApprovalID: "a1", Status: envelope.StatusCancelled, CreatedAt: now, UpdatedAt: now},
	} {
		got, err := envelope.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := envelope.Marshal((*plainRecord)(&r))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got % x\nwant % x", name, got, want)
		}
		var back Record
		if err := envelope.Unmarshal(got, &back); err != nil || back.Attempt != r.Attempt || back.State != r.State || !back.UpdatedAt.Equal(r.UpdatedAt) {
			t.Errorf("%s: decoded %+v, err %v", name, back, err)
		}
	}
}
