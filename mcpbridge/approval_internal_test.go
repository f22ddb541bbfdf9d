package mcpbridge

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

var update = flag.Bool("update", false, "write testdata/actor-tags.json anew from actorTag")

// actorTagVector is one execution id the bridge would make for an actor:
// the TypeScript client's AI SDK tools make and check the same
// (clients/typescript/src/owner.ts), and test theirs against these.
type actorTagVector struct {
	UUID        string         `json:"uuid"`
	Actor       envelope.Actor `json:"actor"`
	Tag         string         `json:"tag"`
	ExecutionID string         `json:"executionId"`
}

// TestActorTag_Vectors checks testdata/actor-tags.json against actorTag
// (-update writes it). One uuid under two actors is two tags; an actor's
// attributes are no part of its tag.
func TestActorTag_Vectors(t *testing.T) {
	t.Parallel()
	const u = "0195f3c2-7a1e-7b4d-8c2f-3e5a6b7c8d9e"
	var want []actorTagVector
	for _, c := range []struct {
		u     string
		actor envelope.Actor
	}{
		{u, envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}},
		{u, envelope.Actor{Kind: envelope.ActorUser, ID: "bob"}},
		{u, envelope.Actor{Kind: envelope.ActorUser, ID: "ada", Attrs: map[string]string{"tenant": "t-1"}}},
		{u, envelope.Actor{Kind: envelope.ActorService, ID: "billing:nightly"}},
		{"019a0b1c-2d3e-7f40-9152-63748596a7b8", envelope.Actor{Kind: envelope.ActorAgent, ID: "zoë ☃"}},
	} {
		tag := actorTag(c.actor, c.u)
		want = append(want, actorTagVector{UUID: c.u, Actor: c.actor, Tag: tag, ExecutionID: c.u + "-" + tag})
	}
	b, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "actor-tags.json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b) {
		t.Errorf("%s is not what actorTag makes today:\nhave %s\nnow  %s", path, have, b)
	}
	if want[0].Tag == want[1].Tag || want[0].Tag != want[2].Tag {
		t.Errorf("tags of one uuid: ada %s, bob %s, ada with attributes %s", want[0].Tag, want[1].Tag, want[2].Tag)
	}
	for _, v := range want {
		if len(v.ExecutionID) != uuidLen+1+tagLen || envelope.ValidExecutionID(v.ExecutionID) != nil {
			t.Errorf("%s: not an execution id of the bridge's shape", v.ExecutionID)
		}
	}
}
