package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/policies"
)

// capstan policy: Cedar policies as data (DESIGN §18). Every subcommand is
// an admin's: it reads the catalog and the policies bucket, and apply and
// remove write it.

const policyUsage = `usage: capstan policy <command> [flags]

  apply FILE --reason TEXT     validate FILE against the catalog's schemas and put it in force on every worker
  apply --version N --reason   put an earlier version in force again (as a new version)
  test FILE [--cases FILE]     what FILE would decide differently from the set in force, on the
                               executions the trail recorded lately and on a file of cases
  show [--version N]           the set in force (or version N): its text, who applied it, when and why
  history                      every version applied
  remove --reason TEXT         take the set out of force: calls are decided by the Go policies alone
  schema                       the Cedar schema the catalog makes, which sets are validated against
`

func runPolicy(args []string) int {
	return runGroup("policy", policyUsage, args, map[string]func([]string) int{
		"apply":   runPolicyApply,
		"test":    runPolicyTest,
		"show":    runPolicyShow,
		"history": runPolicyHistory,
		"remove":  runPolicyRemove,
		"schema":  runPolicySchema,
	})
}

// changePolicies checks that a change of the policies says why and that an
// admin makes it, then connects it, with time for the workers'
// confirmations.
func changePolicies(conn *connFlags, command, reason string) (js jetstream.JetStream, ctx context.Context, done func(), err error) {
	if reason == "" {
		return nil, nil, nil, fmt.Errorf("policy %s: say why: --reason TEXT (it goes on the trail)", command)
	}
	if err := needAdmin(conn, "change the policies", names.PoliciesBucket()); err != nil {
		return nil, nil, nil, err
	}
	return conn.openJS("policy", submitTimeout+confirmWait)
}

// policyCatalog reads every capability the catalog lists.
func policyCatalog(ctx context.Context, js jetstream.JetStream) ([]policies.Capability, error) {
	kv, err := js.KeyValue(ctx, names.CatalogBucket())
	if err != nil {
		return nil, fmt.Errorf("read the catalog: %w (no worker has started yet?)", err)
	}
	return policies.Catalog(ctx, kv)
}

// policiesBucket opens the policies bucket; nil, nil when no set was ever
// applied.
func policiesBucket(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	return unlessAbsent(policies.Bucket(ctx, js, names, false))
}

// openPolicies parses the args of a command that reads the policies bucket
// (see readBuckets) and opens the bucket: kv is nil when no set was ever
// applied; done is nil when the command ends with code.
func openPolicies(conn *connFlags, fs *flag.FlagSet, args []string, o *outputFlags) (context.Context, *nats.Conn, jetstream.KeyValue, func(), int) {
	js, ctx, done, code := conn.readBuckets("policy", fs, args, o)
	if done == nil {
		return nil, nil, nil, nil, code
	}
	kv, err := policiesBucket(ctx, js)
	if err != nil {
		done()
		return nil, nil, nil, nil, fail(exitFailed, "%s: %v", fs.Name(), err)
	}
	return ctx, js.Conn(), kv, done, exitOK
}

// policyInForce compiles the set in force: nil when none is.
func policyInForce(ctx context.Context, js jetstream.JetStream) (*policies.Set, *policies.Current, error) {
	kv, err := policiesBucket(ctx, js)
	if err != nil || kv == nil {
		return nil, &policies.Current{}, err
	}
	cur, _, err := policies.ReadCurrent(ctx, js.Conn(), kv)
	if err != nil || cur.Version == 0 {
		return nil, cur, err
	}
	v, err := policies.ReadVersion(ctx, js.Conn(), kv, cur.Version)
	if err != nil {
		return nil, cur, err
	}
	s, err := policies.Compile(fmt.Sprintf("v%d", v.Version), []byte(v.Text))
	if err != nil {
		return nil, cur, err
	}
	s.Version = v.Version
	return s, cur, nil
}

