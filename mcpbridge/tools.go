package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// metaKey prefixes the keys capstan sets in MCP _meta objects.
const metaKey = "capstan/"

// tool is one capability as an MCP tool.
type tool struct {
	def *mcp.Tool
	// wrapped: the capability's input is not a JSON object, so the tool takes
	// it as the property "input" of its arguments (MCP arguments are objects).
	wrapped bool
	// fingerprint changes when anything a client sees of the tool does.
	fingerprint string
}

// toolOf renders a descriptor as an MCP tool: the id as its name, the
// description, the input's JSON Schema, and hints derived from the metadata.
func toolOf(d executor.Descriptor) tool {
	schema, wrapped := objectSchema(d.InputSchema)
	desc := d.Description
	switch {
	case d.RequiresApproval:
		desc = strings.TrimSpace(desc + " Needs someone else's approval before it runs.")
	case len(d.ApprovalPolicies) > 0:
		desc = strings.TrimSpace(desc + " Some calls need someone else's approval before they run.")
	}
	t := &mcp.Tool{
		Name:        d.ID,
		Description: desc,
		InputSchema: schema,
		Annotations: annotationsOf(d),
		Meta: mcp.Meta{metaKey + "capability": map[string]any{
			"sideEffect": string(d.SideEffect), "risk": string(d.Risk), "idempotent": d.Idempotent,
			"requiresApproval": d.RequiresApproval, "mayRequireApproval": d.MayRequireApproval(), "timeoutMs": d.TimeoutMs,
			"retryMaxAttempts": d.RetryMaxAttempts, "tags": d.Tags,
		}},
	}
	fp, _ := json.Marshal(t)
	return tool{def: t, wrapped: wrapped, fingerprint: string(fp)}
}

// objectSchema returns an object schema for the input: the capability's own
// when it describes an object (or anything), else one that takes the input
// under "input".
func objectSchema(s map[string]any) (map[string]any, bool) {
	switch typ := s["type"]; {
	case len(s) == 0:
		return map[string]any{"type": "object"}, false
	case typ == "object":
		return s, false
	case typ == nil && s["properties"] != nil:
		out := make(map[string]any, len(s)+1)
		for k, v := range s {
			out[k] = v
		}
		out["type"] = "object"
		return out, false
	default:
		return map[string]any{"type": "object", "properties": map[string]any{"input": s}, "required": []string{"input"}}, true
	}
}

// annotationsOf derives the MCP tool hints from the side effect: read-only for
// none and read, destructive only for destructive, open-world only for
// external, idempotent as declared (reads are idempotent by nature).
func annotationsOf(d executor.Descriptor) *mcp.ToolAnnotations {
	readOnly := d.SideEffect == executor.None || d.SideEffect == executor.Read
	destructive := d.SideEffect == executor.Destructive
	openWorld := d.SideEffect == executor.External
	return &mcp.ToolAnnotations{
		ReadOnlyHint:    readOnly,
		DestructiveHint: &destructive,
		IdempotentHint:  d.Idempotent || readOnly,
		OpenWorldHint:   &openWorld,
	}
}

// Tools the bridge adds to every actor's server, beside the capabilities.
const (
	// ResumeTool runs an approved call: {"approvalId": "..."}.
	ResumeTool = "capstan.resume"
	// StatusTool reads an execution the caller started: {"executionId": "..."}.
	StatusTool = "capstan.status"
)

// reserved reports whether a capability id is one of the bridge's own tools;
// such a capability is not listed.
func reserved(id string) bool { return id == ResumeTool || id == StatusTool }

// view is one actor's MCP server and the tools it lists.
type view struct {
	b      *Bridge
	actor  envelope.Actor
	server *mcp.Server

	// refreshing serializes describe-and-apply, so that a later listing is
	// never overwritten by an earlier one.
	refreshing sync.Mutex

	mu     sync.Mutex
	loaded bool
	tools  map[string]tool
}

