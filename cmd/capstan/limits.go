package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/capstan-dev/capstan/internal/limits"
)

// runLimits prints every limit's usage now (DESIGN §17): the slots held and
// by whom, the executions of a rate's last interval, a budget's sum over
// its window.
func runLimits(args []string) int {
	fs, conn, o := newConnFlags("limits", "[--capability PREFIX] [-o json]")
	prefix := fs.String("capability", "", "show only the capabilities whose id starts with `prefix`")
	js, ctx, done, code := conn.readBuckets("limits", fs, args, o)
	if done == nil {
		return code
	}
	defer done()
	// No bucket: no worker of this version has run, no limit was taken.
	kv, err := unlessAbsent(js.KeyValue(ctx, names.LimitsBucket()))
	if err != nil {
		return fail(exitFailed, "read the limits: %v", err)
	}
	now := time.Now()
	us, err := limits.Read(ctx, kv, *prefix, now)
	if err != nil {
		return fail(exitFailed, "read the limits: %v", err)
	}
	if us == nil {
		us = []limits.Usage{}
	}
	return o.print(us, func(w io.Writer, st style) { writeLimits(w, us, now) })
}

func writeLimits(w io.Writer, us []limits.Usage, now time.Time) {
	if len(us) == 0 {
		fmt.Fprintln(w, "No limit has been taken: no capability declares one, or none was called lately.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPABILITY\tLIMIT\tWHOSE\tUSED\tOF")
	for _, u := range us {
		whose := u.Who
		if whose == "" {
			whose = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", u.Capability, u.Limit, whose, u.Used, u.Max)
		for _, h := range u.Holders {
			state := "lease until " + h.Until.Format(time.RFC3339)
			if !now.Before(h.Until) {
				state = "lease passed as recorded: checked against its record before the slot is given to another"
			}
			fmt.Fprintf(tw, "\t  held by %s\t%s\t\t%s\n", h.Key, h.Worker, state)
		}
	}
	_ = tw.Flush()
}