// policyAnswer is what apply and remove print with -o json.
type policyAnswer struct {
	*policies.Change
	Workers []oplog.AppliedReply `json:"workers"`
	Undo    string               `json:"undo"`
}

func runPolicyApply(args []string) int {
	fs, conn, o := newConnFlags("policy apply", "FILE --reason TEXT | --version N --reason TEXT")
	reason := fs.String("reason", "", "why, in words: on the trail (required)")
	version := fs.Int("version", 0, "put this earlier `version` in force again, instead of a file")
	pos, code, ok := parseOutput(fs, args, -1, o)
	if !ok {
		return code
	}
	if (len(pos) == 1) == (*version > 0) || len(pos) > 1 {
		return usageError("policy apply: name one FILE, or --version N")
	}
	js, ctx, done, err := changePolicies(conn, "apply", *reason)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	var file string
	var text []byte
	if *version > 0 {
		kv, err := policiesBucket(ctx, js)
		if err != nil || kv == nil {
			return fail(exitFailed, "policy apply: no version %d: %v", *version, err)
		}
		v, err := policies.ReadVersion(ctx, js.Conn(), kv, *version)
		if err != nil {
			return fail(exitFailed, "policy apply: %v", err)
		}
		file, text = fmt.Sprintf("v%d", v.Version), []byte(v.Text)
	} else {
		var err error
		file = pos[0]
		if text, err = os.ReadFile(file); err != nil {
			return usageError("policy apply: %v", err)
		}
		file = filepath.Base(file)
	}
	catalog, err := policyCatalog(ctx, js)
	if err != nil {
		return fail(exitFailed, "policy apply: %v", err)
	}
	ch, err := policies.Apply(ctx, js.Conn(), names, policies.Applying{File: file, Text: text, Catalog: catalog,
		By: principalName(conn), Operator: operator(), Reason: *reason})
	if err != nil {
		return fail(exitFailed, "policy apply: refused, nothing changed: %v", err)
	}
	undo := "capstan policy remove --reason TEXT"
	if ch.Previous.Version > 0 {
		undo = fmt.Sprintf("capstan policy apply --version %d --reason TEXT", ch.Previous.Version)
	}
	a := confirmPolicies(ctx, js.Conn(), ch, undo)
	return o.print(a, func(w io.Writer, st style) {
		v := ch.Version
		fmt.Fprintf(w, "%s v%d, %s from %s (sha256 %s), valid against the catalog's %s.\n", st.bold("Policy set in force:"), v.Version,
			plural(v.Rules, "policy", "policies"), v.File, v.SHA256[:12], plural(len(catalog), "capability", "capabilities"))
		if ch.Previous.Version > 0 {
			fmt.Fprintf(w, "  It replaces v%d.\n", ch.Previous.Version)
		} else {
			fmt.Fprintln(w, "  No set was in force: from now on, a call no policy permits is refused POLICY_DENIED.")
		}
		fmt.Fprintf(w, "  By %s, %s; on the trail: capstan audit %s --owner %s\n", who(v.By, v.Operator), v.At.Format(time.RFC3339), ch.AuditID, v.By)
		policyWorkers(w, a, v.Version)
		fmt.Fprintf(w, "%s %s\n", st.bold("Undo:"), undo)
	})
}

func runPolicyRemove(args []string) int {
	fs, conn, o := newConnFlags("policy remove", "--reason TEXT")
	reason := fs.String("reason", "", "why, in words: on the trail (required)")
	if _, code, ok := parseOutput(fs, args, 0, o); !ok {
		return code
	}
	js, ctx, done, err := changePolicies(conn, "remove", *reason)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	ch, err := policies.Remove(ctx, js.Conn(), names, principalName(conn), operator(), *reason)
	if err != nil {
		return fail(exitFailed, "policy remove: %v", err)
	}
	undo := fmt.Sprintf("capstan policy apply --version %d --reason TEXT", ch.Previous.Version)
	a := confirmPolicies(ctx, js.Conn(), ch, undo)
	return o.print(a, func(w io.Writer, st style) {
		fmt.Fprintf(w, "%s v%d is out of force: calls are decided by the Go policies alone, as with no Cedar policy.\n",
			st.bold("Policy set removed:"), ch.Previous.Version)
		fmt.Fprintf(w, "  On the trail: capstan audit %s --owner %s\n", ch.AuditID, ch.Current.By)
		policyWorkers(w, a, 0)
		fmt.Fprintf(w, "%s %s\n", st.bold("Undo:"), undo)
	})
}

