package mcpbridge_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/mcptasks"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// connectTasks connects a client that declares the Tasks extension.
func (f *fixture) connectTasks(t *testing.T, b *mcpbridge.Bridge, actor envelope.Actor) *mcp.ClientSession {
	t.Helper()
	ctx := testCtx(t)
	srv, err := b.Server(ctx, actor)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	caps := &mcp.ClientCapabilities{}
	caps.AddExtension(mcptasks.TasksExtension, map[string]any{})
	client := mcp.NewClient(&mcp.Implementation{Name: "tasks", Version: "v0"}, &mcp.ClientOptions{Capabilities: caps})
	for _, m := range []string{"tasks/get"} {
		if err := mcp.AddSendingCustomMethod[*mcptasks.TaskParams, *mcptasks.Task](client, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"tasks/cancel", "tasks/update"} {
		if err := mcp.AddSendingCustomMethod[*mcptasks.TaskParams, *mcptasks.Ack](client, m); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// createTask calls a tool and returns the task id of its CreateTaskResult.
func createTask(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := res.Meta["io.modelcontextprotocol/related-task"].(map[string]any)
	id, _ := rel["taskId"].(string)
	if id == "" || len(res.Content) != 0 {
		t.Fatalf("tools/call did not answer a task: %+v", res)
	}
	return id
}

func getTask(t *testing.T, cs *mcp.ClientSession, id string) *mcptasks.Task {
	t.Helper()
	task, err := mcp.CallCustomMethod[*mcptasks.TaskParams, *mcptasks.Task](testCtx(t), cs, "tasks/get", &mcptasks.TaskParams{TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	if task.TaskID != id || task.ResultType != "complete" {
		t.Fatalf("tasks/get = %+v", task)
	}
	return task
}

// pollTask polls until the task's status is one of want.
func pollTask(t *testing.T, cs *mcp.ClientSession, id string, want ...string) *mcptasks.Task {
	t.Helper()
	ctx := testCtx(t)
	for {
		task := getTask(t, cs, id)
		for _, w := range want {
			if task.Status == w {
				return task
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("task %s stayed %s (%s), want %v", id, task.Status, task.StatusMessage, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestTasks_CallAnswersATaskThatCompletes(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	cs := f.connectTasks(t, f.bridge, alice)
	id := createTask(t, cs, "demo.echo", map[string]any{"n": 1})
	task := pollTask(t, cs, id, mcptasks.TaskCompleted)
	if task.Result == nil || task.Result.IsError {
		t.Fatalf("completed task result = %+v", task.Result)
	}
	j, _ := json.Marshal(task.Result.StructuredContent)
	if string(j) != `{"n":1}` {
		t.Errorf("result = %s", j)
	}
	// Another actor cannot read it.
	other := f.connectTasks(t, f.bridge, bob)
	if _, err := mcp.CallCustomMethod[*mcptasks.TaskParams, *mcptasks.Task](testCtx(t), other, "tasks/get",
		&mcptasks.TaskParams{TaskID: id}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("bob read alice's task: %v", err)
	}
}

func TestTasks_ApprovalIsInputRequired_ThenRunsOnce_AcrossABridgeRestart(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	cs := f.connectTasks(t, f.bridge, alice)
	id := createTask(t, cs, "orders.refund", map[string]any{"orderId": "o-task", "amount": 800})
	task := pollTask(t, cs, id, mcptasks.TaskInputRequired)
	if len(task.InputRequests) != 1 {
		t.Fatalf("input_required without one input request: %+v", task)
	}
	var approvalID string
	for key := range task.InputRequests {
		approvalID = strings.TrimPrefix(key, "approval-")
	}
	if _, err := f.client.Decide(testCtx(t), approvalID, approvals.Verdict{Approve: true, Approver: bob}); err != nil {
		t.Fatal(err)
	}

	// A new bridge, with no memory of the task, answers for it.
	restarted, err := mcpbridge.New(f.nc, mcpbridge.Config{TaskAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	cs2 := f.connectTasks(t, restarted, alice)
	done := pollTask(t, cs2, id, mcptasks.TaskCompleted)
	if done.Result == nil || done.Result.IsError {
		t.Fatalf("result = %+v", done.Result)
	}
	// Polling both bridges again runs nothing more: the approval authorized
	// one execution.
	_ = getTask(t, cs, id)
	rec, err := f.client.Approval(testCtx(t), approvalID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != approvals.StatusConsumed || rec.ConsumedBy != approvalID+"-resume" {
		t.Errorf("approval = %s consumed by %s", rec.Status, rec.ConsumedBy)
	}
}

func TestTasks_CancelCancelsTheExecution(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	cs := f.connectTasks(t, f.bridge, alice)
	id := createTask(t, cs, "test.block", map[string]any{"note": "t"})
	select {
	case <-f.started:
	case <-testCtx(t).Done():
		t.Fatal("test.block never started")
	}
	if _, err := mcp.CallCustomMethod[*mcptasks.TaskParams, *mcptasks.Ack](testCtx(t), cs, "tasks/cancel",
		&mcptasks.TaskParams{TaskID: id}); err != nil {
		t.Fatal(err)
	}
	task := pollTask(t, cs, id, mcptasks.TaskCancelled, mcptasks.TaskCompleted)
	if task.Status != mcptasks.TaskCancelled {
		t.Errorf("task = %s %+v", task.Status, task.Result)
	}
}

func TestTasks_WithoutTheExtensionTheCallBlocks(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	cs := f.connectMemory(t, alice, newEvents())
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"a": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta["io.modelcontextprotocol/related-task"] != nil || textOf(res) != `{"a":1}` {
		t.Errorf("a client without the extension got %+v", res)
	}
}

func TestTasks_DeclineWithdrawsTheApprovalRequest(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	cs := f.connectTasks(t, f.bridge, alice)
	id := createTask(t, cs, "orders.refund", map[string]any{"orderId": "o-decline", "amount": 800})
	task := pollTask(t, cs, id, mcptasks.TaskInputRequired)
	responses := map[string]any{}
	for key := range task.InputRequests {
		responses[key] = map[string]any{"action": "decline"}
	}
	if _, err := mcp.CallCustomMethod[*mcptasks.TaskParams, *mcptasks.Ack](testCtx(t), cs, "tasks/update",
		&mcptasks.TaskParams{TaskID: id, InputResponses: responses}); err != nil {
		t.Fatal(err)
	}
	pollTask(t, cs, id, mcptasks.TaskCancelled)
}

func TestTasks_MethodsRefuseAClientWithoutTheExtension(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: -1})
	ctx := testCtx(t)
	srv, err := f.bridge.Server(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "plain", Version: "v0"}, nil)
	if err := mcp.AddSendingCustomMethod[*mcptasks.TaskParams, *mcptasks.Task](client, "tasks/get"); err != nil {
		t.Fatal(err)
	}
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	_, err = mcp.CallCustomMethod[*mcptasks.TaskParams, *mcptasks.Task](ctx, cs, "tasks/get", &mcptasks.TaskParams{TaskID: "x"})
	if err == nil || !strings.Contains(err.Error(), "Missing required client capability") {
		t.Errorf("tasks/get without the extension = %v", err)
	}
}

func TestTasks_AQuickCallAnswersItsResult_AnApprovalATask(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: time.Minute})
	cs := f.connectTasks(t, f.bridge, alice)
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "demo.echo", Arguments: map[string]any{"q": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Meta["io.modelcontextprotocol/related-task"] != nil || textOf(res) != `{"q":1}` {
		t.Errorf("a quick call answered %+v", res)
	}
	id := createTask(t, cs, "orders.refund", map[string]any{"orderId": "o-quick", "amount": 600})
	if task := getTask(t, cs, id); task.Status != mcptasks.TaskInputRequired {
		t.Errorf("task = %s", task.Status)
	}
}
