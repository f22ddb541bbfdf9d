package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/mcptasks"
)

// The core tasks of protocol 2025-11-25, which the clients people run today
// speak (the official TypeScript SDK's client.experimental.tasks among
// them): the server declares capabilities.tasks, each capability's tool
// execution.taskSupport "optional", and a tools/call whose params carry
// "task" is answered at once with {"task": {...}}; tasks/get, tasks/result
// (which waits for the end), tasks/list and tasks/cancel read and steer it.
// The task is the same durable execution as the 2026-07-28 extension's (see
// tasks.go): its id is the execution id, and it survives the bridge.
//
// The SDK this bridge is built on knows neither the "task" parameter of
// tools/call nor the tasks capability: a task parameter is moved into the
// request's _meta (coreTaskMeta) as the request comes in, by the transport
// (TasksTransport) or the HTTP handler, and the answers that carry what the
// SDK cannot say are written here.

// coreTaskMeta is where a tools/call's "task" parameter travels through the
// SDK: moved into _meta as it comes in.
const coreTaskMeta = "capstan/task"

// Core task statuses beyond the extension's: failed (a tool result with
// isError, per 2025-11-25).
const taskFailed = "failed"

// rawResult is a result the SDK has no type for, written as it is.
type rawResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *rawResult) MarshalJSON() ([]byte, error) { return r.raw, nil }

// coreSession reports whether ss negotiated the protocol of the core tasks.
func coreSession(ss *mcp.ServerSession) bool {
	if ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && ip.ProtocolVersion == mcptasks.CoreTasksVersion
}

func terminal(status string) bool {
	return status == mcptasks.TaskCompleted || status == taskFailed || status == mcptasks.TaskCancelled
}

// coreCapabilities are the tasks capabilities of 2025-11-25.
var coreCapabilities = map[string]any{
	"list": map[string]any{}, "cancel": map[string]any{},
	"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}},
}

// withCoreTasks adds capabilities.tasks to an initialize result.
func withCoreTasks(res mcp.Result) (mcp.Result, error) {
	m, err := jsonObject(res)
	if err != nil {
		return nil, err
	}
	caps, _ := m["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
	}
	caps["tasks"] = coreCapabilities
	m["capabilities"] = caps
	return rawResultOf(m)
}

// withTaskSupport marks each capability's tool of a tools/list result as one
// that may be called as a task; the bridge's own tools are answered at once.
func withTaskSupport(res mcp.Result) (mcp.Result, error) {
	lr, ok := res.(*mcp.ListToolsResult)
	if !ok {
		return res, nil
	}
	m, err := jsonObject(lr)
	if err != nil {
		return nil, err
	}
	tools, _ := m["tools"].([]any)
	for _, t := range tools {
		tm, ok := t.(map[string]any)
		if !ok || tm["name"] == ResumeTool || tm["name"] == StatusTool {
			continue
		}
		tm["execution"] = map[string]any{"taskSupport": "optional"}
	}
	return rawResultOf(m)
}

// jsonObject is v as the JSON object it marshals to, for a result to be
// given fields its type does not have.
func jsonObject(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// rawResultOf is the result whose JSON is m's.
func rawResultOf(m map[string]any) (mcp.Result, error) {
	out, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &rawResult{raw: out}, nil
}

// coreTaskOf is the 2025-11-25 view of the task: the extension's, with a
// tool result that isError failed, and an approval someone else must decide
// working (the requester has nothing to give: tasks/result would only wait).
func coreTaskOf(t *mcptasks.Task) *mcptasks.CoreTask {
	c := &mcptasks.CoreTask{TaskID: t.TaskID, Status: t.Status, StatusMessage: t.StatusMessage, CreatedAt: t.CreatedAt,
		LastUpdatedAt: t.LastUpdatedAt, TTL: t.TTLMs, PollInterval: t.PollIntervalMs}
	switch {
	case t.Status == mcptasks.TaskInputRequired:
		c.Status = mcptasks.TaskWorking
	case t.Status == mcptasks.TaskCompleted && t.Result != nil && t.Result.IsError:
		c.Status = taskFailed
	}
	return c
}

// coreCreate submits a task-augmented call and answers its task at once.
func (b *Bridge) coreCreate(ctx context.Context, actor envelope.Actor, capID string, input envelope.Raw) (mcp.Result, error) {
	id, answered, err := b.submitTask(ctx, actor, capID, input)
	defer answered()
	var ce *envelope.CapabilityError
	switch {
	case errors.As(err, &ce):
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: string(ce.Code) + ": " + ce.Message}
	case err != nil && explicitlyCancelled(ctx) && b.ctx.Err() == nil:
		b.cancelExecution(id)
		return nil, ctx.Err()
	case err != nil:
		b.log.Warn("MCP task not submitted", "executionId", id, "err", err)
		data, _ := json.Marshal(map[string]string{"executionId": id})
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Data: data,
			Message: "capstan is unavailable: the call may or may not have been taken; tasks/get " + id + " tells"}
	}
	now := time.Now().UTC()
	t := b.task(id, now, now)
	t.Status, t.StatusMessage = mcptasks.TaskWorking, "queued"
	c := coreTaskOf(t)
	return &mcptasks.CreateTaskResult{ResultBase: mcp.ResultBase{Meta: mcp.Meta{relatedTaskMeta: map[string]any{"taskId": id},
		// What a host may hand the model at once while the task runs.
		"io.modelcontextprotocol/model-immediate-response": "Started as task " + id + "; its result follows when it ends."}},
		Task: c}, nil
}