func newView(b *Bridge, actor envelope.Actor) *view {
	v := &view{b: b, actor: actor, tools: map[string]tool{}}
	v.server = mcp.NewServer(&mcp.Implementation{Name: b.cfg.Name, Version: b.cfg.Version}, &mcp.ServerOptions{
		Logger:       b.log,
		Instructions: instructions,
		Capabilities: serverCapabilities(),
		// A listing is one actor's: no intermediary may serve it to another.
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.CacheScope = "private" },
	})
	v.server.AddTool(resumeToolDef(), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := b.resume(ctx, v.actor, req)
		return b.answer(ctx, ResumeTool, res, err)
	})
	v.server.AddTool(statusToolDef(), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := b.status(ctx, v.actor, req)
		return b.answer(ctx, StatusTool, res, err)
	})
	b.routeTasks(v)
	return v
}

const instructions = "Each tool is a capstan capability: a call runs once, with its own execution id. " +
	"A call that needs an approval answers approval-required with an approval id; once someone else approved it, " +
	"make the same call again or call " + ResumeTool + " with the approval id. " + StatusTool +
	" reads the result of an execution you started."

// ready describes the catalog for the actor once, before the first listing.
func (v *view) ready(ctx context.Context) error {
	v.mu.Lock()
	loaded := v.loaded
	v.mu.Unlock()
	if loaded {
		return nil
	}
	err := v.refresh(ctx)
	if errors.Is(err, executor.ErrNoWorkers) {
		// Serve the bridge's own tools now; the capabilities follow, with
		// list_changed, when a worker serves again.
		v.b.log.Warn("no worker answers describe yet; the tool list starts empty", "actor", v.actor.String())
		v.mu.Lock()
		v.loaded = true
		v.mu.Unlock()
		return nil
	}
	return err
}

// refresh describes the catalog for the actor and changes only the tools
// that changed; the MCP server then tells the clients the list changed.
func (v *view) refresh(ctx context.Context) error {
	v.refreshing.Lock()
	defer v.refreshing.Unlock()
	d, err := v.b.c.Describe(ctx, executor.SurfaceMCP, v.actor, v.b.cfg.Scope)
	if err != nil {
		return fmt.Errorf("capstan: describe for %s: %w", v.actor.String(), err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	seen := make(map[string]bool, len(d.Capabilities))
	for _, desc := range d.Capabilities {
		if reserved(desc.ID) {
			v.b.log.Warn("capability not listed over MCP: its id is one of the bridge's tools", "capabilityId", desc.ID)
			continue
		}
		seen[desc.ID] = true
		t := toolOf(desc)
		if have, ok := v.tools[desc.ID]; ok && have.fingerprint == t.fingerprint {
			continue
		}
		v.tools[desc.ID] = t
		id := desc.ID
		v.server.AddTool(t.def, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			res, err := v.b.callTool(ctx, v, id, req)
			return v.b.answer(ctx, id, res, err)
		})
	}
	var gone []string
	for id := range v.tools {
		if !seen[id] {
			gone = append(gone, id)
			delete(v.tools, id)
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		v.server.RemoveTools(gone...)
	}
	v.loaded = true
	return nil
}

// lookup returns the tool as listed now.
func (v *view) lookup(id string) (tool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tools[id]
	return t, ok
}

func resumeToolDef() *mcp.Tool {
	f := false
	return &mcp.Tool{
		Name: ResumeTool,
		Description: "Runs a call that needed an approval, once someone else approved it. " +
			"Give the approvalId from the approval-required result. It runs at most once, whoever asks.",
		InputSchema: map[string]any{"type": "object", "required": []string{"approvalId"},
			"properties": map[string]any{"approvalId": map[string]any{"type": "string", "description": "The approval id."}}},
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &f, OpenWorldHint: &f},
	}
}

func statusToolDef() *mcp.Tool {
	f := false
	return &mcp.Tool{
		Name: StatusTool,
		Description: "Reads the result of an execution you started, by its executionId: the result if it ended, " +
			"else its state. Use it after a call that was still running or a lost connection.",
		InputSchema: map[string]any{"type": "object", "required": []string{"executionId"},
			"properties": map[string]any{"executionId": map[string]any{"type": "string", "description": "The execution id."}}},
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &f},
	}
}
