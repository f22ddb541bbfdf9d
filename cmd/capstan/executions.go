package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/execrpc"
)

func runExecutions(args []string) int {
	fs, conn, o := newConnFlags("executions", "[--capability C] [--status S] [--actor A] [--principal P] [--since D] [--until D] [--limit N] [--cursor C] [-o json]")
	var q audit.Query
	fs.StringVar(&q.CapabilityID, "capability", "", "only this capability `id`, or the ids a prefix ending in * begins (orders.*)")
	fs.StringVar(&q.Status, "status", "", "only executions in this `status`: "+strings.Join(audit.EntryStatuses, ", "))
	fs.StringVar(&q.Actor, "actor", "", "only this actor: kind:id, or an id of any kind")
	fs.StringVar(&q.Principal, "principal", "", "only this principal's executions (an admin's filter: a producer sees its own)")
	var since, until longDuration
	fs.Var(&since, "since", "only executions that changed within this `duration` (e.g. 15m, 36h, 7d)")
	fs.Var(&until, "until", "only executions that last changed longer ago than this `duration`")
	fs.IntVar(&q.Limit, "limit", 20, "how many executions a page shows (at most 500)")
	cursor := fs.String("cursor", "", "where the page begins: the cursor the previous page printed")
	if _, code, ok := parseOutput(fs, args, 0, o); !ok {
		return code
	}
	if q.Status != "" && !contains(audit.EntryStatuses, q.Status) {
		return usageError("--status %q: want one of %s", q.Status, strings.Join(audit.EntryStatuses, ", "))
	}
	if q.Limit <= 0 || q.Limit > audit.MaxLimit {
		return usageError("--limit %d: want 1 to %d", q.Limit, audit.MaxLimit)
	}
	now := time.Now()
	if since > 0 {
		q.Since = now.Add(-time.Duration(since))
	}
	if until > 0 {
		q.Until = now.Add(-time.Duration(until))
	}
	nc, ctx, done, err := conn.open("executions", "list executions", names.ListExecutionsSubject, reissue)
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	page, err := listExecutions(ctx, nc, conn, executor.ExecutionsRequest{Query: q, Cursor: *cursor})
	if err != nil {
		return readError(err)
	}
	return o.print(page, func(w io.Writer, st style) {
		writeExecutionList(w, st, page, nextCommand([]string{"executions"}, args, page.Next))
	})
}

// listExecutions asks the workers for a page; with no worker answering, a
// connection that may read the index itself (an admin's, an open server's)
// reads it.
func listExecutions(ctx context.Context, nc *nats.Conn, conn *connFlags, req executor.ExecutionsRequest) (*executor.ExecutionsPage, error) {
	req.V = envelope.Version
	page, err := execrpc.Ask[executor.ExecutionsPage](ctx, nc, names, names.ListExecutionsSubject, &req, "list executions")
	if !errors.Is(err, executor.ErrNoWorkers) || !conn.principal().may(streamInfo(names.IndexStream())("")) {
		return page, err
	}
	b, oerr := broker.OpenAll(ctx, nc, broker.Config{})
	if oerr != nil || b.Index == nil {
		return nil, err
	}
	q := req.Query
	if req.Cursor != "" {
		if oerr = q.SetCursor(req.Cursor); oerr != nil {
			return nil, fmt.Errorf("--%w", oerr)
		}
	}
	if q.Limit <= 0 {
		q.Limit = audit.DefaultLimit
	}
	entries, scanned, next, err := execrpc.ListWithQueued(ctx, b, q, req.Cursor == "")
	if err != nil {
		return nil, err
	}
	return &executor.ExecutionsPage{V: envelope.Version, Entries: entries, Next: next, Scanned: scanned, Scope: executor.ScopeAll}, nil
}

// nextCommand is the command line (capstan, then cmd's words, then args)
// that shows the page after this one.
func nextCommand(cmd, args []string, next string) string {
	if next == "" {
		return ""
	}
	var kept []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--cursor" || a == "-cursor":
			i++
			continue
		case strings.HasPrefix(a, "--cursor=") || strings.HasPrefix(a, "-cursor="):
			continue
		}
		kept = append(kept, shellQuote(a))
	}
	words := append(append([]string{"capstan"}, cmd...), kept...)
	return strings.Join(append(words, "--cursor", next), " ")
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readError reports a reading the workers refused or could not answer.
func readError(err error) int {
	switch {
	case errors.Is(err, executor.ErrNotAllowed):
		return fail(exitUsage, "%v", err)
	case errors.Is(err, executor.ErrNoSuchExecution):
		return fail(exitUnknown, "%v", err)
	case errors.Is(err, executor.ErrNoWorkers):
		return fail(exitUsage, "%v: no worker answers listings and readings (start one with 'capstan worker', or 'capstan dev')", err)
	}
	return requestError(err)
}

// requestError reports a request the workers refused or could not answer:
// a quota's refusal fails (exit 1), naming the quota and when to try again;
// anything else is a usage or connection error.
func requestError(err error) int {
	if errors.Is(err, envelope.ErrQuotaExceeded) {
		return fail(exitFailed, "%v", err)
	}
	return usageError("%v", err)
}

// minPrefix is the shortest id prefix resolved: eight hex digits of a
// UUIDv7 name its time within about a minute.
const minPrefix = 8