// coreGet is tasks/get of the core tasks (resume: see getTask).
func (b *Bridge) coreGet(ctx context.Context, actor envelope.Actor, taskID string, resume bool) (*mcptasks.CoreTask, *mcptasks.Task, error) {
	t, err := b.getTask(ctx, actor, taskID, resume)
	if err != nil {
		return nil, nil, err
	}
	return coreTaskOf(t), t, nil
}

// coreResult is tasks/result: it waits until the task ends, then answers
// what the tools/call would have.
func (b *Bridge) coreResult(ctx context.Context, actor envelope.Actor, taskID string) (*mcp.CallToolResult, error) {
	for {
		c, t, err := b.coreGet(ctx, actor, taskID, true)
		if err != nil {
			return nil, err
		}
		if terminal(c.Status) {
			res := t.Result
			if res == nil {
				res = refusal(envelope.CodeCancelled, c.StatusMessage)
			}
			if res.Meta == nil {
				res.Meta = mcp.Meta{}
			}
			res.Meta[relatedTaskMeta] = map[string]any{"taskId": taskID}
			return res, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.ctx.Done():
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the bridge is shutting down; ask tasks/result again"}
		case <-time.After(pollIntervalMs * time.Millisecond):
		}
	}
}

// coreCancelWait bounds how long tasks/cancel waits for the task to end.
const coreCancelWait = 5 * time.Second

