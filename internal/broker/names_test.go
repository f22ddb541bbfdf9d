package broker_test

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
)

func TestNames_EveryNameDerivesFromThePrefix(t *testing.T) {
	t.Parallel()
	def, teamA, lower := broker.NewNames(""), broker.NewNames("TEAMA"), broker.NewNames("teama")
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"ExecStream", def.ExecStream(), "CAPSTAN_EXEC"},
		{"AuditStream", def.AuditStream(), "CAPSTAN_AUDIT"},
		{"ExecutionsBucket", def.ExecutionsBucket(), "CAPSTAN_EXECUTIONS"},
		{"EnvelopesBucket", def.EnvelopesBucket(), "CAPSTAN_ENVELOPES"},
		{"ApprovalsBucket", def.ApprovalsBucket(), "CAPSTAN_APPROVALS"},
		{"CatalogBucket", def.CatalogBucket(), "CAPSTAN_CATALOG"},
		{"PoolsBucket", def.PoolsBucket(), "CAPSTAN_POOLS"},
		{"PoolConsumer", def.PoolConsumer("billing"), "pool-billing"},
		{"UnroutedConsumer", def.UnroutedConsumer(), "_unrouted"},
		{"ExecSubject", def.ExecSubject("alice", "orders.refund"), "capstan.exec.alice.orders.refund"},
		{"ExecFilter", def.ExecFilter("orders.refund"), "capstan.exec.*.orders.refund"},
		{"ExecSubjects", def.ExecSubjects(), "capstan.exec.>"},
		{"UnroutedSubject", def.UnroutedSubject("alice"), "capstan.exec.alice._unrouted"},
		{"UnroutedFilter", def.UnroutedFilter(), "capstan.exec.*._unrouted"},
		{"CapabilityFromSubject", def.CapabilityFromSubject("capstan.exec.alice.orders.refund"), "orders.refund"},
		{"AuditSubject", def.AuditSubject("0198-x"), "capstan.audit.246"},
		{"LegacyAuditSubject", def.LegacyAuditSubject("0198-x"), "capstan.audit.0198-x"},
		{"AuditSubjects", def.AuditSubjects(), "capstan.audit.>"},
		{"CancelSubject", def.CancelSubject("alice", "0198-x"), "capstan.cancel.alice.0198-x"},
		{"CancelSubjects", def.CancelSubjects(), "capstan.cancel.*.*"},
		{"DescribeSubject", def.DescribeSubject("alice"), "capstan.describe.alice"},
		{"DecideSubject", def.DecideSubject("carol"), "capstan.approvals.decide.carol"},
		{"EnvelopeSubjectsOf", def.EnvelopeSubjectsOf("alice"), "capstan.envelope.alice.>"},
		{"ProgressSubject", def.ProgressSubject("alice", "0198-x"), "capstan.progress.alice.0198-x"},
		{"ProgressSubjectsOf", def.ProgressSubjectsOf("alice"), "capstan.progress.alice.>"},
		{"InboxPrefix", def.InboxPrefix("alice"), "_INBOX_capstan.alice"},
		{"GrantsBucket", def.GrantsBucket(), "CAPSTAN_GRANTS"},
		{"PrincipalOfSubject cancel", def.PrincipalOfSubject("capstan.cancel.alice.0198-x"), "alice"},
		{"PrincipalOfSubject decide", def.PrincipalOfSubject("capstan.approvals.decide.carol"), "carol"},
		{"PrincipalOfSubject list", def.PrincipalOfSubject(def.ListApprovalsSubject("carol")), "carol"},
		{"ListApprovalsSubject", def.ListApprovalsSubject("carol"), "capstan.approvals.list.carol"},
		{"PrincipalOfSubject describe", def.PrincipalOfSubject("capstan.describe._anon"), "_anon"},
		{"Key", broker.Key("alice", "0198-x"), "alice.0198-x"},
		{"WorkersQueue", def.WorkersQueue(), "capstan-workers"},
		{"EnvelopeSubjects", def.EnvelopeSubjects(), "capstan.envelope.>"},
		{"EnvelopeKeyFromSubject", def.EnvelopeKeyFromSubject("capstan.envelope.alice.0198-x"), "alice.0198-x"},

		{"prefixed ExecStream", teamA.ExecStream(), "TEAMA_EXEC"},
		{"prefixed AuditStream", teamA.AuditStream(), "TEAMA_AUDIT"},
		{"prefixed ExecutionsBucket", teamA.ExecutionsBucket(), "TEAMA_EXECUTIONS"},
		{"prefixed EnvelopesBucket", teamA.EnvelopesBucket(), "TEAMA_ENVELOPES"},
		{"prefixed ApprovalsBucket", teamA.ApprovalsBucket(), "TEAMA_APPROVALS"},
		{"prefixed CatalogBucket", teamA.CatalogBucket(), "TEAMA_CATALOG"},
		{"prefixed PoolsBucket", teamA.PoolsBucket(), "TEAMA_POOLS"},
		{"prefixed PoolConsumer", teamA.PoolConsumer("billing"), "pool-billing"},
		{"prefixed UnroutedConsumer", teamA.UnroutedConsumer(), "_unrouted"},
		{"prefixed ExecSubject", teamA.ExecSubject("p", "demo.echo"), "teama.exec.p.demo.echo"},
		{"prefixed ExecSubjects", teamA.ExecSubjects(), "teama.exec.>"},
		{"prefixed UnroutedSubject", teamA.UnroutedSubject("p"), "teama.exec.p._unrouted"},
		{"prefixed CapabilityFromSubject", teamA.CapabilityFromSubject("teama.exec.p.demo.echo"), "demo.echo"},
		{"prefixed AuditSubject", teamA.AuditSubject("e1"), "teama.audit.303"},
		{"prefixed LegacyAuditSubject", teamA.LegacyAuditSubject("e1"), "teama.audit.e1"},
		{"prefixed AuditSubjects", teamA.AuditSubjects(), "teama.audit.>"},
		{"prefixed CancelSubject", teamA.CancelSubject("p", "e1"), "teama.cancel.p.e1"},
		{"prefixed CancelSubjects", teamA.CancelSubjects(), "teama.cancel.*.*"},
		{"prefixed DescribeSubject", teamA.DescribeSubject("p"), "teama.describe.p"},
		{"prefixed WorkersQueue", teamA.WorkersQueue(), "teama-workers"},
		{"prefixed EnvelopeSubjects", teamA.EnvelopeSubjects(), "teama.envelope.>"},
		{"prefixed EnvelopeKeyFromSubject", teamA.EnvelopeKeyFromSubject("teama.envelope.p.e1"), "p.e1"},

		{"lower-case prefix ExecStream", lower.ExecStream(), "TEAMA_EXEC"},
		{"lower-case prefix ExecSubject", lower.ExecSubject("p", "demo.echo"), "teama.exec.p.demo.echo"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

// A subject and the id it carries survive the round trip for every id shape.
func TestNames_SubjectRoundTrips(t *testing.T) {
	t.Parallel()
	n := broker.NewNames("")
	for _, id := range []string{"echo", "orders.refund", "a.b-c.d_e", "x1"} {
		if got := n.CapabilityFromSubject(n.ExecSubject("p", id)); got != id {
			t.Errorf("CapabilityFromSubject(ExecSubject(%q)) = %q", id, got)
		}
	}
	for _, id := range []string{"0198c0de-1111-7abc-8def-000000000001", "custom-id"} {
		sub := "capstan.envelope." + id
		if got := n.EnvelopeKeyFromSubject(sub); got != id {
			t.Errorf("EnvelopeKeyFromSubject(%q) = %q, want %q", sub, got, id)
		}
	}
}

func TestResolveURL_OptionThenEnvironmentThenDefault(t *testing.T) {
	t.Setenv("CAPSTAN_NATS_URL", "")
	if got := (broker.ConnectOptions{}).ResolveURL(); got != broker.DefaultURL {
		t.Errorf("no URL, no environment: %q, want %q", got, broker.DefaultURL)
	}
	t.Setenv("CAPSTAN_NATS_URL", "nats://env:4222")
	if got := (broker.ConnectOptions{}).ResolveURL(); got != "nats://env:4222" {
		t.Errorf("environment: %q, want nats://env:4222", got)
	}
	if got := (broker.ConnectOptions{URL: "nats://opt:4222"}).ResolveURL(); got != "nats://opt:4222" {
		t.Errorf("option over environment: %q, want nats://opt:4222", got)
	}
}

// The shard is FNV-1a-32 of the id mod 1024 in three hex digits, so that any
// reader, in any language, finds an execution's subject from its id alone.
func TestAuditShard_IsFNV1aOfTheIDModuloTheShardCount(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := 0; i < 20000; i++ {
		id := envelope.NewExecutionID()
		if i%2 == 1 {
			id = fmt.Sprintf("custom-%d", i)
		}
		h := fnv.New32a()
		h.Write([]byte(id))
		want := fmt.Sprintf("%03x", h.Sum32()%broker.AuditShards)
		got := broker.AuditShard(id)
		if got != want {
			t.Fatalf("AuditShard(%q) = %q, want %q", id, got, want)
		}
		seen[got] = true
	}
	// 20,000 ids cover every one of the 1,024 subjects.
	if len(seen) != broker.AuditShards {
		t.Fatalf("%d shards used, want %d", len(seen), broker.AuditShards)
	}
	for s := range seen {
		if len(s) != 3 || s > "3ff" {
			t.Fatalf("shard %q outside 000-3ff", s)
		}
	}
}
