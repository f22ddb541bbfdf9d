package engine

import (
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// A record names the request it was claimed for; only that request takes the
// execution over. A record of an earlier version, without the newer fields,
// still decodes and is compared on what it holds.
func TestRecordConflict_OnlyTheClaimedRequestMatches(t *testing.T) {
	t.Parallel()
	alice := envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	claimed := &envelope.Request{ExecutionID: envelope.NewExecutionID(), CapabilityID: "vault.transfer",
		ApprovalID: "ap1", Actor: alice, Surface: "direct"}
	var rec Record
	rec.State = StateRunning
	claimedFor(&rec, claimed, "h1")

	// What an earlier version wrote: no actor, surface or input hash.
	old, err := envelope.Marshal(map[string]any{"v": 1, "executionId": claimed.ExecutionID,
		"capabilityId": "vault.transfer", "state": "running", "approvalId": "ap1"})
	if err != nil {
		t.Fatal(err)
	}
	var oldRec Record
	if err := envelope.Unmarshal(old, &oldRec); err != nil {
		t.Fatal(err)
	}

	other := func(change func(r *envelope.Request)) *envelope.Request {
		r := *claimed
		change(&r)
		return &r
	}
	// A call that asked for an approval, its worker lost after reserving the
	// approval's id: claimed, never running.
	asking := &envelope.Request{ExecutionID: claimed.ExecutionID, CapabilityID: "vault.transfer", Actor: alice, Surface: "direct"}
	var reserving Record
	reserving.State = StateClaimed
	claimedFor(&reserving, asking, "h1")
	reserving.ApprovalID = "ap-reserved"
	for _, c := range []struct {
		name      string
		rec       *Record
		req       *envelope.Request
		inputHash string
		want      string
	}{
		{"the claimed request", &rec, claimed, "h1", ""},
		{"another capability", &rec, other(func(r *envelope.Request) { r.CapabilityID = "gate.pay" }), "h1", "capabilityId"},
		{"no approval", &rec, other(func(r *envelope.Request) { r.ApprovalID = "" }), "h1", "approvalId"},
		{"another actor", &rec, other(func(r *envelope.Request) { r.Actor.ID = "bob" }), "h1", "actor"},
		{"another surface", &rec, other(func(r *envelope.Request) { r.Surface = "mcp" }), "h1", "surface"},
		{"another input", &rec, claimed, "h2", "inputHash"},
		{"a cancel's pending record", &Record{State: StatePending, CancelRequested: true}, claimed, "h1", ""},
		{"an earlier version's record", &oldRec, other(func(r *envelope.Request) { r.Actor.ID = "bob" }), "h2", ""},
		{"an earlier version's record, another capability", &oldRec, other(func(r *envelope.Request) { r.CapabilityID = "gate.pay" }), "h1", "capabilityId"},
		{"an earlier version's record, no approval", &oldRec, other(func(r *envelope.Request) { r.ApprovalID = "" }), "h1", "approvalId"},
		{"the asking call, its approval reserved", &reserving, asking, "h1", ""},
		{"the asking call's id, resuming another approval", &reserving, claimed, "h1", "approvalId"},
		{"the asking call's id, another input", &reserving, asking, "h2", "inputHash"},
	} {
		if got := conflict(c.rec, c.req, c.inputHash); got != c.want {
			t.Errorf("%s: conflict %q, want %q", c.name, got, c.want)
		}
	}
}

// A Go client's input may hold binary data, which JSON has no form for: the
// record still names that input, and a second request under the same id with
// other bytes does not take the execution over on the first one's stages.
func TestRecordConflict_InputWithoutJSONFormStillCompared(t *testing.T) {
	t.Parallel()
	// A struct, not a map: a map's msgpack keys come in a random order, and
	// two encodings of one input would differ.
	type transfer struct {
		To   string `json:"to"`
		Memo []byte `json:"memo"`
	}
	alice := envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	request := func(data []byte) *execution {
		req := &envelope.Request{ExecutionID: "e1", CapabilityID: "vault.transfer", Actor: alice, Surface: "direct",
			Input: envelope.MustRaw(transfer{To: "acct-1", Memo: data})}
		x := &execution{req: req}
		x.hashInput()
		return x
	}
	first, second := request([]byte("benign")), request([]byte("other"))
	var rec Record
	rec.State = StateRunning
	claimedFor(&rec, first.req, first.inputHash)
	if got := conflict(&rec, second.req, second.inputHash); got != "inputHash" {
		t.Errorf("a request with another input: conflict %q, want %q", got, "inputHash")
	}
	if got := conflict(&rec, first.req, request([]byte("benign")).inputHash); got != "" {
		t.Errorf("the claimed request again: conflict %q, want none", got)
	}
}
