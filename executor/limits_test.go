package executor

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A capability's limits are checked when it is registered: a limit that
// cannot mean what it says is refused with what is wrong, never taken for
// no limit.
func TestValidateLimits(t *testing.T) {
	t.Parallel()
	amount := func(any) (int64, error) { return 1, nil }
	cases := []struct {
		name   string
		limits []Limit
		want   string // a problem's words; "" for none
	}{
		{"none", nil, ""},
		{"concurrency", []Limit{{Kind: LimitConcurrency, Max: 2}}, ""},
		{"rate per actor, refusing", []Limit{{Kind: LimitRate, Per: LimitPerActor, Max: 5, Interval: time.Minute, AtLimit: AtLimitRefuse}}, ""},
		{"budget asking an approval", []Limit{{Kind: LimitBudget, Per: LimitPerActor, Name: "amount", Max: 2000, Interval: 24 * time.Hour,
			Amount: amount, AtLimit: AtLimitApproval}}, ""},
		{"a rate per actor and per principal", []Limit{{Kind: LimitRate, Per: LimitPerActor, Max: 5, Interval: time.Minute},
			{Kind: LimitRate, Per: LimitPerPrincipal, Max: 50, Interval: time.Minute}}, ""},
		{"unknown kind", []Limit{{Kind: "speed", Max: 1}}, `kind "speed"`},
		{"zero max", []Limit{{Kind: LimitConcurrency}}, "max 0 is not positive"},
		{"concurrency per actor", []Limit{{Kind: LimitConcurrency, Per: LimitPerActor, Max: 1}}, ""},
		{"concurrency per principal beside the capability's, shared", []Limit{{Kind: LimitConcurrency, Max: 4, PrincipalMax: 3},
			{Kind: LimitConcurrency, Per: LimitPerPrincipal, Max: 2}, {Kind: LimitConcurrency, Per: LimitPerActor, Max: 1}}, ""},
		{"a share over max", []Limit{{Kind: LimitConcurrency, Max: 4, PrincipalMax: 5}}, "principalMax 5 is not between 1 and max 4"},
		{"a share of a principal's own slots", []Limit{{Kind: LimitConcurrency, Per: LimitPerPrincipal, Max: 4, PrincipalMax: 2}},
			"a limit per principal is each one's already"},
		{"a share of a rate", []Limit{{Kind: LimitRate, Max: 5, Interval: time.Minute, PrincipalMax: 2}}, "only a concurrency limit has a principalMax"},
		{"rate without interval", []Limit{{Kind: LimitRate, Max: 5}}, "under a second"},
		{"rate per unknown", []Limit{{Kind: LimitRate, Per: "team", Max: 5, Interval: time.Minute}}, `per "team"`},
		{"budget without amount", []Limit{{Kind: LimitBudget, Name: "amount", Max: 5, Interval: time.Hour}}, "needs an Amount"},
		{"budget without name", []Limit{{Kind: LimitBudget, Max: 5, Interval: time.Hour, Amount: amount}}, "not a plain name"},
		{"budget named with a dot", []Limit{{Kind: LimitBudget, Name: "a.b", Max: 5, Interval: time.Hour, Amount: amount}}, "not a plain name"},
		{"approval at a rate", []Limit{{Kind: LimitRate, Max: 5, Interval: time.Minute, AtLimit: AtLimitApproval}}, "only a budget"},
		{"unknown choice", []Limit{{Kind: LimitConcurrency, Max: 5, AtLimit: "shrug"}}, `atLimit "shrug"`},
		{"two concurrency limits", []Limit{{Kind: LimitConcurrency, Max: 5}, {Kind: LimitConcurrency, Max: 2}}, "declared twice"},
		{"two concurrency limits per actor", []Limit{{Kind: LimitConcurrency, Per: LimitPerActor, Max: 5},
			{Kind: LimitConcurrency, Per: LimitPerActor, Max: 2}}, "declared twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := strings.Join(validateLimits(tc.limits), "; ")
			switch {
			case tc.want == "" && p != "":
				t.Errorf("refused: %s", p)
			case tc.want != "" && !strings.Contains(p, tc.want):
				t.Errorf("problems %q, want one saying %q", p, tc.want)
			}
		})
	}
}

// Registration refuses a capability whose limits are wrong, and describe
// shows the limits of one whose limits are right, in words.
func TestLimits_RefusedAtRegistrationShownByDescribe(t *testing.T) {
	t.Parallel()
	h := func(context.Context, Call[struct{}]) (struct{}, error) { return struct{}{}, nil }
	if _, err := NewRegistry(Define("t.bad", Meta{Description: "x", SideEffect: SideEffectRead,
		Limits: []Limit{{Kind: LimitRate, Max: 5}}}, h)); err == nil || !strings.Contains(err.Error(), "under a second") {
		t.Fatalf("a rate without its interval registered: %v", err)
	}
	r, err := NewRegistry(Define("t.good", Meta{Description: "x", SideEffect: SideEffectRead, Expose: On(SurfaceDirect), Limits: []Limit{
		{Kind: LimitConcurrency, Max: 3, PrincipalMax: 2},
		{Kind: LimitConcurrency, Per: LimitPerActor, Max: 1},
		{Kind: LimitRate, Per: LimitPerActor, Max: 10, Interval: time.Minute, AtLimit: AtLimitRefuse},
	}}, h))
	if err != nil {
		t.Fatal(err)
	}
	d := describe(r.get("t.good"), "p")
	var texts []string
	for _, l := range d.Limits {
		texts = append(texts, string(l.Kind)+"/"+string(l.Per)+"/"+string(l.AtLimit)+": "+l.Text)
	}
	want := "concurrency//wait: at most 3 running at once, 2 per principal; concurrency/actor/wait: at most 1 running at once per actor; " +
		"rate/actor/refuse: 10 per 1m per actor"
	if got := strings.Join(texts, "; "); got != want {
		t.Errorf("describe shows %q, want %q", got, want)
	}
}
