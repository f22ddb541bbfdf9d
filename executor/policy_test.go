package executor

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func stance(name string, s Stance, types ...string) Policy {
	return Policy{Name: name, Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
		return Decision{Stance: s, Reason: name + " says " + string(s), ApprovalTypes: types}, nil
	}}
}

func TestPolicies_PrecedenceDenyHideApprovalAllow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stances []Stance
		want    Stance
	}{
		{nil, Allow},
		{[]Stance{Allow, Allow}, Allow},
		{[]Stance{Allow, RequireApproval}, RequireApproval},
		{[]Stance{RequireApproval, Hide, Allow}, Hide},
		{[]Stance{Hide, Deny, RequireApproval}, Deny},
		{[]Stance{Deny, Hide}, Deny},
		{[]Stance{""}, Allow}, // no stance is allow
	} {
		var ps []Policy
		for i, s := range c.stances {
			ps = append(ps, stance(string(rune('a'+i)), s))
		}
		v := evaluatePolicies(context.Background(), ps, nil, PolicyRequest{Phase: PhaseInvocation}, time.Second)
		if v.stance != c.want || v.failed {
			t.Errorf("%v: %s (failed %v), want %s", c.stances, v.stance, v.failed, c.want)
		}
	}
}

func TestPolicies_AllEvaluatedNoShortCircuit(t *testing.T) {
	t.Parallel()
	var ran []string
	track := func(name string, s Stance) Policy {
		return Policy{Name: name, Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			ran = append(ran, name)
			return Decision{Stance: s}, nil
		}}
	}
	v := evaluatePolicies(context.Background(),
		[]Policy{track("runtime-deny", Deny), track("runtime-allow", Allow)},
		[]Policy{track("own-hide", Hide), track("own-approval", RequireApproval)},
		PolicyRequest{Phase: PhaseInvocation}, time.Second)
	want := []string{"runtime-deny", "runtime-allow", "own-hide", "own-approval"}
	if !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want every policy in order %v", ran, want)
	}
	if len(v.records) != 4 || v.stance != Deny {
		t.Fatalf("records %+v, stance %s", v.records, v.stance)
	}
	for i, r := range v.records {
		if r.Policy != want[i] || r.Phase != PhaseInvocation {
			t.Errorf("record %d: %+v", i, r)
		}
	}
}

func TestPolicies_ApprovalRequirementsMerge(t *testing.T) {
	t.Parallel()
	v := evaluatePolicies(context.Background(),
		[]Policy{stance("a", RequireApproval, "finance"), stance("b", Allow)},
		[]Policy{stance("c", RequireApproval, "security", "finance")},
		PolicyRequest{Phase: PhaseInvocation}, time.Second)
	if v.stance != RequireApproval || !slices.Equal(v.approvalTypes, []string{"finance", "security"}) ||
		!slices.Equal(v.reasons, []string{"a says require-approval", "c says require-approval"}) {
		t.Fatalf("%+v", v)
	}
}

func TestPolicies_OnlyThoseOfThePhase(t *testing.T) {
	t.Parallel()
	disc := stance("discovery-only", Hide)
	disc.Phases = []Phase{PhaseDiscovery}
	exec := stance("execution-only", Deny)
	exec.Phases = []Phase{PhaseExecution}
	def := stance("default-invocation", RequireApproval)
	ps := []Policy{disc, exec, def}
	for phase, want := range map[Phase]Stance{PhaseDiscovery: Hide, PhaseInvocation: RequireApproval, PhaseExecution: Deny} {
		v := evaluatePolicies(context.Background(), ps, nil, PolicyRequest{Phase: phase}, time.Second)
		if v.stance != want || len(v.records) != 1 {
			t.Errorf("%s: %s with %d records, want %s", phase, v.stance, len(v.records), want)
		}
	}
}

// Every way a policy can fail to decide denies, is recorded with how it
// failed, and does not stop the others from being evaluated (SI-7).
func TestPolicies_FailClosed(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	defer close(block)
	ps := []Policy{
		{Name: "errs", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			return Decision{Stance: Allow}, errors.New("directory unreachable")
		}},
		{Name: "panics", Evaluate: func(context.Context, PolicyRequest) (Decision, error) { panic("nil map") }},
		{Name: "hangs", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			<-block // ignores its context: the runtime must not wait for it
			return Decision{Stance: Allow}, nil
		}},
		{Name: "unknown-stance", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			return Decision{Stance: "maybe"}, nil
		}},
		{Name: "no-function"},
		stance("allows", Allow),
	}
	v := evaluatePolicies(context.Background(), ps, nil, PolicyRequest{Phase: PhaseInvocation}, 50*time.Millisecond)
	if !v.failed || v.stance != Deny {
		t.Fatalf("verdict %+v: want failed and deny", v)
	}
	want := map[string]string{"errs": "error", "panics": "panic", "hangs": "timeout", "unknown-stance": "invalid-stance",
		"no-function": "error", "allows": ""}
	if len(v.records) != len(want) {
		t.Fatalf("records %+v", v.records)
	}
	for _, r := range v.records {
		if r.Failure != want[r.Policy] {
			t.Errorf("%s: failure %q, want %q", r.Policy, r.Failure, want[r.Policy])
		}
		if failed := want[r.Policy] != ""; r.Failed != failed || failed && (r.Stance != Deny || r.Reason == "") {
			t.Errorf("%s: %+v", r.Policy, r)
		}
	}
}
