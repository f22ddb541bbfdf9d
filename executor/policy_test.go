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
		{nil, StanceAllow},
		{[]Stance{StanceAllow, StanceAllow}, StanceAllow},
		{[]Stance{StanceAllow, StanceRequireApproval}, StanceRequireApproval},
		{[]Stance{StanceRequireApproval, StanceHide, StanceAllow}, StanceHide},
		{[]Stance{StanceHide, StanceDeny, StanceRequireApproval}, StanceDeny},
		{[]Stance{StanceDeny, StanceHide}, StanceDeny},
		{[]Stance{""}, StanceAllow}, // no stance is allow
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
		[]Policy{track("runtime-deny", StanceDeny), track("runtime-allow", StanceAllow)},
		[]Policy{track("own-hide", StanceHide), track("own-approval", StanceRequireApproval)},
		PolicyRequest{Phase: PhaseInvocation}, time.Second)
	want := []string{"runtime-deny", "runtime-allow", "own-hide", "own-approval"}
	if !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want every policy in order %v", ran, want)
	}
	if len(v.records) != 4 || v.stance != StanceDeny {
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
		[]Policy{stance("a", StanceRequireApproval, "finance"), stance("b", StanceAllow)},
		[]Policy{stance("c", StanceRequireApproval, "security", "finance")},
		PolicyRequest{Phase: PhaseInvocation}, time.Second)
	if v.stance != StanceRequireApproval || !slices.Equal(v.approvalTypes, []string{"finance", "security"}) ||
		!slices.Equal(v.reasons, []string{"a says require-approval", "c says require-approval"}) {
		t.Fatalf("%+v", v)
	}
}

func TestPolicies_OnlyThoseOfThePhase(t *testing.T) {
	t.Parallel()
	disc := stance("discovery-only", StanceHide)
	disc.Phases = []Phase{PhaseDiscovery}
	exec := stance("execution-only", StanceDeny)
	exec.Phases = []Phase{PhaseExecution}
	def := stance("default-invocation", StanceRequireApproval)
	ps := []Policy{disc, exec, def}
	for phase, want := range map[Phase]Stance{PhaseDiscovery: StanceHide, PhaseInvocation: StanceRequireApproval, PhaseExecution: StanceDeny} {
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
			return Decision{Stance: StanceAllow}, errors.New("directory unreachable")
		}},
		{Name: "panics", Evaluate: func(context.Context, PolicyRequest) (Decision, error) { panic("nil map") }},
		{Name: "hangs", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			<-block // ignores its context: the runtime must not wait for it
			return Decision{Stance: StanceAllow}, nil
		}},
		{Name: "unknown-stance", Evaluate: func(context.Context, PolicyRequest) (Decision, error) {
			return Decision{Stance: "maybe"}, nil
		}},
		{Name: "no-function"},
		stance("allows", StanceAllow),
	}
	v := evaluatePolicies(context.Background(), ps, nil, PolicyRequest{Phase: PhaseInvocation}, 50*time.Millisecond)
	if !v.failed || v.stance != StanceDeny {
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
		if failed := want[r.Policy] != ""; r.Failed != failed || failed && (r.Stance != StanceDeny || r.Reason == "") {
			t.Errorf("%s: %+v", r.Policy, r)
		}
	}
}
