package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/envelope"
)

// `capstan call --follow` prints each progress report of the execution on
// stderr as it comes, a line each for a person and a JSON object each with
// -o json; stdout is the envelope alone; without --follow, -o json prints
// nothing more.
func TestCall_FollowPrintsProgressOnStderr(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	input := `{"pages":4,"pageMs":50}`

	stdout, stderr, code := capstan(t, url, "call", "demo.report", "--input", input, "--follow")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	if !strings.Contains(stdout, "completed") || strings.Contains(stdout, "progress") {
		t.Fatalf("stdout:\n%s", stdout)
	}
	lines := progressLines(stderr)
	// The report made as the attempt starts goes at once, and the call
	// subscribed before it published the request.
	if len(lines) == 0 || lines[0] != "progress 0 of 4 (0%): starting" {
		t.Fatalf("stderr:\n%s", stderr)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "progress ") || !strings.Contains(l, " of 4 (") || !strings.Contains(l, "rendered") {
			t.Fatalf("progress line %q in\n%s", l, stderr)
		}
	}

	stdout, stderr, code = capstan(t, url, "call", "-o", "json", "demo.report", "--input", input, "--follow")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	if env := decode[printedEnvelope](t, stdout); env.Status != "completed" {
		t.Fatalf("envelope %+v", env)
	}
	var reports []envelope.Progress
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var p envelope.Progress
		if err := json.Unmarshal([]byte(l), &p); err != nil {
			t.Fatalf("stderr line %q: %v", l, err)
		}
		reports = append(reports, p)
	}
	if len(reports) == 0 || reports[0].Message != "starting" || reports[0].Total != 4 || reports[0].Attempt != 1 {
		t.Fatalf("reports %+v", reports)
	}
	for i, p := range reports {
		if p.ExecutionID != reports[0].ExecutionID || (i > 0 && p.Done < reports[i-1].Done) {
			t.Fatalf("reports %+v", reports)
		}
	}

	_, stderr, code = capstan(t, url, "call", "-o", "json", "demo.report", "--input", input)
	if code != exitOK || stderr != "" {
		t.Fatalf("-o json without --follow: exit %d, stderr %q", code, stderr)
	}
}

// `capstan await --follow` follows an execution submitted earlier: the
// progress it reports once the await listens is printed, then the envelope.
// No clock decides the test: the report runs until it is cancelled, which
// the test does once a line came.
func TestAwait_FollowPrintsProgressUntilTheEnvelope(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	stdout, stderr, code := capstan(t, url, "submit", "demo.report", "--input", `{"pages":1000,"pageMs":200}`)
	if code != exitOK {
		t.Fatalf("submit: exit %d, %s", code, stderr)
	}
	id := strings.TrimSpace(stdout)

	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "await", id, "--follow", "--wait", "2m")
	cmd.Env = append(os.Environ(), "CAPSTAN_NATS_URL="+url)
	var out bytes.Buffer
	cmd.Stdout = &out
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(errPipe)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.HasPrefix(sc.Text(), "progress ") {
			break
		}
	}
	if len(seen) == 0 || !strings.Contains(seen[len(seen)-1], " of 1000 (") {
		t.Fatalf("await printed %q before ending", seen)
	}
	if _, stderr, code := capstan(t, url, "cancel", id); code != exitOK {
		t.Fatalf("cancel: exit %d, %s", code, stderr)
	}
	for sc.Scan() {
		seen = append(seen, sc.Text())
	}
	err = cmd.Wait()
	checkRaces(t, "capstan await --follow", strings.Join(seen, "\n"))
	if cmd.ProcessState.ExitCode() != exitFailed || !strings.Contains(out.String(), "cancelled") {
		t.Fatalf("await: %v, exit %d, stdout:\n%s\nstderr:\n%s", err, cmd.ProcessState.ExitCode(), out.String(), strings.Join(seen, "\n"))
	}
	for _, l := range seen {
		if !strings.HasPrefix(l, "progress ") {
			t.Fatalf("stderr line %q", l)
		}
	}
}

// progressLines are the lines of stderr that report progress.
func progressLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "progress ") {
			out = append(out, l)
		}
	}
	return out
}
