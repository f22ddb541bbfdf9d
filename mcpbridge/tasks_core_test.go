package mcpbridge_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/mcptasks"
	"github.com/capstan-dev/capstan/internal/oplog"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// rawSession speaks JSON-RPC over streamable HTTP as a 2025-11-25 client
// does, byte for byte, to check what goes over the wire.
type rawSession struct {
	t       *testing.T
	url     string
	token   string
	session string
	id      int
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (s *rawSession) call(method string, params any) (json.RawMessage, *rpcError) {
	s.t.Helper()
	s.id++
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": method, "params": params})
	req, _ := http.NewRequestWithContext(testCtx(s.t), http.MethodPost, s.url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.session != "" {
		req.Header.Set("Mcp-Session-Id", s.session)
		req.Header.Set("Mcp-Protocol-Version", mcptasks.CoreTasksVersion)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		s.session = sid
	}
	var msg struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			line = data
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.ID == s.id {
			return msg.Result, msg.Error
		}
	}
	s.t.Fatalf("%s: no answer (HTTP %d)", method, resp.StatusCode)
	return nil, nil
}

// close ends the session, as a client that leaves does (HTTP DELETE).
func (s *rawSession) close() {
	if s.session == "" {
		return
	}
	req, _ := http.NewRequest(http.MethodDelete, s.url, nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Mcp-Session-Id", s.session)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

func (s *rawSession) notify(method string) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method})
	req, _ := http.NewRequestWithContext(testCtx(s.t), http.MethodPost, s.url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.session)
	req.Header.Set("Mcp-Protocol-Version", mcptasks.CoreTasksVersion)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
}

func (s *rawSession) ok(method string, params any, into any) {
	s.t.Helper()
	res, e := s.call(method, params)
	if e != nil {
		s.t.Fatalf("%s: error %d %s", method, e.Code, e.Message)
	}
	if err := json.Unmarshal(res, into); err != nil {
		s.t.Fatalf("%s: %v in %s", method, err, res)
	}
}

type coreTask struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  int64  `json:"pollInterval"`
}

