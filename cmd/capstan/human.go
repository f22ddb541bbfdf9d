package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/execution"
	"github.com/capstan-dev/capstan/executor"
)

// How the commands print for a person. Each writer takes the style (colour,
// and the moment ages count from) so that tests can pin both.

// table writes aligned columns, two spaces apart. Widths count what shows:
// a painted cell's escape sequences take no room.
type table struct {
	w    io.Writer
	rows [][]string
}

func newTable(w io.Writer, st style, header ...string) *table {
	t := &table{w: w}
	for i := range header {
		header[i] = st.bold(header[i])
	}
	t.rows = append(t.rows, header)
	return t
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) flush() {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], visible(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-visible(c)+2))
			}
		}
		fmt.Fprintln(t.w, strings.TrimRight(b.String(), " "))
	}
}

// visible is how many runes of s show: escape sequences take none.
func visible(s string) int {
	n := 0
	for i := 0; i < len(s); {
		if s[i] == 0x1b {
			j := strings.IndexByte(s[i:], 'm')
			if j < 0 {
				break
			}
			i += j + 1
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return n
}

// fields writes "Name  value" lines, the values aligned.
type fields struct{ t *table }

func newFields(w io.Writer) *fields { return &fields{&table{w: w}} }

func (f *fields) add(_ style, name, value string) {
	if value != "" {
		f.t.row(name, value)
	}
}

func (f *fields) flush() { f.t.flush() }

// ago says how long before now t was, or how long after: "3m ago", "in 12m".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

// short rounds a duration to its largest unit: 45s, 12m, 3h, 2d.
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

// stamp is a moment in UTC, to the second, with its age.
func stamp(st style, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z") + st.dim(" ("+ago(st.now, t)+")")
}

// clip keeps the first n runes of s.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func writeApprovalList(w io.Writer, st style, list []*approvals.Record) {
	if len(list) == 0 {
		fmt.Fprintln(w, "No approvals.")
		return
	}
	t := newTable(w, st, "ID", "STATUS", "CAPABILITY", "REQUESTER", "REQUESTED", "EXPIRES", "REASONS")
	for _, r := range list {
		expires := ago(st.now, r.ExpiresAt)
		if r.Status != approvals.StatusPending && r.Status != approvals.StatusApproved {
			expires = "-"
		}
		reasons := clip(strings.Join(r.Reasons, "; "), 60)
		if reasons == "" {
			reasons = "-"
		}
		t.row(r.ID, st.status(string(r.Status)), r.CapabilityID, r.Actor.String(), ago(st.now, r.RequestedAt), expires, reasons)
	}
	t.flush()
}

func writeApproval(w io.Writer, st style, r *approvals.Record) {
	f := newFields(w)
	f.add(st, "Approval", st.bold(r.ID))
	status := st.status(string(r.Status))
	if d := r.Decision; d != nil {
		if d.Status != r.Status {
			status += "; " + string(d.Status)
		}
		status += " by " + d.Approver.String() + st.dim(" ("+ago(st.now, d.DecidedAt)+")")
		if d.Comment != "" {
			status += ": " + strconv.Quote(d.Comment)
		}
	}
	f.add(st, "Status", status)
	what := r.CapabilityID
	if details := strings.Join(nonEmpty(r.SideEffect, riskWord(r.Risk)), ", "); details != "" {
		what += " (" + details + ")"
	}
	f.add(st, "Capability", what)
	f.add(st, "Requester", r.Actor.String())
	f.add(st, "Requested", stamp(st, r.RequestedAt))
	if r.Status == approvals.StatusPending || r.Status == approvals.StatusApproved {
		f.add(st, "Expires", stamp(st, r.ExpiresAt))
	}
	f.add(st, "Reasons", strings.Join(r.Reasons, "; "))
	f.add(st, "Types", strings.Join(r.Types, ", "))
	if len(r.Display) > 0 {
		f.add(st, "Input (shown)", clip(string(r.Display), 200))
	} else {
		f.add(st, "Input", clip(string(r.Input), 200))
	}
	f.add(st, "Input hash", r.InputHash)
	f.add(st, "Requested by", r.RequestedBy)
	if d := r.Decision; d != nil && d.SelfApproval != "" {
		f.add(st, "Self-approval", d.SelfApproval)
	}
	if r.ConsumedBy != "" {
		f.add(st, "Consumed by", r.ConsumedBy+st.dim(" ("+ago(st.now, r.ConsumedAt)+")"))
	}
	f.flush()
}

func nonEmpty(s ...string) []string {
	return slices.DeleteFunc(s, func(v string) bool { return v == "" })
}

func riskWord(r string) string {
	if r == "" {
		return ""
	}
	return "risk " + r
}

// heldBack reports whether rec is claimed and given back to its queue (an
// operator's pause, a limit's wait): it names no worker.
func heldBack(rec *execution.Record) bool {
	return rec != nil && rec.State == execution.StateClaimed && rec.Worker == ""
}

func writeStatus(w io.Writer, st style, s *executor.ExecutionStatus) {
	f := newFields(w)
	rec, env := s.Record, s.Envelope
	id, capID := "", ""
	if rec != nil {
		id, capID = rec.ExecutionID, rec.CapabilityID
	}
	if env != nil {
		id, capID = env.ExecutionID, env.CapabilityID
	}
	f.add(st, "Execution", st.bold(id))
	f.add(st, "Capability", capID)
	switch {
	case env != nil:
		f.add(st, "Status", st.status(string(env.Status)))
		if e := env.Error; e != nil {
			f.add(st, "Error", errorLine(st, e))
			if e.Stage != "" {
				f.add(st, "Stage", e.Stage)
			}
		}
		f.add(st, "Attempts", strconv.Itoa(env.Attempts))
		addEnd(f, st, env)
		if a := env.Approval; a != nil {
			f.add(st, "Approval", a.ID+st.dim(" (expires "+ago(st.now, a.ExpiresAt)+")"))
			f.add(st, "Reasons", strings.Join(a.Reasons, "; "))
		}
		if len(env.Output) > 0 {
			if out, err := env.Output.MarshalJSON(); err == nil {
				f.add(st, "Output", clip(string(out), 200))
			}
		}
	case heldBack(rec):
		// Given back to its queue by a pause or a limit: no worker holds
		// it, and its lease is the give-back's, not a lost worker's.
		note := " (given back: a pause or a limit holds it)"
		if rec.CancelRequested {
			note += ", cancel requested"
		}
		f.add(st, "Status", st.status("queued")+st.dim(note))
	case rec != nil:
		state := string(rec.State)
		if rec.Attempt > 0 {
			state += " (attempt " + strconv.Itoa(rec.Attempt) + ")"
		}
		if rec.CancelRequested {
			state += ", cancel requested"
		}
		f.add(st, "Status", st.status(string(rec.State))+strings.TrimPrefix(state, string(rec.State)))
		f.add(st, "Last error", string(rec.LastError))
		if p := rec.Progress; p != nil && rec.State == execution.StateRunning {
			// As of the lease's last renewal: 'capstan await ID' shows it live.
			f.add(st, "Progress", clip(progressText(p), 120)+st.dim(" ("+ago(st.now, p.At)+")"))
		}
	}
	if rec != nil {
		f.add(st, "Worker", rec.Worker)
		if env == nil && !heldBack(rec) {
			f.add(st, "Lease until", stamp(st, rec.LeaseUntil))
			f.add(st, "Attempt start", stamp(st, rec.StartedAt))
		}
		f.add(st, "Created", stamp(st, rec.CreatedAt))
		f.add(st, "Approval id", rec.ApprovalID)
		f.add(st, "Cause", st.dim(rec.Cause))
	}
	f.flush()
}

func writeDiscovery(w io.Writer, st style, d *executor.Discovery) {
	if len(d.Capabilities) == 0 {
		fmt.Fprintf(w, "No capabilities visible on surface %s.\n", d.Surface)
		return
	}
	t := newTable(w, st, "CAPABILITY", "SIDE EFFECT", "RISK", "RETRY", "APPROVAL", "POOL", "DESCRIPTION")
	for _, c := range d.Capabilities {
		retry := "-"
		if c.RetryMaxAttempts > 0 {
			retry = strconv.Itoa(c.RetryMaxAttempts)
		}
		approval := "-"
		switch {
		case c.RequiresApproval:
			approval = "required"
		case len(c.ApprovalPolicies) > 0:
			approval = "may (" + strings.Join(c.ApprovalPolicies, ", ") + ")"
		}
		risk := string(c.Risk)
		if risk == "" {
			risk = "-"
		}
		t.row(c.ID, string(c.SideEffect), risk, retry, approval, c.Pool, clip(c.Description, 70))
	}
	t.flush()
	fmt.Fprintf(w, "%s on surface %s; digest %s\n", plural(len(d.Capabilities), "capability", "capabilities"),
		d.Surface, st.dim(d.Digest))
	var unclaimed []string
	for _, c := range d.Capabilities {
		if c.Unclaimed {
			unclaimed = append(unclaimed, c.ID)
		}
	}
	if len(unclaimed) > 0 {
		fmt.Fprintf(w, "%s %s (a run lost with its worker runs again)\n", st.bold("Reads without claims:"), strings.Join(unclaimed, ", "))
	}
	for _, c := range d.Capabilities {
		if p := c.Paused; p != nil {
			what := "its calls wait in their queue"
			if p.Refuse {
				what = "its calls end PAUSED"
			}
			fmt.Fprintf(w, "%s %s, since %s: %s (%s)\n", st.bold("Paused by an operator:"), c.ID, ago(st.now, p.Since), p.Reason, what)
		}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// auditLine writes one event on one line: time, type, actor, worker, and its
// data as key=value, sorted. withExecution adds the execution and capability
// (when following the stream, events of many executions interleave).
func auditLine(w io.Writer, st style, ev *audit.Event, withExecution bool) error {
	var b strings.Builder
	b.WriteString(st.dim(ev.Timestamp.UTC().Format("2006-01-02 15:04:05.000Z")))
	b.WriteString("  ")
	if withExecution {
		b.WriteString(ev.ExecutionID)
		b.WriteString("  ")
		b.WriteString(pad(ev.CapabilityID, 16))
		b.WriteString("  ")
	}
	b.WriteString(st.status(ev.Type) + strings.Repeat(" ", max(0, 30-len(ev.Type))))
	actor := ev.Actor.Kind + ":" + ev.Actor.ID
	if ev.Actor.Kind == "" && ev.Actor.ID == "" {
		actor = "-"
	}
	b.WriteString(pad(actor, 16))
	if ev.Worker != "" {
		b.WriteString("  " + st.dim("worker="+ev.Worker))
	}
	for _, k := range slices.Sorted(maps.Keys(ev.Data)) {
		if v, ok := ev.Data[k].(string); ok && v == "" {
			continue // nothing to say: a started event's approvalId without an approval
		}
		b.WriteString("  " + k + "=" + dataValue(ev.Data[k]))
	}
	_, err := io.WriteString(w, strings.TrimRight(b.String(), " ")+"\n")
	return err
}

func pad(s string, n int) string {
	if len(s) >= n {
		return s
	}
	return s + strings.Repeat(" ", n-len(s))
}

// finalizedLine says when an envelope was written and by which worker: ""
// when it says neither (one refused before it was published); the time alone
// when it names no worker.
func finalizedLine(st style, env *envelope.Envelope) string {
	if env.FinalizedAt.IsZero() {
		return ""
	}
	line := stamp(st, env.FinalizedAt)
	if env.FinalizedBy != "" {
		line += " by " + env.FinalizedBy
	}
	return line
}

// detailLines writes an error detail's value: a list one item a line (an
// input issue as "path: message"), so that none is cut; anything else as
// dataValue does.
func detailLines(v any) []string {
	items, ok := v.([]any)
	if !ok || len(items) == 0 {
		return []string{dataValue(v)}
	}
	lines := make([]string, 0, len(items))
	for _, it := range items {
		if m, ok := it.(map[string]any); ok {
			if msg, ok := m["message"].(string); ok {
				if path, _ := m["path"].(string); path != "" {
					lines = append(lines, path+": "+msg)
				} else {
					lines = append(lines, msg) // an issue of the input as a whole
				}
				continue
			}
		}
		lines = append(lines, dataValue(it))
	}
	return lines
}

// dataValue writes an event's data value compactly: strings as they are
// (quoted when they hold spaces), anything else as JSON.
func dataValue(v any) string {
	if s, ok := v.(string); ok {
		if strings.ContainsAny(s, " \t\n\"") || s == "" {
			return strconv.Quote(s)
		}
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return clip(string(b), 120)
}

func writeCancelReply(w io.Writer, st style, r *executor.CancelReply) {
	switch {
	case r.Error != "":
		fmt.Fprintf(w, "%s: the cancel was not recorded\n", r.ExecutionID)
	case r.Finalized:
		fmt.Fprintf(w, "%s already ended: %s; the cancel changed nothing\n", r.ExecutionID, st.status(string(r.Status)))
	default:
		fmt.Fprintf(w, "%s: cancel recorded (it was %s); 'capstan await %s' shows its end\n", r.ExecutionID,
			st.status(string(r.State)), r.ExecutionID)
	}
}

// writeEnvelope prints an execution's end for a person: what it was, how it
// ended, and the output in full (indented JSON), the error with its details,
// or the approval it waits for and what to do next.
// recoveredLine says how a recovered outcome is known (DESIGN §5).
func recoveredLine(r *envelope.Recovered) string {
	switch r.How {
	case envelope.RecoveredByReceipt:
		return fmt.Sprintf("from the receipt attempt %d recorded after its effect (its worker stopped before returning)", r.Attempt)
	case envelope.RecoveredByReconciler:
		return fmt.Sprintf("by the reconciler, which found attempt %d's effect (its worker was lost)", r.Attempt)
	}
	return fmt.Sprintf("%s, attempt %d", r.How, r.Attempt)
}

// addEnd adds how an envelope's execution ended: recovered from what a lost
// attempt left, how long it took, when and by whom it was finalized.
func addEnd(f *fields, st style, env *envelope.Envelope) {
	if r := env.Recovered; r != nil {
		f.add(st, "Recovered", recoveredLine(r))
	}
	f.add(st, "Duration", (time.Duration(env.DurationMs) * time.Millisecond).String())
	if line := finalizedLine(st, env); line != "" {
		f.add(st, "Finalized", line)
	}
}

// errorLine is an envelope's error in one line: its code and message, and
// whether another attempt may succeed.
func errorLine(st style, e *envelope.Error) string {
	line := string(e.Code) + ": " + e.Message
	if e.Retryable {
		line += st.dim(" (retryable)")
	}
	return line
}

func writeEnvelope(w io.Writer, st style, env *envelope.Envelope) {
	f := newFields(w)
	f.add(st, "Execution", st.bold(env.ExecutionID))
	f.add(st, "Capability", env.CapabilityID)
	f.add(st, "Status", st.status(string(env.Status)))
	if e := env.Error; e != nil {
		f.add(st, "Error", errorLine(st, e))
		f.add(st, "Stage", e.Stage)
		for _, k := range slices.Sorted(maps.Keys(e.Details)) {
			for i, line := range detailLines(e.Details[k]) {
				key := "  " + k
				if i > 0 {
					key = ""
				}
				f.add(st, key, line)
			}
		}
	}
	if a := env.Approval; a != nil {
		f.add(st, "Approval", a.ID+st.dim(" ("+strings.Join(a.Types, ", ")+"; expires "+ago(st.now, a.ExpiresAt)+")"))
		f.add(st, "Reasons", strings.Join(a.Reasons, "; "))
		f.add(st, "Next", "once someone else approved it: capstan resume "+a.ID)
	}
	if env.Attempts > 0 {
		f.add(st, "Attempts", strconv.Itoa(env.Attempts))
	}
	addEnd(f, st, env)
	f.flush()
	if len(env.Output) > 0 {
		if out, err := env.Output.MarshalJSON(); err == nil {
			var pretty bytes.Buffer
			if json.Indent(&pretty, out, "", "  ") == nil {
				out = pretty.Bytes()
			}
			fmt.Fprintf(w, "%s\n%s\n", st.bold("Output"), out)
		}
	}
}
