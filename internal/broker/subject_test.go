package broker_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/capstan-dev/capstan/internal/broker"
)

func TestSubjectMatches_NATSRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject, filter string
		want            bool
	}{
		// literals
		{"capstan.exec.alice.orders.refund", "capstan.exec.alice.orders.refund", true},
		{"capstan.exec.alice.orders.refund", "capstan.exec.alice.orders", false},
		{"capstan.exec.alice.orders", "capstan.exec.alice.orders.refund", false},
		{"capstan.exec.alice.orders.refund", "capstan.exec.alice.orders.refunds", false},
		{"a", "a", true},
		{"a", "b", false},
		// "*" is one token
		{"capstan.exec.alice.orders.refund", "capstan.exec.*.orders.refund", true},
		{"capstan.exec.alice.orders.refund", "capstan.exec.*.orders.*", true},
		{"capstan.exec.alice.orders.refund", "capstan.exec.*.orders", false},
		{"capstan.exec.alice.orders.refund", "capstan.exec.*", false},
		{"capstan.cancel.alice.0198-x", "capstan.cancel.*.*", true},
		{"a", "*", true},
		{"a.b", "*", false},
		// ">" is one or more tokens, at the end
		{"capstan.exec.alice.orders.refund", "capstan.exec.>", true},
		{"capstan.exec.alice", "capstan.exec.>", true},
		{"capstan.exec", "capstan.exec.>", false},
		{"capstan.audit.246", ">", true},
		{"capstan.exec.alice._unrouted", "capstan.exec.*._unrouted", true},
		{"capstan.exec.alice.greet._unrouted", "capstan.exec.*._unrouted", false},
		// a token is the whole token: no prefix or partial wildcard
		{"capstan.execx.alice", "capstan.exec.>", false},
		{"abc", "a*", false},
		{"a*", "a*", true},
		{"a>", "a>", true},
		{"ab", "a>", false},
		// a subject with wildcards is covered only by a filter as wide
		{"capstan.exec.*.orders", "capstan.exec.*.orders", true},
		{"capstan.exec.*.orders", "capstan.exec.>", true},
		{"capstan.exec.*.orders", "capstan.exec.alice.orders", false},
		{"capstan.exec.>", "capstan.exec.>", true},
		{"capstan.exec.>", "capstan.exec.*", false},
		{"capstan.exec.>", "capstan.exec.alice", false},
		{">", ">", true},
		{"*", "*", true},
		{"*", "a", false},
		// empty tokens match nothing but a ">" already reached
		{"", "", false},
		{"", "a", false},
		{"a", "", false},
		{"", ">", true},
		{"a..b", "a.*.b", false},
		{"a..b", "a.>", true},
		{"a.b", "a..b", false},
		{"a.", "a.*", false},
		{"a.b", "a.b.", false},
		{".a", "*.a", false},
	} {
		if got := broker.SubjectMatches(tc.subject, tc.filter); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tc.subject, tc.filter, got, tc.want)
		}
	}
}

// capstan's matcher answers as the server's does: on every subject and filter
// of up to three tokens drawn from literals, wildcards, partial wildcards and
// empty tokens, then on random longer ones sharing prefixes.
func TestSubjectMatches_AgreesWithTheServer(t *testing.T) {
	t.Parallel()
	tokens := []string{"a", "b", "ab", "*", ">", "", "a*", ">a", " "}
	var all []string
	var grow func(prefix string, n int)
	grow = func(prefix string, n int) {
		for _, tok := range tokens {
			s := tok
			if n > 0 {
				s = prefix + "." + tok
			}
			all = append(all, s)
			if n < 2 {
				grow(s, n+1)
			}
		}
	}
	grow("", 0)
	compare := func(subject, filter string) {
		t.Helper()
		if got, want := broker.SubjectMatches(subject, filter), server.SubjectMatchesFilter(subject, filter); got != want {
			t.Fatalf("SubjectMatches(%q, %q) = %v, the server says %v", subject, filter, got, want)
		}
	}
	for _, s := range all {
		for _, f := range all {
			compare(s, f)
		}
	}
	t.Logf("%d subjects × %d filters compared exhaustively", len(all), len(all))

	// Longer ones: a filter is mostly a subject with some tokens widened, so
	// that the interesting answers (long shared prefixes) are common.
	rng := rand.New(rand.NewPCG(1, 2))
	literal := []string{"capstan", "exec", "alice", "orders", "refund", "_unrouted", "x", ""}
	const n = 200_000
	for range n {
		subject := make([]string, 1+rng.IntN(8))
		for i := range subject {
			subject[i] = literal[rng.IntN(len(literal))]
			if rng.IntN(20) == 0 {
				subject[i] = tokens[rng.IntN(len(tokens))]
			}
		}
		filter := make([]string, 0, len(subject)+2)
		for i := range len(subject) + rng.IntN(3) - 1 {
			switch {
			case i < len(subject) && rng.IntN(4) > 0:
				filter = append(filter, subject[i])
			case rng.IntN(3) == 0:
				filter = append(filter, "*")
			case rng.IntN(3) == 0:
				filter = append(filter, ">")
			default:
				filter = append(filter, literal[rng.IntN(len(literal))])
			}
		}
		compare(strings.Join(subject, "."), strings.Join(filter, "."))
	}
}

func BenchmarkSubjectMatches(b *testing.B) {
	for b.Loop() {
		broker.SubjectMatches("capstan.exec.alice.orders.refund", "capstan.exec.*.orders.refund")
	}
}