// confirmPolicies gathers the workers' confirmations of a change.
func confirmPolicies(ctx context.Context, nc *nats.Conn, ch *policies.Change, undo string) *policyAnswer {
	stop := waiting("the workers' confirmations", confirmWait)
	replies, _ := oplog.Confirm(ctx, nc, names, oplog.Policies, ch.Revision, "", confirmWait)
	stop()
	if replies == nil {
		replies = []oplog.AppliedReply{}
	}
	return &policyAnswer{Change: ch, Workers: replies, Undo: undo}
}

func policyWorkers(w io.Writer, a *policyAnswer, version int) {
	var ok, other []string
	for _, r := range a.Workers {
		switch {
		case r.Applied && r.PolicyVersion == version && r.PolicyError == "":
			ok = append(ok, r.Worker)
		case r.PolicyError != "":
			other = append(other, fmt.Sprintf("%s (v%d could not be loaded, its calls fail closed: %s)", r.Worker, r.PolicyVersion, r.PolicyError))
		default:
			other = append(other, fmt.Sprintf("%s (still v%d)", r.Worker, r.PolicyVersion))
		}
	}
	if len(a.Workers) == 0 {
		fmt.Fprintf(w, "  No worker answered within %v: the set is in the bucket, and every worker takes it up as it (re)connects or starts.\n", confirmWait)
		return
	}
	if len(ok) > 0 {
		fmt.Fprintf(w, "  In force on %s: %s.\n", plural(len(ok), "worker", "workers"), strings.Join(ok, ", "))
	}
	for _, o := range other {
		fmt.Fprintf(w, "  Not on %s\n", o)
	}
}

// policyTest is what policy test prints with -o json.
type policyTest struct {
	File      string             `json:"file"`
	Rules     int                `json:"rules"`
	InForce   int                `json:"inForce"` // the version compared with; 0: none
	Recorded  []policies.Outcome `json:"recorded"`
	Cases     []policies.Outcome `json:"cases,omitempty"`
	Changed   int                `json:"changed"`
	NeedInput int                `json:"needInput"`
	Failed    int                `json:"unexpected"`
}

func runPolicyTest(args []string) int {
	fs, conn, o := newConnFlags("policy test", "FILE [--cases FILE] [--since D] [--limit N]")
	casesFile := fs.String("cases", "", "a JSON `file` of cases to decide: [{name, principal, actor, capability, surface, input, expect}]")
	since := fs.Duration("since", 24*time.Hour, "decide again the executions recorded in this last `duration`")
	limit := fs.Int("limit", 1000, "at most this many recorded executions, newest first (0: none)")
	all := fs.Bool("all", false, "list every decision, not only those that change")
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	text, err := os.ReadFile(pos[0])
	if err != nil {
		return usageError("policy test: %v", err)
	}
	var cases []policies.Case
	if *casesFile != "" {
		b, err := os.ReadFile(*casesFile)
		if err != nil {
			return usageError("policy test: %v", err)
		}
		if cases, err = policies.ReadCases(b); err != nil {
			return usageError("policy test: %s: %v", *casesFile, err)
		}
	}
	js, ctx, done, err := conn.openJS("policy", 2*submitTimeout)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	file := filepath.Base(pos[0])
	set, err := policies.Compile(file, text)
	if err != nil {
		return fail(exitFailed, "policy test: %v", err)
	}
	catalog, err := policyCatalog(ctx, js)
	if err != nil {
		return fail(exitFailed, "policy test: %v", err)
	}
	if err := set.Validate(catalog); err != nil {
		return fail(exitFailed, "policy test: %s does not validate against the catalog's schemas; apply would refuse it:\n%v", file, err)
	}
	now, cur, err := policyInForce(ctx, js)
	if err != nil {
		return fail(exitFailed, "policy test: read the set in force: %v", err)
	}
	recorded, err := recordedCases(ctx, js.Conn(), *since, *limit)
	if err != nil {
		return fail(exitFailed, "policy test: read the recorded executions: %v", err)
	}
	r := policyTest{File: file, Rules: set.Rules(), InForce: cur.Version,
		Recorded: policies.Compare(now, set, recorded, catalog), Cases: policies.Compare(now, set, cases, catalog)}
	for _, o := range append(append([]policies.Outcome(nil), r.Recorded...), r.Cases...) {
		if o.Changed {
			r.Changed++
		}
		if o.NeedsInput {
			r.NeedInput++
		}
		if o.Unexpected {
			r.Failed++
		}
	}
	code = o.print(r, func(w io.Writer, st style) { writePolicyTest(w, st, &r, *since, *all) })
	if code == exitOK && r.Failed > 0 {
		code = exitFailed
	}
	return code
}