// coreCancel is tasks/cancel: refused for a task that has ended; otherwise
// the execution is cancelled (a pending or approved approval withdrawn:
// tasks/cancel never resumes one) and the task answered as it stands once
// it ended, or the wait ran out. A handler that returned before the cancel
// reached its worker ends completed: the task says so rather than claim a
// cancel that did not happen.
func (b *Bridge) coreCancel(ctx context.Context, actor envelope.Actor, taskID string) (*mcptasks.CoreTask, error) {
	c, _, err := b.coreGet(ctx, actor, taskID, false)
	if err != nil {
		return nil, err
	}
	if terminal(c.Status) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Task " + taskID + " has already ended: " + c.Status}
	}
	if err := b.cancelTask(ctx, actor, taskID); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(coreCancelWait)
	for {
		c, _, err = b.coreGet(ctx, actor, taskID, false)
		if err != nil || terminal(c.Status) || time.Now().After(deadline) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// coreListPage is how many tasks tasks/list answers at once.
const coreListPage = 50

// coreList is tasks/list: the actor's tasks, newest first, from the
// executions the workers list for the bridge's principal.
func (b *Bridge) coreList(ctx context.Context, actor envelope.Actor, cursor string) (*mcptasks.ListTasksResult, error) {
	page, err := b.c.Executions(ctx, executor.ExecutionsRequest{Cursor: cursor,
		Query: audit.Query{Actor: actor.Kind + ":" + actor.ID, Limit: coreListPage}})
	if err != nil {
		if strings.Contains(err.Error(), "cursor") {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Invalid cursor"}
		}
		return nil, err
	}
	out := &mcptasks.ListTasksResult{Tasks: []*mcptasks.CoreTask{}, NextCursor: page.Next}
	ttl := b.task("", time.Time{}, time.Time{}).TTLMs
	for _, e := range page.Entries {
		// The bridge's tasks: ids it made for this actor.
		if e.Surface != string(executor.SurfaceMCP) || !tagged(e.ExecutionID) || !b.owns(ctx, actor, e.ExecutionID) {
			continue
		}
		c := &mcptasks.CoreTask{TaskID: e.ExecutionID, CreatedAt: createdOf(e.ExecutionID, e.RequestedAt).Format(time.RFC3339Nano),
			LastUpdatedAt: e.UpdatedAt.Format(time.RFC3339Nano), TTL: ttl, PollInterval: pollIntervalMs}
		switch e.Status {
		case audit.EntryRunning:
			c.Status, c.StatusMessage = mcptasks.TaskWorking, "running"
			if p := b.live.of(e.ExecutionID, 0, nil); p != nil {
				c.StatusMessage += ": " + reportText(p)
			}
		case audit.EntryQueued:
			// Waiting in its queue: not taken yet, held by a pause, or waiting at a limit.
			c.Status, c.StatusMessage = mcptasks.TaskWorking, "queued"
		case audit.EntryApprovalRequired:
			c.Status, c.StatusMessage = mcptasks.TaskWorking, "waiting for approval "+e.ApprovalID
		case audit.EntryCompleted:
			c.Status = mcptasks.TaskCompleted
		case audit.EntryFailed:
			c.Status, c.StatusMessage = taskFailed, e.Code
		case audit.EntryCancelled:
			c.Status, c.StatusMessage = mcptasks.TaskCancelled, e.Code
		default:
			continue
		}
		out.Tasks = append(out.Tasks, c)
	}
	return out, nil
}

// tagged reports whether id carries the tag of the actor that made it (an
// id the bridge made for a call).
func tagged(id string) bool { return len(id) == uuidLen+1+tagLen && id[uuidLen] == '-' }

// moveTaskParam moves a tools/call request's "task" parameter into its
// _meta (coreTaskMeta), where the SDK keeps it; other messages are left as
// they are. It reports whether it changed anything.
func moveTaskParam(method string, params json.RawMessage) (json.RawMessage, bool) {
	if method != "tools/call" || !bytes.Contains(params, []byte(`"task"`)) {
		return params, false
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params, false
	}
	task, ok := p["task"]
	if !ok || string(task) == "null" {
		return params, false
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := p["_meta"]; ok {
		if json.Unmarshal(raw, &meta) != nil {
			return params, false
		}
	}
	meta[coreTaskMeta] = task
	delete(p, "task")
	var err error
	if p["_meta"], err = json.Marshal(meta); err != nil {
		return params, false
	}
	out, err := json.Marshal(p)
	if err != nil {
		return params, false
	}
	return out, true
}

// TasksTransport wraps a transport (stdio, in memory) so that the core
// tasks' tools/call of a 2025-11-25 client reaches the bridge: serve a
// Bridge.Server over it. Bridge.Handler does the same for HTTP itself.
func TasksTransport(t mcp.Transport) mcp.Transport { return tasksTransport{t} }

type tasksTransport struct{ mcp.Transport }

func (t tasksTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return tasksConnection{c}, nil
}

type tasksConnection struct{ mcp.Connection }

func (c tasksConnection) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if req, ok := m.(*jsonrpc.Request); ok && err == nil {
		if p, changed := moveTaskParam(req.Method, req.Params); changed {
			req.Params = p
		}
	}
	return m, err
}

// maxTaskBody bounds the request bodies the HTTP handler looks into for a
// task parameter; a larger body is passed on unread (the SDK refuses it).
const maxTaskBody = 4 << 20

// httpTasks moves the task parameter of each tools/call a POST carries into
// its _meta, before the SDK's handler decodes it.
func httpTasks(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil || r.ContentLength > maxTaskBody {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxTaskBody+1))
		_ = r.Body.Close()
		if err != nil || len(body) > maxTaskBody {
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
			next.ServeHTTP(w, r)
			return
		}
		if bytes.Contains(body, []byte(`"task"`)) {
			body = moveTaskParams(body)
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// moveTaskParams applies moveTaskParam to a JSON-RPC message or batch.
func moveTaskParams(body []byte) []byte {
	one := func(raw json.RawMessage) (json.RawMessage, bool) {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return raw, false
		}
		var method string
		if json.Unmarshal(m["method"], &method) != nil {
			return raw, false
		}
		p, changed := moveTaskParam(method, m["params"])
		if !changed {
			return raw, false
		}
		m["params"] = p
		out, err := json.Marshal(m)
		return out, err == nil
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return body
		}
		changed := false
		for i, m := range batch {
			if out, ok := one(m); ok {
				batch[i], changed = out, true
			}
		}
		if !changed {
			return body
		}
		out, err := json.Marshal(batch)
		if err != nil {
			return body
		}
		return out
	}
	if out, ok := one(trimmed); ok {
		return out
	}
	return body
}