// prefixTimes returns the times a UUIDv7 prefix's digits allow: the earliest
// and the latest its id may have been made at; ok is false for anything that
// is not such a prefix (a whole id, an id of a caller's own).
func prefixTimes(prefix string) (lo, hi time.Time, ok bool) {
	if len(prefix) < minPrefix || len(prefix) >= 36 {
		return time.Time{}, time.Time{}, false
	}
	var hex strings.Builder
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case c == '-' && (i == 8 || i == 13 || i == 18 || i == 23):
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
			hex.WriteByte(c)
		default:
			return time.Time{}, time.Time{}, false
		}
	}
	h := hex.String()
	if len(h) > 12 {
		h = h[:12]
	}
	low, err1 := strconv.ParseInt(h+strings.Repeat("0", 12-len(h)), 16, 64)
	high, err2 := strconv.ParseInt(h+strings.Repeat("f", 12-len(h)), 16, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, time.Time{}, false
	}
	return time.UnixMilli(low), time.UnixMilli(high), true
}

// resolveExecution turns a unique prefix of an execution id into the id, as
// git does: an ambiguous one is an error listing the candidates. Anything
// that is not a UUIDv7 prefix, or that no execution begins with, is taken as
// it is (an id of the caller's own). Prefixes are looked for among the
// executions the principal may see, that began within an hour of the time
// the prefix names.
func resolveExecution(ctx context.Context, nc *nats.Conn, conn *connFlags, arg string) (string, error) {
	lo, hi, ok := prefixTimes(arg)
	if !ok {
		return arg, nil
	}
	req := executor.ExecutionsRequest{Query: audit.Query{IDPrefix: arg, Since: lo.Add(-5 * time.Second),
		Until: hi.Add(time.Hour), Limit: 10}}
	if !conn.principal().may(names.ListExecutionsSubject(conn.principal().name)) {
		return arg, nil
	}
	page, err := listExecutions(ctx, nc, conn, req)
	if err != nil {
		// A prefix (prefixTimes takes nothing as long as an id) taken as
		// given would name nothing, and the command would answer for an
		// execution that is not the one meant.
		return "", fmt.Errorf("%q reads as the beginning of an execution id, and the executions to find it among could not be listed: %w", arg, err)
	}
	var found []audit.Entry
	for _, e := range page.Entries {
		if !containsEntry(found, e.ExecutionID) {
			found = append(found, e)
		}
	}
	return onePrefixed(arg, "executions", found, func(e audit.Entry) (string, string) {
		return e.ExecutionID, fmt.Sprintf("%s  %s  %s  %s", e.ExecutionID, e.CapabilityID, e.Status, e.UpdatedAt.UTC().Format(time.RFC3339))
	})
}

// onePrefixed is the id of the one of found, arg as it is when found is
// empty, and an error listing found when arg begins several (what they
// are); describe gives each one's id and its line in the list.
func onePrefixed[T any](arg, what string, found []T, describe func(T) (id, line string)) (string, error) {
	switch len(found) {
	case 0:
		return arg, nil
	case 1:
		id, _ := describe(found[0])
		return id, nil
	}
	var b strings.Builder
	for _, f := range found {
		_, line := describe(f)
		b.WriteString("\n  " + line)
	}
	return "", fmt.Errorf("%w: %q begins %d %s:%s", executor.ErrAmbiguousID, arg, len(found), what, b.String())
}

func containsEntry(list []audit.Entry, id string) bool {
	for _, e := range list {
		if e.ExecutionID == id {
			return true
		}
	}
	return false
}

// resolveApproval turns a unique prefix of an approval id into the id,
// among the approvals the principal may see.
func resolveApproval(ctx context.Context, nc *nats.Conn, arg string) (string, error) {
	if _, _, ok := prefixTimes(arg); !ok {
		return arg, nil
	}
	// The pages of what the principal may see, until a second match.
	var found []*approvals.Record
	for req := (approvals.ListRequest{Limit: approvalsrpc.MaxPageSize}); len(found) < 2; {
		page, err := approvalsrpc.List(ctx, nc, names, req)
		if err != nil {
			return arg, nil
		}
		for _, r := range page.Records {
			if strings.HasPrefix(r.ID, arg) {
				found = append(found, r)
			}
		}
		if page.Next == "" {
			break
		}
		req.Cursor = page.Next
	}
	return onePrefixed(arg, "approvals", found, func(r *approvals.Record) (string, string) {
		return r.ID, fmt.Sprintf("%s  %s  %s", r.ID, r.CapabilityID, r.StatusAt(time.Now()))
	})
}

func writeExecutionList(w io.Writer, st style, page *executor.ExecutionsPage, next string) {
	if len(page.Entries) == 0 {
		fmt.Fprintln(w, "No executions.")
		if next != "" {
			fmt.Fprintf(w, "Older ones may match: %s\n", next)
		}
		return
	}
	header := []string{"EXECUTION", "STATUS", "CAPABILITY", "ACTOR", "WHEN", "ATTEMPTS"}
	all := page.Scope != executor.ScopeOwn
	if all {
		header = append(header, "PRINCIPAL")
	}
	t := newTable(w, st, header...)
	for _, e := range page.Entries {
		status := st.status(e.Status)
		if e.Code != "" {
			status += " " + e.Code
		}
		attempts := "-"
		if e.Attempts > 0 {
			attempts = strconv.Itoa(e.Attempts)
		}
		row := []string{e.ExecutionID, status, e.CapabilityID, e.Actor.Kind + ":" + e.Actor.ID, ago(st.now, e.UpdatedAt), attempts}
		if all {
			row = append(row, e.Principal)
		}
		t.row(row...)
	}
	t.flush()
	if next != "" {
		fmt.Fprintf(w, "%s\n", st.dim("Older: "+next))
	}
}