// recordedCases are the executions of the last since, newest first, at
// most limit, as cases (without their input: the trail keeps its hash).
func recordedCases(ctx context.Context, nc *nats.Conn, since time.Duration, limit int) ([]policies.Case, error) {
	if limit <= 0 {
		return nil, nil
	}
	b, err := broker.OpenAll(ctx, nc, broker.Config{})
	if err != nil {
		return nil, err
	}
	var out []policies.Case
	q := audit.Query{Since: time.Now().Add(-since), Limit: audit.MaxLimit}
	for len(out) < limit {
		page, err := audit.List(ctx, b.NC, b.Names.Prefix(), q)
		if err != nil {
			return nil, err
		}
		for _, e := range page.Entries {
			if len(out) == limit {
				break
			}
			rec := e.Status
			if e.Code != "" {
				rec += " " + e.Code
			}
			out = append(out, policies.Case{ExecutionID: e.ExecutionID, Recorded: rec, Principal: e.Principal,
				Actor: e.Actor.Kind + ":" + e.Actor.ID, Capability: e.CapabilityID, Surface: e.Surface})
		}
		if page.Next == 0 {
			break
		}
		q.Before = page.Next
	}
	return out, nil
}

func writePolicyTest(w io.Writer, st style, r *policyTest, since time.Duration, all bool) {
	now := "no set in force"
	if r.InForce > 0 {
		now = fmt.Sprintf("v%d in force", r.InForce)
	}
	fmt.Fprintf(w, "%s: %s, valid against the catalog's schemas; compared with %s.\n", r.File, plural(r.Rules, "policy", "policies"), now)
	section := func(title string, outs []policies.Outcome, recorded bool) {
		changed := 0
		for _, o := range outs {
			if o.Changed {
				changed++
			}
		}
		fmt.Fprintf(w, "\n%s: %s; %d would change.\n", st.bold(title), plural(len(outs), "decision", "decisions"), changed)
		t := newTable(w, st, "CALL", "CAPABILITY", "PRINCIPAL", "ACTOR", "NOW", "WITH "+r.File, "BY", "")
		rows := 0
		for _, o := range outs {
			if !all && !o.Changed && !o.Unexpected {
				continue
			}
			rows++
			call := o.Case.Name
			if recorded {
				call = o.Case.ExecutionID + " (" + o.Case.Recorded + ")"
			}
			note := ""
			switch {
			case o.Unexpected:
				note = "expected " + o.Case.Expect
			case o.NeedsInput:
				note = "needs the input, which the trail does not keep"
			}
			by := o.With.Policy
			if by == "" {
				by = "-"
			}
			t.row(call, o.Case.Capability, o.Case.Principal, o.Case.Actor, o.Now.Word(), o.With.Word(), by, note)
		}
		if rows > 0 {
			t.flush()
		}
	}
	section(fmt.Sprintf("Executions recorded in the last %s", short(since)), r.Recorded, true)
	if len(r.Cases) > 0 {
		section("Cases", r.Cases, false)
	}
	if r.NeedInput > 0 {
		fmt.Fprintf(w, "\n%s could not be decided without their input, which the trail does not keep (it holds its hash): test them with a file of cases.\n",
			plural(r.NeedInput, "call", "calls"))
	}
	if r.Failed > 0 {
		fmt.Fprintf(w, "\n%s not decided as expected.\n", plural(r.Failed, "case", "cases"))
	}
}

