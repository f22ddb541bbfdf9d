package mcpbridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/mcptasks"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// What a handler reports of its work reaches an MCP client as progress
// notifications with a total, among the execution's steps; the values only
// grow and never pass their total.
func TestProgress_TheHandlersReportsAreNotifications(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	transports(t, f, func(t *testing.T, connect func(envelope.Actor, *events) *mcp.ClientSession) {
		ev := newEvents()
		cs := connect(alice, ev)
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.report", Arguments: map[string]any{"pages": 4, "pageMs": 20},
			Meta: mcp.Meta{"progressToken": "r1"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("isError: %s", textOf(res))
		}
		// The report made as the attempt starts is sent at once, and the
		// bridge followed the execution before it submitted it.
		waitProgress(t, ev, "0 of 4 (0%): starting")
		waitProgress(t, ev, "completed")
		ev.mu.Lock()
		defer ev.mu.Unlock()
		sawTotal := false
		for i, v := range ev.values {
			if i > 0 && v <= ev.values[i-1] {
				t.Errorf("progress did not grow: %v (%v)", ev.values, ev.progress)
			}
			if tot := ev.totals[i]; tot > 0 {
				sawTotal = true
				if tot != 4 || v > tot {
					t.Errorf("notification %d: %v of %v (%v)", i, v, tot, ev.progress)
				}
			}
		}
		if !sawTotal {
			t.Errorf("no notification had a total: %v %v", ev.values, ev.progress)
		}
		// The steps before the work never follow a report of it.
		reported := false
		for _, msg := range ev.progress {
			before := strings.HasPrefix(msg, "queued") || strings.HasPrefix(msg, "started, attempt 1")
			if reported && before {
				t.Errorf("%q after the handler's report: %q", msg, ev.progress)
			}
			reported = reported || strings.Contains(msg, " of 4 (")
		}
	})
}

// A task's status message says how far its handler has got, in both task
// lanes: the Tasks extension's tasks/get and the 2025-11-25 core tasks.
func TestTasks_StatusMessageShowsTheHandlersProgress(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	want := "1 of 3 (33%): first third"

	t.Run("extension", func(t *testing.T) {
		cs := f.connectTasks(t, f.bridge, alice)
		id := createTask(t, cs, "test.progress", map[string]any{"note": "x"})
		ctx := testCtx(t)
		for task := getTask(t, cs, id); !strings.Contains(task.StatusMessage, want); task = getTask(t, cs, id) {
			if task.Status != mcptasks.TaskWorking || ctx.Err() != nil {
				t.Fatalf("task %+v", task)
			}
			time.Sleep(20 * time.Millisecond) // a client's poll interval
		}
		f.gate <- struct{}{}
		if task := pollTask(t, cs, id, mcptasks.TaskCompleted); task.Result == nil || task.Result.IsError {
			t.Fatalf("task %+v", task)
		}
	})

	t.Run("core", func(t *testing.T) {
		srv := f.serveHTTP(t)
		s := &rawSession{t: t, url: srv.URL, token: aliceToken}
		t.Cleanup(s.close)
		var init map[string]any
		s.ok("initialize", map[string]any{"protocolVersion": mcptasks.CoreTasksVersion, "capabilities": map[string]any{},
			"clientInfo": map[string]any{"name": "raw", "version": "1"}}, &init)
		s.notify("notifications/initialized")
		var r struct {
			Task coreTask `json:"task"`
		}
		s.ok("tools/call", map[string]any{"name": "test_progress", "arguments": map[string]any{"note": "y"}, "task": map[string]any{"ttl": 60000}}, &r)
		if r.Task.TaskID == "" {
			t.Fatalf("no task: %+v", r)
		}
		ctx := testCtx(t)
		for {
			var task coreTask
			s.ok("tasks/get", map[string]any{"taskId": r.Task.TaskID}, &task)
			if strings.Contains(task.StatusMessage, want) {
				break
			}
			if task.Status != "working" || ctx.Err() != nil {
				t.Fatalf("task %+v", task)
			}
			time.Sleep(20 * time.Millisecond) // a client's poll interval
		}
		f.gate <- struct{}{}
		s.waitStatus(r.Task.TaskID, "completed")
	})
}
