package broker_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/internal/broker"
)

func TestMsgIDNames(t *testing.T) {
	t.Parallel()
	const id = "0198c0de-0000-7000-8000-000000000001"
	for _, c := range []struct {
		msgID string
		want  bool
	}{
		{"alice." + id, true},
		{"alice." + id + ".0123456789abcdef", true},
		{"alice." + id + ".fwd0123456789abcdef", true},
		{"alice." + id + ".fwd", true},
		{id, true},          // a client of an earlier version
		{id + "-fwd", true}, // a forward of an earlier version
		{"bob." + id, false},
		{"bob." + id + ".0123456789abcdef", false},
		{"alice." + id + ".", false},
		{"alice." + id + ".a.b", false},
		{"alice." + id + ".a*", false},
		{"alice." + id + "." + strings.Repeat("a", 65), false},
		{"alice." + id + "x", false},
		{"alice.other", false},
		{"", false},
		{id + "-other", false},
	} {
		if got := broker.MsgIDNames(c.msgID, "alice", id); got != c.want {
			t.Errorf("MsgIDNames(%q) = %v, want %v", c.msgID, got, c.want)
		}
	}
}

func TestExecutionOfMsgID(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ msgID, want string }{
		{"alice.e1", "e1"},
		{"alice.e1.0123456789abcdef", "e1"},
		{"alice.e1.fwd", "e1"},
		{"e1", "e1"},
		{"e1-fwd", "e1"},
		{"bob.e1", ""},
		{"alice.e1.a*", ""},
	} {
		if got := broker.ExecutionOfMsgID(c.msgID, "alice"); got != c.want {
			t.Errorf("ExecutionOfMsgID(%q) = %q, want %q", c.msgID, got, c.want)
		}
	}
}

// signing is a connection whose options sign with kp, as nats.Nkey or a
// .creds file set them.
func signing(t *testing.T, kp nkeys.KeyPair) *nats.Conn {
	t.Helper()
	return &nats.Conn{Opts: nats.Options{SignatureCB: kp.Sign}}
}

// The tag is what no other principal can compute: the same for every
// connection of one key (a request submitted again by another process of the
// principal is still a duplicate), different for another key, and absent on a
// connection that does not sign.
func TestMsgIDs_TagOnlyTheKeysHolderMakes(t *testing.T) {
	t.Parallel()
	alice, _ := nkeys.CreateUser()
	mallory, _ := nkeys.CreateUser()
	ids := func(kp nkeys.KeyPair) broker.MsgIDs {
		m, err := broker.NewMsgIDs(signing(t, kp))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a1, a2, m := ids(alice), ids(alice), ids(mallory)
	got := a1.Request("alice", "e1")
	if !strings.HasPrefix(got, "alice.e1.") || len(got) != len("alice.e1.")+16 {
		t.Fatalf("Request = %q, want alice.e1.<16 hex digits>", got)
	}
	if again := a2.Request("alice", "e1"); again != got {
		t.Errorf("another connection of the same key makes %q, want %q", again, got)
	}
	if other := m.Request("alice", "e1"); other == got {
		t.Errorf("another key makes alice's message id %q", other)
	}
	if a1.Request("alice", "e2") == got || a1.Request("bob", "e1") == got {
		t.Error("two executions share a message id")
	}
	if fwd := a1.Forward("alice", "e1"); !strings.HasPrefix(fwd, "alice.e1.fwd") || fwd == got || !broker.MsgIDNames(fwd, "alice", "e1") {
		t.Errorf("Forward = %q", fwd)
	}
	open, err := broker.NewMsgIDs(&nats.Conn{})
	if err != nil {
		t.Fatal(err)
	}
	if got := open.Request("_anon", "e1"); got != "_anon.e1" {
		t.Errorf("without a key: %q, want _anon.e1", got)
	}
}
