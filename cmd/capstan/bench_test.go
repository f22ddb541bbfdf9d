package main

import (
	"strings"
	"testing"
)

// benchJSON is the part of bench's JSON output that tools rely on.
type benchJSON struct {
	Mode             string   `json:"mode"`
	N                int      `json:"n"`
	Completed        int      `json:"completed"`
	NotCompleted     int      `json:"notCompleted"`
	Errors           int      `json:"errors"`
	ExecutionsPerSec *float64 `json:"executionsPerSec"`
	P50Ms            *float64 `json:"p50Ms"`
	P90Ms            *float64 `json:"p90Ms"`
	P99Ms            *float64 `json:"p99Ms"`
	MaxMs            *float64 `json:"maxMs"`
	BaselinePerSec   *float64 `json:"baselinePerSec"`
	Ratio            *float64 `json:"ratio"`
	ConsumersBefore  int      `json:"consumersBefore"`
	ConsumersMax     int      `json:"consumersMax"`
}

func TestBenchEmbedded_JSONReportsEveryExecutionCompletedAndTheBaseline(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := capstan(t, "", "bench", "--embedded", "--n", "300", "--concurrency", "16", "--json")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	r := decode[benchJSON](t, stdout)
	if r.Mode != "closed" || r.N != 300 || r.Completed != 300 || r.NotCompleted != 0 || r.Errors != 0 {
		t.Fatalf("result %+v", r)
	}
	for name, v := range map[string]*float64{"executionsPerSec": r.ExecutionsPerSec, "p50Ms": r.P50Ms, "p90Ms": r.P90Ms,
		"p99Ms": r.P99Ms, "maxMs": r.MaxMs, "baselinePerSec": r.BaselinePerSec, "ratio": r.Ratio} {
		if v == nil || *v <= 0 {
			t.Errorf("%s missing or not positive", name)
		}
	}
	if *r.P50Ms > *r.P90Ms || *r.P90Ms > *r.P99Ms || *r.P99Ms > *r.MaxMs {
		t.Errorf("percentiles out of order: %+v", r)
	}
	// One client awaiting many calls holds no consumer per call.
	if r.ConsumersMax > r.ConsumersBefore {
		t.Errorf("consumers grew from %d to %d during the run", r.ConsumersBefore, r.ConsumersMax)
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("a progress bar was drawn on a pipe: %q", stderr)
	}
}

func TestBenchOpenLoopAndBatch_AgainstAServer(t *testing.T) {
	t.Parallel()
	_, url := startDev(t)
	for _, args := range [][]string{
		{"--rate", "200/s", "--n", "100"},
		{"--batch", "50", "--concurrency", "2", "--n", "200"},
	} {
		stdout, stderr, code := capstan(t, url, append([]string{"bench", "--workers", "0", "--no-baseline", "--json"}, args...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d, stderr %s", args, code, stderr)
		}
		if r := decode[benchJSON](t, stdout); r.Completed != r.N {
			t.Fatalf("%v: %+v", args, r)
		}
	}
}

func TestBench_UsageAndConnectionErrorsExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--embedded", "--nats", "nats://127.0.0.1:1"},
		{"--n", "0"},
		{"--rate", "fast"},
		{"--rate", "10", "--backlog"},
		{"--nats", "nats://127.0.0.1:1", "--n", "1"}, // nothing listens there
	} {
		if _, _, code := capstan(t, "", append([]string{"bench"}, args...)...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}
