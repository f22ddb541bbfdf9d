package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/trail"
)

// printedEvent is an audit event as the CLI prints it.
type printedEvent struct {
	Type        string         `json:"type"`
	ExecutionID string         `json:"executionId"`
	Data        map[string]any `json:"data"`
}

func eventLines(t *testing.T, stdout string) []printedEvent {
	t.Helper()
	var evs []printedEvent
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if line == "" {
			continue
		}
		var ev printedEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line is not JSON: %v\n%s", err, line)
		}
		evs = append(evs, ev)
	}
	return evs
}

func eventTypes(evs []printedEvent) string {
	var s []string
	for _, ev := range evs {
		s = append(s, ev.Type)
	}
	return strings.Join(s, " ")
}

func TestAudit_PrintsTheTrailAsJSONLinesOldestFirst(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.flaky", "--input", `{"failTimes":1}`)
	if code != exitOK {
		t.Fatalf("call: exit %d, stderr %s", code, stderr)
	}
	id := decode[printedEnvelope](t, stdout).ExecutionID

	want := "capability.requested capability.started capability.retried capability.started capability.completed"
	// The terminal event is written just before the envelope, asynchronously:
	// read again until it is there.
	deadline := time.Now().Add(guard)
	for {
		stdout, stderr, code = capstan(t, url, "audit", id, "--json")
		if code != exitOK {
			t.Fatalf("audit: exit %d, stderr %s", code, stderr)
		}
		evs := eventLines(t, stdout)
		if got := eventTypes(evs); got == want {
			for _, ev := range evs {
				if ev.ExecutionID != id {
					t.Fatalf("an event of %s in the trail of %s", ev.ExecutionID, id)
				}
			}
			return
		} else if !strings.HasPrefix(want, got) || time.Now().After(deadline) {
			t.Fatalf("trail %s, want %s", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAudit_UsageAndUnknownExecution(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"unknown execution exits 1", []string{"audit", "no-such-execution"}, exitFailed},
		{"no id and no --follow is a usage error", []string{"audit"}, exitUsage},
		{"two ids is a usage error", []string{"audit", "a", "b"}, exitUsage},
		{"a wildcard id is a usage error", []string{"audit", ">"}, exitUsage},
		{"a bad --since is a usage error", []string{"audit", "--follow", "--since", "yesterday"}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := capstan(t, url, tc.args...)
			if code != tc.code || stderr == "" {
				t.Fatalf("exit %d, want %d; stdout %s stderr %s", code, tc.code, stdout, stderr)
			}
		})
	}
}

func TestAuditFollow_PrintsOnlyMatchingEventsUntilInterrupted(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	follower := startDaemon(t, "", []string{"CAPSTAN_NATS_URL=" + url},
		"audit", "--follow", "--type", "capability.denied", "--since", "1h", "--json")

	var denied []string
	for _, input := range []string{`{"subject":"no address"}`, `{"to":"ada@example.com","subject":"hi"}`, `{"holdMs":-1}`} {
		stdout, _, _ := capstan(t, url, "call", "-o", "json", "email.send", "--input", input)
		env := decode[printedEnvelope](t, stdout)
		if env.Status == "failed" && env.Error != nil && env.Error.Code == "INPUT_INVALID" {
			denied = append(denied, env.ExecutionID)
		}
	}
	if len(denied) != 2 {
		t.Fatalf("%d calls denied, want 2", len(denied))
	}

	deadline := time.After(guard)
	for {
		evs := eventLines(t, follower.out.String())
		if len(evs) == len(denied) {
			for i, ev := range evs {
				if ev.Type != "capability.denied" || ev.ExecutionID != denied[i] || ev.Data["reason"] != "input-invalid" {
					t.Fatalf("event %d: %+v, want the denial of %s", i, ev, denied[i])
				}
			}
			break
		}
		if len(evs) > len(denied) {
			t.Fatalf("followed %d events, want %d:\n%s", len(evs), len(denied), follower.out.String())
		}
		select {
		case <-deadline:
			t.Fatalf("followed %d events, want %d", len(evs), len(denied))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if code := follower.stop(t); code != exitOK {
		t.Fatalf("follower exited %d after SIGTERM", code)
	}
	// It left no consumer behind.
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), "CAPSTAN_AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	// dev's audit checkpointer reads the stream with a consumer of its own.
	for name := range s.ListConsumers(context.Background()).Info() {
		if !strings.HasPrefix(name.Name, trail.ConsumerPrefix) {
			t.Fatalf("consumer %s left on the audit stream", name.Name)
		}
	}
}

func TestServer_AuditMaxAgeSetsTheRetention(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startDaemon(t, "listening", nil, "server", "--store", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--audit-max-age", "90d")
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), "CAPSTAN_AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 90*24*time.Hour {
		t.Fatalf("audit retention %v, want 90 days", got)
	}
	// A worker and the other commands, which do not say, accept it.
	startDaemon(t, "worker started", []string{"CAPSTAN_NATS_URL=" + url}, "worker", "--grace", "5s")
	stdout, stderr, code := capstan(t, url, "call", "-o", "json", "demo.echo", "--input", `{"hello":"world"}`)
	if code != exitOK {
		t.Fatalf("call against a 90-day audit stream: exit %d, stderr %s", code, stderr)
	}
	id := decode[printedEnvelope](t, stdout).ExecutionID
	if _, stderr, code := capstan(t, url, "audit", id); code != exitOK {
		t.Fatalf("audit against a 90-day audit stream: exit %d, stderr %s", code, stderr)
	}
}
