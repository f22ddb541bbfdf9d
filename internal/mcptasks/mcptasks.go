// Package mcptasks holds the shapes the MCP bridge answers in beyond the
// SDK's: the Tasks extension's and the 2025-11-25 core tasks' (task,
// parameters, results) and the structured content of a call that waits for
// an approval or outlived its wait (docs/mcp.md describes them). Package
// mcpbridge writes them; its tests read them.
package mcptasks

import (
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TasksExtension is the Tasks extension's identifier.
const TasksExtension = "io.modelcontextprotocol/tasks"

// Task statuses.
const (
	TaskWorking       = "working"
	TaskInputRequired = "input_required"
	TaskCompleted     = "completed"
	TaskFailed        = "failed"
	TaskCancelled     = "cancelled"
)

// Task is the extension's task shape: CreateTaskResult (resultType "task")
// and the result of tasks/get (resultType "complete").
type Task struct {
	mcp.ResultBase
	// ResultType is "task" when a tools/call is answered with the task,
	// "complete" in the answer of tasks/get.
	ResultType string `json:"resultType"`
	// TaskID is the task's id: the id of the execution the call made.
	TaskID string `json:"taskId"`
	// Status is TaskWorking, TaskInputRequired (an approval is pending),
	// TaskCompleted (also when the tool's result is an error) or
	// TaskCancelled.
	Status string `json:"status"`
	// StatusMessage says where the execution is, in words: "queued", its
	// attempt and latest progress report, the approval it waits for, or
	// how it ended.
	StatusMessage string `json:"statusMessage,omitempty"`
	// CreatedAt is when the execution's record was created (RFC 3339); the
	// time of the answer while no worker has claimed it.
	CreatedAt string `json:"createdAt"`
	// LastUpdatedAt is when the execution last changed (RFC 3339): its
	// record's last write, its envelope, or its approval's request.
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTLMs is how long the task's result is kept, in milliseconds: the
	// envelope retention the bridge's client read.
	TTLMs *int64 `json:"ttlMs"`
	// PollIntervalMs is how often a client should ask tasks/get, in
	// milliseconds (1000).
	PollIntervalMs int64 `json:"pollIntervalMs,omitempty"`
	// InputRequests, while an approval is pending, holds one form
	// elicitation under "approval-<id>" with nothing to fill in: someone
	// else decides; the requester may only decline it to withdraw the call.
	InputRequests map[string]any `json:"inputRequests,omitempty"`
	// Result is the tool's result once the execution ended (completed,
	// failed or cancelled), as tools/call would have answered it.
	Result *mcp.CallToolResult `json:"result,omitempty"`
	// Error is the extension's field for a task that failed as a protocol
	// error; the bridge leaves it nil and puts every outcome in Result.
	Error *jsonrpc.Error `json:"error,omitempty"`
}

// MarshalJSON writes the task with its result in the tool result's standard
// shape (resultType "complete"), as the extension's completed task carries it.
func (t Task) MarshalJSON() ([]byte, error) {
	type plain Task
	p := struct {
		plain
		Result any `json:"result,omitempty"`
	}{plain: plain(t)}
	if t.Result != nil {
		p.Result = CompleteResult{t.Result}
	}
	return json.Marshal(p)
}

// TaskParams are the parameters of tasks/get, tasks/update and tasks/cancel.
type TaskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"` // the task asked about
	// InputResponses answer a task's InputRequests (tasks/update), under
	// their keys: {"action": "decline"} (or "cancel") to an approval's
	// request withdraws the call; anything else is ignored.
	InputResponses map[string]any `json:"inputResponses,omitempty"`
}

// Ack is the empty acknowledgement of tasks/update and tasks/cancel.
type Ack struct {
	mcp.ResultBase
	ResultType string `json:"resultType"` // always "complete"
}

// CompleteResult is a tool result marked resultType "complete", the standard
// shape of a call the Tasks extension could have answered with a task.
type CompleteResult struct{ *mcp.CallToolResult }

// MarshalJSON writes the result with resultType "complete".
func (r CompleteResult) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.CallToolResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["resultType"] = json.RawMessage(`"complete"`)
	return json.Marshal(m)
}

// CoreTasksVersion is the protocol version whose sessions get the core tasks.
const CoreTasksVersion = "2025-11-25"

// CoreTask is a 2025-11-25 task: the result of tasks/get and tasks/cancel,
// and the "task" of CreateTaskResult and of tasks/list.
type CoreTask struct {
	mcp.ResultBase
	TaskID string `json:"taskId"` // the id of the execution the call made
	// Status is as Task's, except that a tool result that is an error is
	// "failed", and a pending approval, which someone else decides, is
	// TaskWorking.
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"` // as Task.StatusMessage
	CreatedAt     string `json:"createdAt"`               // as Task.CreatedAt (RFC 3339)
	LastUpdatedAt string `json:"lastUpdatedAt"`           // as Task.LastUpdatedAt (RFC 3339)
	TTL           *int64 `json:"ttl"`                     // as Task.TTLMs, in milliseconds
	PollInterval  int64  `json:"pollInterval,omitempty"`  // as Task.PollIntervalMs, in milliseconds
}

// CreateTaskResult answers a task-augmented tools/call.
type CreateTaskResult struct {
	mcp.ResultBase
	Task *CoreTask `json:"task"` // the call's new task, working ("queued")
}

// ListTasksParams are the parameters of tasks/list.
type ListTasksParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"` // a previous answer's NextCursor; empty for the newest tasks
}

// ListTasksResult answers tasks/list.
type ListTasksResult struct {
	mcp.ResultBase
	Tasks      []*CoreTask `json:"tasks"`                // the actor's tasks made through the bridge, newest first
	NextCursor string      `json:"nextCursor,omitempty"` // where the next, older page starts; empty at the end
}

// ApprovalRequired is the structured content of a call that waits for an
// approval.
type ApprovalRequired struct {
	Status       string    `json:"status"`            // "approval-required"
	ExecutionID  string    `json:"executionId"`       // the execution that asked; nothing of it ran
	CapabilityID string    `json:"capabilityId"`      // the tool's capability
	ApprovalID   string    `json:"approvalId"`        // what an approver decides, and the resume tool takes
	Reasons      []string  `json:"reasons,omitempty"` // why an approval is needed
	Types        []string  `json:"types,omitempty"`   // the approver types that may decide it; empty for any
	ExpiresAt    time.Time `json:"expiresAt"`         // when the approval expires undecided
	Next         string    `json:"next"`              // what to do next, in words a model follows
}

// StillRunning is the structured content of a call whose execution outlived
// Config.CallTimeout.
type StillRunning struct {
	Status      string `json:"status"`      // "running", or "queued" when no live worker serves the capability
	ExecutionID string `json:"executionId"` // the execution, to read later with the status tool
	Next        string `json:"next"`        // what to do next, in words a model follows
}
