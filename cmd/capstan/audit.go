package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

func runAudit(args []string) int {
	if len(args) > 0 {
		if run, ok := auditLogCommands[args[0]]; ok {
			return run(args[1:])
		}
	}
	fs, conn, o := newConnFlags("audit", "ID [--follow] | --follow [--capability C] [--type T] [--actor A] [--since D]; [-o json]\n"+auditLogUsage)
	follow := fs.Bool("follow", false, "keep printing events as they are stored, until interrupted")
	var f audit.Filter
	fs.StringVar(&f.CapabilityID, "capability", "", "only events of this capability `id`")
	fs.StringVar(&f.Type, "type", "", "only events of this `type`, e.g. capability.denied")
	fs.StringVar(&f.ActorID, "actor", "", "only events of this actor `id`")
	fs.StringVar(&f.Principal, "owner", "", "the `principal` whose execution it is, or whose events to follow (executions are scoped by principal; default with an ID: the one principal that has an execution of that id, else the caller's own)")
	var since longDuration
	fs.Var(&since, "since", "with --follow and no ID: begin with the events of the last `duration` (e.g. 10m, 2d) instead of new ones")
	pos, code, ok := parseOutput(fs, args, -1, o)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		return usageError("audit: want one execution id, got %d arguments", len(pos))
	}
	if len(pos) == 1 {
		f.ExecutionID = pos[0]
		if err := envelope.ValidExecutionID(f.ExecutionID); err != nil {
			return usageError("%v", err)
		}
	} else if !*follow {
		return usageError("audit: want an execution id, or --follow")
	}

	// Admins (and open servers) read the stream; every other principal asks
	// the workers for one execution's trail, as its role lets it see it.
	direct := conn.principal().may(streamInfo(names.AuditStream())(""))
	if *follow && !direct {
		return usageError("%v", conn.need("follow the audit stream", streamInfo(names.AuditStream()),
			"only admins follow it; 'capstan audit ID' reads one execution's trail, and 'capstan executions' lists what changed"))
	}
	if !direct {
		if err := conn.need("read executions", names.ExecutionSubject, reissue); err != nil {
			return usageError("%v", err)
		}
	}
	nc, err := conn.connect("audit")
	if err != nil {
		return usageError("%v", err)
	}
	defer nc.Close()
	ctx, stop := signalContext()
	defer stop()
	if f.ExecutionID != "" {
		rctx, cancel := context.WithTimeout(ctx, submitTimeout)
		f.ExecutionID, err = resolveExecution(rctx, nc, conn, f.ExecutionID)
		cancel()
		if err != nil {
			return usageError("%v", err)
		}
	}
	var b *broker.Broker
	if direct {
		pctx, cancel := context.WithTimeout(ctx, submitTimeout)
		b, err = broker.OpenAll(pctx, nc, broker.Config{}) // admins and workers read the trail
		cancel()
		if err != nil {
			return usageError("%v", err)
		}
	}

	if direct && f.ExecutionID != "" && f.Principal == "" {
		octx, cancel := context.WithTimeout(ctx, submitTimeout)
		f.Principal, err = ownerOf(octx, b, broker.PrincipalOf(nc, b.Names), f.ExecutionID)
		cancel()
		if err != nil {
			return usageError("audit: %v", err)
		}
	}

	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	write := func(ev audit.Event) error { return out.Encode(ev) }
	if !o.isJSON() {
		st, many := stdoutStyle(), f.ExecutionID == ""
		write = func(ev audit.Event) error {
			st.now = time.Now()
			return auditLine(os.Stdout, st, &ev, many)
		}
	}

	if !*follow {
		rctx, cancel := context.WithTimeout(ctx, submitTimeout)
		defer cancel()
		var trail []audit.Event
		if direct {
			trail, err = audit.Read(rctx, b, f.Principal, f.ExecutionID)
		} else {
			var v *executor.ExecutionView
			if v, err = executor.RequestExecution(rctx, nc, names, executor.ExecutionRequest{ExecutionID: f.ExecutionID,
				Owner: f.Principal}); err == nil {
				trail, f.Principal = v.Trail, v.Principal
			}
		}
		if errors.Is(err, broker.ErrNotFound) {
			return fail(exitFailed, "%v", err)
		}
		if err != nil {
			return readError(err)
		}
		if len(trail) == 0 && !direct {
			return fail(exitFailed, "%v: no audit events for execution %s", broker.ErrNotFound, f.ExecutionID)
		}
		for _, ev := range trail {
			if !f.Match(&ev) {
				continue
			}
			if err := write(ev); err != nil {
				return fail(exitFailed, "print: %v", err)
			}
		}
		return exitOK
	}

	var from []audit.FollowOption
	switch {
	case f.ExecutionID != "":
		from = append(from, audit.FromStart()) // the trail so far, then what comes
	case since > 0:
		from = append(from, audit.Since(time.Now().Add(-time.Duration(since))))
	}
	if err := audit.Follow(ctx, b, f, write, from...); err != nil {
		return fail(exitFailed, "audit: %v", err)
	}
	return exitOK
}

// ownerOf is the principal whose execution id is, for a caller that did not
// name one: the one principal with a record or an envelope of that id (what
// an admin reads), else self. Ids are unique per principal only (DESIGN §2):
// several owners must be told apart with --owner.
func ownerOf(ctx context.Context, b *broker.Broker, self, id string) (string, error) {
	owners, err := broker.Owners(ctx, b, id)
	switch {
	case err != nil || len(owners) == 0 || slices.Contains(owners, self):
		return self, nil // not an admin's credentials, or none found: the caller's own
	case len(owners) == 1:
		return owners[0], nil
	}
	return "", fmt.Errorf("execution %s exists for several principals (%s): name one with --owner", id, strings.Join(owners, ", "))
}

// longDuration is a flag value that takes Go durations and whole days: 90d.
type longDuration time.Duration

func (d *longDuration) String() string {
	if d == nil || *d == 0 {
		return ""
	}
	if v := time.Duration(*d); v%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	}
	return time.Duration(*d).String()
}

func (d *longDuration) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return errors.New("want a duration like 90d, 36h or 15m")
		}
		*d = longDuration(time.Duration(days) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return errors.New("want a duration like 90d, 36h or 15m")
	}
	*d = longDuration(v)
	return nil
}
