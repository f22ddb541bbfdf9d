package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
)

// approvalsCommands are the subcommands of `capstan approvals`.
var approvalsCommands = []command{
	{"list", "list approvals, a page at a time (each requester oldest first, in turns)", runApprovalsList},
	{"show", "print one approval", runApprovalsShow},
	{"approve", "approve a pending approval (and resume it with --resume)", runApprovalsApprove},
	{"reject", "reject a pending approval", runApprovalsReject},
}

func runApprovals(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		out := os.Stderr
		if len(args) > 0 {
			out = os.Stdout
		}
		fmt.Fprintf(out, "usage: capstan approvals <command> [arguments]\n\ncommands:\n")
		for _, c := range approvalsCommands {
			fmt.Fprintf(out, "  %-8s %s\n", c.name, c.summary)
		}
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range approvalsCommands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	return usageError("unknown command 'approvals %s'; run 'capstan approvals help'", args[0])
}

// approvalView is an approval as the CLI prints it: its status as of now, so
// that an approval past its expiry shows expired even before it is marked so,
// and, when the capability redacts what approvers see, the display in place
// of the input.
func approvalView(r *approvals.Record) *approvals.Record {
	v := *r
	v.Status = r.StatusAt(time.Now())
	if len(v.Display) > 0 {
		v.Input = nil
	}
	return &v
}

// approvalsPage is a page of approvals as `approvals list -o json` prints it.
type approvalsPage struct {
	Records []*approvals.Record `json:"records"`
	// Next is the --cursor of the next page; "" when nothing more matches.
	Next string `json:"next,omitempty"`
	// Trimmed names the records sent without their input: alone, too large
	// for a reply.
	Trimmed []string `json:"trimmed,omitempty"`
}

func runApprovalsList(args []string) int {
	fs, conn, o := newConnFlags("approvals list", "[--status S] [--capability CAP] [--actor kind:id] [--newest] [--limit N] [--cursor C] [-o json]")
	status := fs.String("status", "", "only approvals with this status as of now: pending, approved, rejected, expired, cancelled, consumed; or decided (any but pending)")
	capID := fs.String("capability", "", "only approvals of this capability")
	actor := fs.String("actor", "", "only approvals requested by this actor, as kind:id")
	newest := fs.Bool("newest", false, "each requester's newest approvals first (default: oldest first)")
	limit := fs.Int("limit", approvalsrpc.DefaultPageSize, fmt.Sprintf("how many approvals a page shows (at most %d)", approvalsrpc.MaxPageSize))
	cursor := fs.String("cursor", "", "where the page begins: the cursor the previous page printed")
	if _, code, ok := parseOutput(fs, args, 0, o); !ok {
		return code
	}
	req := approvals.ListRequest{Status: approvals.Status(*status), CapabilityID: *capID, Newest: *newest, Limit: *limit, Cursor: *cursor}
	switch req.Status {
	case "", approvals.StatusPending, approvals.StatusApproved, approvals.StatusRejected, approvals.StatusExpired, approvals.StatusCancelled, approvals.StatusConsumed:
	case "decided":
		req.Status, req.Decided = "", true
	default:
		return usageError("--status %q: want pending, approved, rejected, expired, cancelled, consumed or decided", *status)
	}
	if *limit <= 0 || *limit > approvalsrpc.MaxPageSize {
		return usageError("--limit %d: want 1 to %d", *limit, approvalsrpc.MaxPageSize)
	}
	if *actor != "" {
		a, err := parseKindID("--actor", *actor)
		if err != nil {
			return usageError("%v", err)
		}
		req.Actor = a
	}
	nc, ctx, done, err := conn.open("approvals", "list approvals", names.ListApprovalsSubject, "")
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	page, err := approvalsrpc.List(ctx, nc, broker.NewNames(""), req)
	if err != nil {
		return requestError(err)
	}
	out := approvalsPage{Records: make([]*approvals.Record, 0, len(page.Records)), Next: page.Next, Trimmed: page.Trimmed}
	for _, r := range page.Records {
		out.Records = append(out.Records, approvalView(r))
	}
	return o.print(out, func(w io.Writer, st style) {
		writeApprovalList(w, st, out.Records)
		if len(out.Trimmed) > 0 {
			fmt.Fprintf(w, "%s\n", st.dim("Shown without their input (too large for one reply): "+strings.Join(out.Trimmed, ", ")))
		}
		if out.Next != "" {
			fmt.Fprintf(w, "%s\n", st.dim("More: "+nextCommand([]string{"approvals", "list"}, args, out.Next)))
		}
	})
}