func runPolicyShow(args []string) int {
	fs, conn, o := newConnFlags("policy show", "[--version N]")
	version := fs.Int("version", 0, "show this `version` (default: the one in force)")
	ctx, nc, kv, done, code := openPolicies(conn, fs, args, o)
	if done == nil {
		return code
	}
	defer done()
	n := *version
	if n == 0 && kv != nil {
		cur, _, err := policies.ReadCurrent(ctx, nc, kv)
		if err != nil {
			return fail(exitFailed, "policy show: %v", err)
		}
		n = cur.Version
	}
	if n == 0 || kv == nil {
		if o.isJSON() {
			return printJSON(nil)
		}
		fmt.Println("No Cedar policy set is in force: calls are decided by the Go policies alone.")
		return exitOK
	}
	v, err := policies.ReadVersion(ctx, nc, kv, n)
	if err != nil {
		return fail(exitFailed, "policy show: %v", err)
	}
	return o.print(v, func(w io.Writer, st style) {
		fmt.Fprintf(w, "// v%d, from %s: %s (sha256 %s)\n// applied by %s at %s: %s\n", v.Version, v.File,
			plural(v.Rules, "policy", "policies"), v.SHA256, who(v.By, v.Operator), v.At.Format(time.RFC3339), v.Reason)
		fmt.Fprint(w, v.Text)
	})
}

func runPolicyHistory(args []string) int {
	fs, conn, o := newConnFlags("policy history", "")
	ctx, nc, kv, done, code := openPolicies(conn, fs, args, o)
	if done == nil {
		return code
	}
	defer done()
	var list []*policies.Version
	cur := &policies.Current{}
	if kv != nil {
		var err error
		if list, err = policies.History(ctx, nc, kv); err == nil {
			cur, _, err = policies.ReadCurrent(ctx, nc, kv)
		}
		if err != nil {
			return fail(exitFailed, "policy history: %v", err)
		}
	}
	if list == nil {
		list = []*policies.Version{}
	}
	return o.print(list, func(w io.Writer, st style) {
		if len(list) == 0 {
			fmt.Fprintln(w, "No policy set was ever applied.")
			return
		}
		t := newTable(w, st, "VERSION", "", "POLICIES", "FILE", "APPLIED", "BY", "REASON")
		for _, v := range list {
			mark := ""
			if v.Version == cur.Version {
				mark = "in force"
			}
			t.row("v"+strconv.Itoa(v.Version), mark, strconv.Itoa(v.Rules), v.File, ago(st.now, v.At), who(v.By, v.Operator), clip(v.Reason, 50))
		}
		t.flush()
		if cur.Version == 0 {
			fmt.Fprintf(w, "None is in force (removed %s by %s: %s).\n", ago(st.now, cur.At), who(cur.By, cur.Operator), cur.Reason)
		}
	})
}

func runPolicySchema(args []string) int {
	fs := newFlags("policy schema", "")
	conn := addConnFlags(fs)
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	js, ctx, done, err := conn.openJS("policy", submitTimeout)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	catalog, err := policyCatalog(ctx, js)
	if err != nil {
		return fail(exitFailed, "policy schema: %v", err)
	}
	fmt.Print(policies.Schema(catalog))
	return exitOK
}