// waitStatus polls tasks/get until the task has one of want.
func (s *rawSession) waitStatus(id string, want ...string) coreTask {
	s.t.Helper()
	ctx := testCtx(s.t)
	for {
		var t coreTask
		s.ok("tasks/get", map[string]any{"taskId": id}, &t)
		for _, w := range want {
			if t.Status == w {
				return t
			}
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("task %s is %s (%s), want %v", id, t.Status, t.StatusMessage, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// A 2025-11-25 client (what the official TypeScript SDK's
// client.experimental.tasks speaks) is told of the core tasks at
// initialize, sees every capability's tool as one it may call as a task, and
// gets the same durable execution as a task: created at once, read, waited
// for (tasks/result), listed, cancelled; failures are failed, an approval
// someone else decides keeps it working until it runs.
func TestCoreTasks_The20251125Lane(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	s := &rawSession{t: t, url: srv.URL, token: aliceToken}
	t.Cleanup(s.close)
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
		Capabilities    struct {
			Tasks struct {
				List     *struct{} `json:"list"`
				Cancel   *struct{} `json:"cancel"`
				Requests struct {
					Tools struct {
						Call *struct{} `json:"call"`
					} `json:"tools"`
				} `json:"requests"`
			} `json:"tasks"`
		} `json:"capabilities"`
	}
	s.ok("initialize", map[string]any{"protocolVersion": mcptasks.CoreTasksVersion, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}}, &init)
	if init.ProtocolVersion != mcptasks.CoreTasksVersion || init.Capabilities.Tasks.Requests.Tools.Call == nil ||
		init.Capabilities.Tasks.List == nil || init.Capabilities.Tasks.Cancel == nil {
		t.Fatalf("initialize answered %+v: no tasks capability", init)
	}
	s.notify("notifications/initialized")

	var list struct {
		Tools []struct {
			Name      string `json:"name"`
			Execution *struct {
				TaskSupport string `json:"taskSupport"`
			} `json:"execution"`
		} `json:"tools"`
	}
	s.ok("tools/list", map[string]any{}, &list)
	support := map[string]string{}
	for _, tl := range list.Tools {
		if tl.Execution != nil {
			support[tl.Name] = tl.Execution.TaskSupport
		}
	}
	if support["orders_refund"] != "optional" || support["demo_echo"] != "optional" || support[mcpbridge.ResumeTool] != "" {
		t.Fatalf("taskSupport by tool: %v", support)
	}

	create := func(name string, args map[string]any) coreTask {
		t.Helper()
		var r struct {
			Task coreTask `json:"task"`
		}
		s.ok("tools/call", map[string]any{"name": name, "arguments": args, "task": map[string]any{"ttl": 60000}}, &r)
		if r.Task.TaskID == "" || r.Task.Status != "working" || r.Task.CreatedAt == "" || r.Task.TTL == nil {
			t.Fatalf("%s as a task answered %+v", name, r.Task)
		}
		return r.Task
	}
	type toolResult struct {
		IsError           bool           `json:"isError"`
		StructuredContent map[string]any `json:"structuredContent"`
		Content           []struct {
			Text string `json:"text"`
		} `json:"content"`
		Meta map[string]any `json:"_meta"`
	}

	// Completed: tasks/result answers what the call would have.
	echo := create("demo_echo", map[string]any{"as": "task"})
	var res toolResult
	s.ok("tasks/result", map[string]any{"taskId": echo.TaskID}, &res)
	if res.IsError || res.StructuredContent["as"] != "task" {
		t.Fatalf("tasks/result of the echo: %+v", res)
	}
	if rel, _ := res.Meta["io.modelcontextprotocol/related-task"].(map[string]any); rel["taskId"] != echo.TaskID {
		t.Fatalf("tasks/result's _meta: %v", res.Meta)
	}
	s.waitStatus(echo.TaskID, "completed")

	// Failed: a tool result that isError.
	flaky := create("demo_flaky", map[string]any{"failTimes": 5})
	got := s.waitStatus(flaky.TaskID, "failed", "completed")
	if got.Status != "failed" {
		t.Fatalf("a failing call's task is %s", got.Status)
	}
	res = toolResult{}
	s.ok("tasks/result", map[string]any{"taskId": flaky.TaskID}, &res)
	if !res.IsError {
		t.Fatalf("tasks/result of a failed task: %+v", res)
	}

	// Cancelled, once: a second cancel of an ended task is refused.
	block := create("test_block", map[string]any{"note": "cancel me"})
	<-f.started
	var cancelled coreTask
	s.ok("tasks/cancel", map[string]any{"taskId": block.TaskID}, &cancelled)
	if cancelled.Status != "cancelled" {
		t.Fatalf("tasks/cancel answered %+v", cancelled)
	}
	if _, e := s.call("tasks/cancel", map[string]any{"taskId": block.TaskID}); e == nil || e.Code != -32602 {
		t.Fatalf("cancelling an ended task: %+v, want -32602", e)
	}

	// An approval someone else decides: working until it runs, then completed.
	refund := create("orders_refund", map[string]any{"orderId": "o-core", "amount": 900})
	waiting := s.waitStatus(refund.TaskID, "working")
	for !strings.Contains(waiting.StatusMessage, "approval") {
		time.Sleep(50 * time.Millisecond)
		waiting = s.waitStatus(refund.TaskID, "working")
	}
	approvalID := strings.Fields(strings.TrimPrefix(waiting.StatusMessage, "waiting for approval "))[0]
	if _, err := f.client.Decide(testCtx(t), approvalID, approvals.Verdict{Approve: true,
		Approver: envelope.Actor{Kind: envelope.ActorUser, ID: "carol"}}); err != nil {
		t.Fatal(err)
	}
	res = toolResult{}
	s.ok("tasks/result", map[string]any{"taskId": refund.TaskID}, &res)
	if res.IsError || res.StructuredContent["orderId"] != "o-core" {
		t.Fatalf("the approved refund's result: %+v", res)
	}

	// Listed, newest first; another actor's and an unknown id are not found.
	var tasks struct {
		Tasks []coreTask `json:"tasks"`
	}
	s.ok("tasks/list", map[string]any{}, &tasks)
	ids := map[string]string{}
	for _, tk := range tasks.Tasks {
		ids[tk.TaskID] = tk.Status
	}
	for id, want := range map[string]string{echo.TaskID: "completed", flaky.TaskID: "failed", block.TaskID: "cancelled"} {
		if ids[id] != want {
			t.Errorf("tasks/list has %s as %q, want %s (list %v)", id, ids[id], want, ids)
		}
	}
	bobS := &rawSession{t: t, url: srv.URL, token: bobToken}
	t.Cleanup(bobS.close)
	bobS.ok("initialize", map[string]any{"protocolVersion": mcptasks.CoreTasksVersion, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}}, &init)
	bobS.notify("notifications/initialized")
	for _, id := range []string{echo.TaskID, "nope"} {
		if _, e := bobS.call("tasks/get", map[string]any{"taskId": id}); e == nil || e.Code != -32602 {
			t.Errorf("bob's tasks/get of %s: %+v, want -32602", id, e)
		}
	}
	bobS.ok("tasks/list", map[string]any{}, &tasks)
	for _, tk := range tasks.Tasks {
		if ids[tk.TaskID] != "" {
			t.Errorf("bob's tasks/list shows alice's task %s", tk.TaskID)
		}
	}
	// Held by an operator's pause: listed working, queued, until it runs.
	names := broker.NewNames("")
	ch, err := pauses.Apply(testCtx(t), f.nc, names, &pauses.Pause{Scope: pauses.Scope{Capability: "email.send"},
		Mode: pauses.Hold, Reason: "mail to the wrong list", By: broker.Anonymous})
	if err != nil {
		t.Fatal(err)
	}
	if replies, err := oplog.Confirm(testCtx(t), f.nc, names, oplog.Pauses, ch.Revision, "", 5*time.Second); err != nil || len(replies) == 0 || !replies[0].Applied {
		t.Fatalf("the worker did not confirm the pause: %v %+v", err, replies)
	}
	held := create("email_send", map[string]any{"to": "ops@example.com", "subject": "held"})
	heldCtx := testCtx(t)
	created := map[string]bool{} // its createdAt, as every answer gives it
	for listedAs := ""; listedAs != "queued" || len(created) == 0; {
		s.ok("tasks/list", map[string]any{}, &tasks)
		for _, tk := range tasks.Tasks {
			if tk.TaskID == held.TaskID {
				if tk.Status != "working" {
					t.Fatalf("a held task listed %s (%s)", tk.Status, tk.StatusMessage)
				}
				listedAs = tk.StatusMessage
				if listedAs == "queued" {
					created[tk.CreatedAt] = true
				}
			}
		}
		if heldCtx.Err() != nil {
			t.Fatalf("a held task never listed queued (last %q)", listedAs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // a clock that moves on between the reads
	s.ok("tasks/list", map[string]any{}, &tasks)
	for _, tk := range tasks.Tasks {
		if tk.TaskID == held.TaskID {
			created[tk.CreatedAt] = true
		}
	}
	created[s.waitStatus(held.TaskID, "working").CreatedAt] = true
	if len(created) != 1 {
		t.Errorf("a held task's createdAt moves from read to read: %v", created)
	}
	if _, err := pauses.Lift(testCtx(t), f.nc, names, ch.Pause.Scope, broker.Anonymous, "", "fixed"); err != nil {
		t.Fatal(err)
	}
	s.waitStatus(held.TaskID, "completed")

	// A tool the bridge answers at once is not a task.
	if _, e := s.call("tools/call", map[string]any{"name": mcpbridge.StatusTool, "arguments": map[string]any{"executionId": echo.TaskID},
		"task": map[string]any{}}); e == nil || e.Code != -32601 {
		t.Errorf("%s as a task: %+v, want -32601", mcpbridge.StatusTool, e)
	}
}

// What a client is told when a task cannot be read or cancelled names the
// task, never a Go type of the bridge's: the spec's "Task not found" for an
// id that is not the caller's, and the state of a task that ended.
func TestCoreTasks_RefusalsNameNoInternals(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
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
	s.ok("tools/call", map[string]any{"name": "demo_echo", "arguments": map[string]any{"a": 1}, "task": map[string]any{}}, &r)
	s.waitStatus(r.Task.TaskID, "completed")

	_, notFound := s.call("tasks/get", map[string]any{"taskId": "0190a0a0-0000-7000-8000-000000000000"})
	_, ended := s.call("tasks/cancel", map[string]any{"taskId": r.Task.TaskID})
	for what, e := range map[string]*rpcError{"an unknown task": notFound, "cancelling an ended task": ended} {
		if e == nil || e.Code != -32602 {
			t.Fatalf("%s: %+v, want -32602", what, e)
		}
		if strings.Contains(e.Message, "mcptasks") || !strings.Contains(e.Message, "Task ") {
			t.Errorf("%s answers %q: a Go package's name, or no task", what, e.Message)
		}
	}
	if !strings.Contains(ended.Message, r.Task.TaskID) || !strings.HasSuffix(ended.Message, "completed") {
		t.Errorf("cancelling an ended task answers %q: want its id and its state", ended.Message)
	}
}

// A task whose approval someone granted, cancelled before anything resumed
// it, does not run: the cancel is the caller's last word on the call.
func TestCoreTasks_CancelAfterTheApprovalBeforeItRuns_NothingRuns(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
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
	s.ok("tools/call", map[string]any{"name": "orders_refund", "arguments": map[string]any{"orderId": "o-cancelled", "amount": 900},
		"task": map[string]any{}}, &r)
	waiting := s.waitStatus(r.Task.TaskID, "working")
	for !strings.Contains(waiting.StatusMessage, "approval") {
		time.Sleep(50 * time.Millisecond)
		waiting = s.waitStatus(r.Task.TaskID, "working")
	}
	approvalID := strings.Fields(strings.TrimPrefix(waiting.StatusMessage, "waiting for approval "))[0]
	if _, err := f.client.Decide(testCtx(t), approvalID, approvals.Verdict{Approve: true,
		Approver: envelope.Actor{Kind: envelope.ActorUser, ID: "carol"}}); err != nil {
		t.Fatal(err)
	}
	var cancelled coreTask
	s.ok("tasks/cancel", map[string]any{"taskId": r.Task.TaskID}, &cancelled)
	// Nothing resumed the approval: no execution was ever asked for under
	// the id a poll resumes it with.
	if st, err := f.client.Status(testCtx(t), approvalID+"-resume"); !errors.Is(err, executor.ErrNoSuchExecution) {
		t.Errorf("tasks/cancel resumed the approved call: %+v %v", st, err)
	}
	if rec, err := f.client.Approval(testCtx(t), approvalID); err != nil || rec.Status != approvals.StatusCancelled {
		t.Errorf("the approval after tasks/cancel: %+v %v, want it withdrawn", rec, err)
	}
	end := s.waitStatus(r.Task.TaskID, "cancelled", "completed", "failed")
	var res struct {
		IsError           bool           `json:"isError"`
		StructuredContent map[string]any `json:"structuredContent"`
	}
	s.ok("tasks/result", map[string]any{"taskId": r.Task.TaskID}, &res)
	if end.Status != "cancelled" || res.StructuredContent["orderId"] == "o-cancelled" {
		t.Fatalf("cancelled after its approval, before it ran: the task ended %s (%s), result %v; tasks/cancel answered %+v",
			end.Status, end.StatusMessage, res.StructuredContent, cancelled)
	}
}