func runApprovalsShow(args []string) int {
	fs, conn, o := newConnFlags("approvals show", "ID [-o json]")
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	nc, ctx, done, err := conn.open("approvals", "read approvals", names.ListApprovalsSubject, "")
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	id, err := resolveApproval(ctx, nc, pos[0])
	if err != nil {
		return usageError("%v", err)
	}
	rec, err := approvalsrpc.One(ctx, nc, broker.NewNames(""), id)
	if errors.Is(err, approvals.ErrNotFound) || errors.Is(err, approvals.ErrForbidden) {
		return fail(exitFailed, "%v", err)
	}
	if err != nil {
		return requestError(err)
	}
	return printApproval(o, approvalView(rec))
}

// printApproval prints one approval as o says.
func printApproval(o *outputFlags, r *approvals.Record) int {
	return o.print(r, func(w io.Writer, st style) { writeApproval(w, st, r) })
}

func runApprovalsApprove(args []string) int { return decideCommand("approve", args) }
func runApprovalsReject(args []string) int  { return decideCommand("reject", args) }

// decideCommand sends one decision to the workers, who record and audit it.
// With --creds the approver is the principal the server authenticated; on an
// open server (no --creds) --approver names it. approve --resume then resumes
// the call and prints the resume's envelope instead of the approval.
func decideCommand(verb string, args []string) int {
	usage := "ID [--creds APPROVER.creds | --approver kind:id] [--comment C] [-o json]"
	if verb == "approve" {
		usage += " [--self-approval REASON] [--resume [--wait D]]"
	}
	fs, conn, o := newConnFlags("approvals "+verb, usage)
	approver := fs.String("approver", "", "on an open server only: who decides, as kind:id (not the requester); with --creds the approver is the principal")
	comment := fs.String("comment", "", "a comment kept with the decision and shown to the handler")
	var self *string
	var resume *bool
	var wait *time.Duration
	if verb == "approve" {
		self = fs.String("self-approval", "", "on an open server only: lets the requester approve their own call; the `reason` is recorded")
		resume = fs.Bool("resume", false, "on an open server only: resume the approved call at once and print its envelope")
		wait = fs.Duration("wait", 30*time.Second, "with --resume, how long to wait for the envelope")
	}
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	req := approvalsrpc.DecideRequest{ApprovalID: pos[0], Approve: verb == "approve", Comment: *comment}
	if conn.creds != "" {
		if *approver != "" || (self != nil && *self != "") {
			return usageError("approvals %s: with --creds the approver is the principal the server authenticated; "+
				"--approver and --self-approval are for open servers only", verb)
		}
		if resume != nil && *resume {
			return usageError("approvals approve: --resume is for open servers; the requester resumes with 'capstan resume ID --creds REQUESTER.creds'")
		}
	} else {
		if *approver == "" {
			return usageError("approvals %s: give --creds APPROVER.creds, or --approver kind:id on an open server", verb)
		}
		who, err := parseKindID("--approver", *approver)
		if err != nil {
			return usageError("%v", err)
		}
		req.Approver = who
		if self != nil {
			req.SelfApproval = *self
		}
	}
	if wait != nil && *wait <= 0 {
		return usageError("--wait must be positive")
	}
	nc, ctx, done, err := conn.open("approvals", "decide approvals", names.DecideSubject, "only approvers decide")
	if err != nil {
		return usageError("%v", err)
	}
	defer done()
	if req.ApprovalID, err = resolveApproval(ctx, nc, req.ApprovalID); err != nil {
		return usageError("%v", err)
	}
	r, err := approvalsrpc.Decide(ctx, nc, names, req)
	switch {
	case err != nil && r != nil && errors.Is(err, audit.ErrUnavailable):
		// The decision stands; only its audit event is missing.
		fmt.Fprintf(os.Stderr, "capstan: warning: %v\n", strings.TrimPrefix(err.Error(), "capstan: "))
	case errors.Is(err, approvals.ErrSelfApproval):
		return selfApprovalError(verb, req, conn.creds != "")
	case err != nil:
		return decisionError(err)
	}
	if resume == nil || !*resume {
		return printApproval(o, approvalView(r))
	}
	c, closeClient, err := conn.client("approvals", executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()
	fmt.Fprintf(os.Stderr, "capstan: approval %s approved by %s; resuming\n", r.ID, r.Decision.Approver)
	return resumeAndAwait(c, o, r.ID, *wait)
}

// selfApprovalError reports a decision refused because its approver requested
// the call, and the ways out: another approver decides; on an open server the
// requester may approve with a reason, recorded with the decision. With
// credentials no reason lifts it.
func selfApprovalError(verb string, req approvalsrpc.DecideRequest, creds bool) int {
	code, id := envelope.CodeApprovalSelfApproval, req.ApprovalID
	switch {
	case creds:
		return fail(exitFailed, "%s: the call of approval %s was requested by these credentials' principal or the actor they decide as, "+
			"and with credentials no one decides their own call; an approver with other credentials decides it: 'capstan approvals %s %s --creds APPROVER.creds'", code, id, verb, id)
	case verb == "approve":
		return fail(exitFailed, "%s: %s requested the call of approval %s; another approver decides it (--approver naming someone else), "+
			"or the requester approves it with a reason, recorded with the decision: 'capstan approvals approve %s --approver %s --self-approval REASON'",
			code, req.Approver, id, id, req.Approver)
	}
	return fail(exitFailed, "%s: %s requested the call of approval %s; another approver decides it (--approver naming someone else)", code, req.Approver, id)
}

// decisionError reports a refused decision with its code.
func decisionError(err error) int {
	switch {
	case errors.Is(err, approvals.ErrInvalid):
		return usageError("%v", err)
	case errors.Is(err, approvals.ErrNotFound):
		return fail(exitFailed, "%v", err)
	case errors.Is(err, nats.ErrNoResponders):
		return fail(exitUsage, "no worker serves decisions (is a worker running?)")
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return fail(exitUsage, "no answer to the decision: not an approver (the server refuses decisions from other principals), or no worker running")
	}
	if code := approvalstore.Code(err); code != "" {
		return fail(exitFailed, "%s: %v", code, strings.TrimPrefix(err.Error(), "capstan: "))
	}
	return requestError(err)
}

func runResume(args []string) int {
	fs, conn, o := newConnFlags("resume", "APPROVAL_ID [--wait D] [-o json]")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the envelope")
	pos, code, ok := parseOutput(fs, args, 1, o)
	if !ok {
		return code
	}
	if *wait <= 0 {
		return usageError("--wait must be positive")
	}
	if err := conn.need("resume approved calls", names.UnroutedSubject, "the producer that asked for the approval resumes it"); err != nil {
		return usageError("%v", err)
	}
	c, closeClient, err := conn.client("resume", executor.ClientConfig{})
	if err != nil {
		return usageError("%v", err)
	}
	defer closeClient()
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	id, err := resolveApproval(ctx, c.Conn(), pos[0])
	cancel()
	if err != nil {
		return usageError("%v", err)
	}
	return resumeAndAwait(c, o, id, *wait)
}

// resumeAndAwait opens the resume's execution, as the approval's requester,
// and prints its envelope.
func resumeAndAwait(c *executor.Client, o *outputFlags, approvalID string, wait time.Duration) int {
	ctx, interrupted, cancel := waitContext(wait)
	defer cancel()
	id, err := c.SubmitResume(ctx, approvalID)
	switch {
	case errors.Is(err, approvals.ErrNotFound):
		return fail(exitFailed, "%v", err)
	case errors.Is(err, approvals.ErrInputMismatch):
		return fail(exitFailed, "%s: %v", envelope.CodeApprovalInputMismatch, err)
	case err != nil:
		return usageError("%v", err)
	}
	show := newProgressShow(o, &progressFlags{})
	stopWaiting := waitingFor("the envelope of "+id, wait, show)
	env, err := c.Await(show.context(ctx), id)
	stopWaiting()
	if err != nil {
		return awaitError(err, id, wait, interrupted())
	}
	return printEnvelope(o, env)
}

// parseKindID reads an actor flag as kind:id, both required.
func parseKindID(flag, s string) (envelope.Actor, error) {
	kind, id, ok := strings.Cut(s, ":")
	if !ok || kind == "" || id == "" {
		return envelope.Actor{}, fmt.Errorf("%s %q: want kind:id, e.g. user:bob", flag, s)
	}
	return envelope.Actor{Kind: kind, ID: id}, nil
}
