package pauses

import (
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

func TestScope_MatchesEveryFieldItSets(t *testing.T) {
	t.Parallel()
	alice := envelope.Actor{Kind: "user", ID: "alice"}
	bob := envelope.Actor{Kind: "user", ID: "bob"}
	for _, tt := range []struct {
		scope     Scope
		principal string
		capID     string
		actor     envelope.Actor
		want      bool
	}{
		{Scope{}, "acme", "email.send", alice, true},
		{Scope{Capability: "email.send"}, "acme", "email.send", alice, true},
		{Scope{Capability: "email.send"}, "acme", "email.sender", alice, false},
		{Scope{Principal: "acme"}, "acme", "orders.refund", bob, true},
		{Scope{Principal: "acme"}, "beta", "orders.refund", bob, false},
		{Scope{Actor: "user:alice"}, "beta", "orders.refund", alice, true},
		{Scope{Actor: "user:alice"}, "beta", "orders.refund", bob, false},
		{Scope{Actor: "agent:alice"}, "beta", "orders.refund", alice, false},
		{Scope{Capability: "email.send", Principal: "acme", Actor: "user:alice"}, "acme", "email.send", alice, true},
		{Scope{Capability: "email.send", Principal: "acme", Actor: "user:alice"}, "acme", "email.send", bob, false},
		{Scope{Capability: "email.send", Principal: "acme", Actor: "user:alice"}, "beta", "email.send", alice, false},
		{Scope{Actor: "anonymous:"}, "acme", "email.send", envelope.Actor{Kind: "anonymous"}, true},
	} {
		if got := tt.scope.Matches(tt.principal, tt.capID, tt.actor); got != tt.want {
			t.Errorf("%s matches %s %s %s: %v, want %v", tt.scope, tt.principal, tt.capID, tt.actor, got, tt.want)
		}
	}
}

func TestScope_OneKeyPerScope(t *testing.T) {
	t.Parallel()
	scopes := []Scope{{}, {Capability: "email.send"}, {Principal: "email.send"}, {Actor: "user:email.send"},
		{Capability: "a", Principal: "b"}, {Capability: "a", Actor: "user:b"}, {Principal: "a", Actor: "user:b"}}
	seen := map[string]Scope{}
	for _, s := range scopes {
		k := s.Key()
		if other, dup := seen[k]; dup {
			t.Errorf("%s and %s share key %s", s, other, k)
		}
		seen[k] = s
		if s.Key() != k {
			t.Errorf("%s: key not stable", s)
		}
		for _, c := range k {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.') {
				t.Errorf("%s: key %q is not a bucket key", s, k)
				break
			}
		}
	}
	if (Scope{}).Key() != "all" {
		t.Errorf("everything's key is %q", Scope{}.Key())
	}
}

func TestPause_ValidateRefusesWhatCannotBeHonoured(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		p    Pause
		want string
	}{
		{Pause{Scope: Scope{Capability: "email.send"}, Mode: Hold, Reason: "r"}, ""},
		{Pause{Scope: Scope{Capability: "email.*"}, Mode: Hold, Reason: "r"}, "capability"},
		{Pause{Scope: Scope{Principal: "Acme"}, Mode: Hold, Reason: "r"}, "principal"},
		{Pause{Scope: Scope{Actor: "alice"}, Mode: Hold, Reason: "r"}, "kind:id"},
		{Pause{Scope: Scope{Actor: "user:*"}, Mode: Hold, Reason: "r"}, "no wildcard"},
		{Pause{Scope: Scope{}, Mode: "stop", Reason: "r"}, "mode"},
		{Pause{Scope: Scope{}, Mode: Refuse, Reason: "  "}, "reason is required"},
		{Pause{Scope: Scope{}, Mode: Refuse, Reason: strings.Repeat("x", MaxReason+1)}, "at most"},
	} {
		err := tt.p.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.p, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: %v, want an error about %q", tt.p, err, tt.want)
		}
	}
}

// A pause that refuses wins over one that holds; no pause, no match; a nil
// set is no pause.
func TestSet_RefuseWinsOverHold(t *testing.T) {
	t.Parallel()
	alice := envelope.Actor{Kind: "user", ID: "alice"}
	var none *Set
	if none.Match("acme", "email.send", alice) != nil || none.Len() != 0 || NewSet(nil) != nil {
		t.Fatal("an empty set matches")
	}
	hold := &Pause{Scope: Scope{Capability: "email.send"}, Mode: Hold, Reason: "h"}
	refuse := &Pause{Scope: Scope{Actor: "user:alice"}, Mode: Refuse, Reason: "r"}
	s := NewSet([]*Pause{hold, refuse})
	if got := s.Match("acme", "email.send", alice); got != refuse {
		t.Errorf("alice's email.send: %+v, want the refusal", got)
	}
	if got := s.Match("acme", "email.send", envelope.Actor{Kind: "user", ID: "bob"}); got != hold {
		t.Errorf("bob's email.send: %+v, want the hold", got)
	}
	if got := s.Match("acme", "demo.echo", envelope.Actor{Kind: "user", ID: "bob"}); got != nil {
		t.Errorf("bob's demo.echo: %+v, want none", got)
	}
	r := refuse.Refusal()
	if r.Code != envelope.CodePaused || !r.ExposeToModel || !r.Retryable || !strings.Contains(r.Message, "r.") {
		t.Errorf("refusal %+v", r)
	}
}
