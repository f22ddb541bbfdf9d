package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// What `call` and `await` show of an execution's progress while they wait
// (DESIGN §5 "Progress", §10): on a terminal, the waiting line says how far
// the handler has got; with --follow, every report the worker publishes is
// a line on stderr (JSON with -o json), so a log or a script sees it too.
// Stdout stays the envelope alone.

// progressFlags is --follow.
type progressFlags struct{ follow bool }

func addProgressFlags(fs *flag.FlagSet) *progressFlags {
	p := &progressFlags{}
	fs.BoolVar(&p.follow, "follow", false, "print each progress report of the execution on stderr as it comes, one line each (a JSON object each with -o json)")
	return p
}

// progressShow takes the reports of one wait and shows them.
type progressShow struct {
	follow bool
	json   bool
	out    io.Writer // stderr
	// line clears the terminal's waiting line before a --follow line is
	// written on stderr, when one is shown there.
	line bool

	mu   sync.Mutex
	last *envelope.Progress
}

// newProgressShow is what a wait shows of progress, nil when nothing: a
// terminal's waiting line for a person, or --follow.
func newProgressShow(o *outputFlags, pf *progressFlags) *progressShow {
	term := isTerminal(os.Stderr)
	if !pf.follow && (o.isJSON() || !term) {
		return nil // -o json asks for nothing more, unless --follow
	}
	return &progressShow{follow: pf.follow, json: o.isJSON(), out: os.Stderr, line: term}
}

// context makes the client hand the wait's progress to s.
func (s *progressShow) context(ctx context.Context) context.Context {
	if s == nil {
		return ctx
	}
	return executor.WithProgress(ctx, s.add)
}

func (s *progressShow) add(p executor.Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &p
	if !s.follow {
		return
	}
	if s.json {
		b, err := json.Marshal(p)
		if err == nil {
			fmt.Fprintf(s.out, "%s\n", b)
		}
		return
	}
	clear := ""
	if s.line {
		clear = "\r\x1b[K"
	}
	fmt.Fprintf(s.out, "%sprogress %s\n", clear, progressText(&p))
}

// now is what the waiting line says of the progress so far ("" for none).
func (s *progressShow) now() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return ""
	}
	return progressText(s.last)
}

// lock keeps the waiting line and --follow's lines apart on stderr.
func (s *progressShow) lock() func() {
	if s == nil {
		return func() {}
	}
	s.mu.Lock()
	return s.mu.Unlock
}

// progressText is one report for a person, clean of anything a terminal
// would act on whoever published it: "37 of 120 (30%): page 37", with the
// attempt after the first.
func progressText(p *envelope.Progress) string {
	q := *p
	q.Done, q.Total, q.Message = envelope.CleanProgress(q.Done, q.Total, q.Message)
	return q.Line("reported")
}

// waitingFor shows, on a terminal's stderr, how long a command has waited
// for what, and how far the execution's handler has got (show), once it has
// waited a second or progress came; stop clears the line. Without a
// terminal it shows nothing.
func waitingFor(what string, limit time.Duration, show *progressShow) (stop func()) {
	if !isTerminal(os.Stderr) {
		return func() {}
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		start := time.Now()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		frames := `|/-\`
		shown := false
		for i := 0; ; i++ {
			select {
			case <-done:
				if shown {
					fmt.Fprint(os.Stderr, "\r\x1b[K")
				}
				return
			case <-t.C:
			}
			waited := time.Since(start)
			progress := clip(show.now(), 60)
			if waited < time.Second && progress == "" {
				continue
			}
			shown = true
			line := fmt.Sprintf("%c waiting for %s: %s of %s", frames[i%len(frames)], what, waited.Truncate(time.Second), limit)
			if progress != "" {
				line = fmt.Sprintf("%c %s · %s of %s", frames[i%len(frames)], progress, waited.Truncate(time.Second), limit)
			}
			unlock := show.lock()
			fmt.Fprint(os.Stderr, "\r\x1b[K"+strings.TrimRight(line, " "))
			unlock()
		}
	}()
	return func() { close(done); <-ended }
}
