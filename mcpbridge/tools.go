package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

// metaKey prefixes the keys capstan sets in MCP _meta objects.
const metaKey = "capstan/"

// ToolNames says how the bridge names capabilities as MCP tools.
type ToolNames string

const (
	// ToolNamesPortable (the default) name each tool so that every host takes
	// it: ^[a-zA-Z0-9_-]{1,64}$, which the Anthropic and OpenAI tool APIs
	// require of a tool's name. A capability id's dots become underscores
	// (orders.refund is orders_refund); an id longer than 64 bytes keeps its
	// first 55 and a hash. The capability id stays in the tool's
	// description and its _meta ("capstan/capability": {"id": ...}), and
	// the trail names the capability as ever. Two capabilities whose names
	// would be the same are refused (ErrToolNameCollision).
	ToolNamesPortable ToolNames = "portable"
	// ToolNamesCapabilityIDs name each tool by its capability id: valid MCP, but
	// hosts that pass tool names to a model API refuse the dots.
	ToolNamesCapabilityIDs ToolNames = "ids"
)

// ErrToolNameCollision: two capabilities would be listed under one tool name.
var ErrToolNameCollision = errors.New("capstan: two capabilities have one MCP tool name")

// ToolName is the MCP tool name of a capability id under n.
func ToolName(capabilityID string, n ToolNames) string {
	if n == ToolNamesCapabilityIDs {
		return capabilityID
	}
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, capabilityID)
	if len(name) > maxToolName {
		h := fnv.New32a()
		_, _ = h.Write([]byte(capabilityID))
		name = fmt.Sprintf("%s_%08x", name[:maxToolName-9], h.Sum32())
	}
	return name
}

// maxToolName is the longest tool name the model APIs take.
const maxToolName = 64

// tool is one capability as an MCP tool.
type tool struct {
	capID string
	def   *mcp.Tool
	// wrapped: the capability's input is not a JSON object, so the tool takes
	// it as the property "input" of its arguments (MCP arguments are objects).
	wrapped bool
	// fingerprint changes when anything a client sees of the tool does.
	fingerprint string
}

// toolOf renders a descriptor as an MCP tool: its name (see ToolNames), the
// description, the input's JSON Schema, and hints derived from the metadata.
func toolOf(d executor.Descriptor, names ToolNames) tool {
	schema, wrapped := objectSchema(d.InputSchema)
	name := ToolName(d.ID, names)
	desc := d.Description
	switch {
	case d.RequiresApproval:
		desc = strings.TrimSpace(desc + " Needs someone else's approval before it runs.")
	case len(d.ApprovalPolicies) > 0:
		desc = strings.TrimSpace(desc + " Some calls need someone else's approval before they run.")
	}
	if len(d.Limits) > 0 {
		// The model sees the limits before it calls (design §17).
		texts := make([]string, len(d.Limits))
		for i, l := range d.Limits {
			texts[i] = l.Text
		}
		desc = strings.TrimSpace(desc + " Limits: " + strings.Join(texts, "; ") + ".")
	}
	if p := d.Paused; p != nil {
		// An operator's pause (DESIGN §18): the model learns before it calls
		// that the tool will not run now.
		what := "calls wait until it is lifted"
		if p.Refuse {
			what = "calls fail at once with PAUSED"
		}
		desc = strings.TrimSpace("PAUSED by an operator (" + p.Reason + "): " + what + ". " + desc)
	}
	if name != d.ID {
		// The model and the people reading its transcript see which
		// capability the tool is.
		desc = strings.TrimSpace(desc + " (capstan capability " + d.ID + ")")
	}
	t := &mcp.Tool{
		Name:        name,
		Description: desc,
		InputSchema: schema,
		Annotations: annotationsOf(d),
		Meta: mcp.Meta{metaKey + "capability": map[string]any{
			"id": d.ID, "sideEffect": string(d.SideEffect), "risk": string(d.Risk), "idempotent": d.Idempotent,
			"requiresApproval": d.RequiresApproval, "mayRequireApproval": d.MayRequireApproval(), "timeoutMs": d.TimeoutMs,
			"retryMaxAttempts": d.RetryMaxAttempts, "tags": d.Tags,
		}},
	}
	if len(d.Limits) > 0 {
		t.Meta[metaKey+"capability"].(map[string]any)["limits"] = d.Limits
	}
	if d.Paused != nil {
		t.Meta[metaKey+"capability"].(map[string]any)["paused"] = d.Paused
	}
	fp, _ := json.Marshal(t)
	return tool{capID: d.ID, def: t, wrapped: wrapped, fingerprint: string(fp)}
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
	readOnly := d.SideEffect == executor.SideEffectNone || d.SideEffect == executor.SideEffectRead
	destructive := d.SideEffect == executor.SideEffectDestructive
	openWorld := d.SideEffect == executor.SideEffectExternal
	return &mcp.ToolAnnotations{
		ReadOnlyHint:    readOnly,
		DestructiveHint: &destructive,
		IdempotentHint:  d.Idempotent || readOnly,
		OpenWorldHint:   &openWorld,
	}
}

// Tools the bridge adds to every actor's server, beside the capabilities,
// named so that every host takes them.
const (
	// ResumeTool runs an approved call: {"approvalId": "..."}.
	ResumeTool = "capstan_resume"
	// StatusTool reads an execution the caller started: {"executionId": "..."}.
	StatusTool = "capstan_status"
)

// reserved reports whether a capability's tool name (or id) is one of the
// bridge's own tools, or their names before 0.x ("capstan.resume"); such a
// capability is not listed.
func reserved(name string) bool {
	switch name {
	case ResumeTool, StatusTool, "capstan.resume", "capstan.status":
		return true
	}
	return false
}

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
	tools  map[string]tool   // by tool name
	names  map[string]string // capability id to tool name
}

func newView(b *Bridge, actor envelope.Actor) *view {
	v := &view{b: b, actor: actor, tools: map[string]tool{}, names: map[string]string{}}
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
	// Tool names of this listing: a name two capabilities would share is
	// refused when the bridge starts (the first listing), and later keeps
	// the capability that had it.
	byName := make(map[string]executor.Descriptor, len(d.Capabilities))
	for _, desc := range d.Capabilities {
		name := ToolName(desc.ID, v.b.cfg.ToolNames)
		if reserved(name) || reserved(desc.ID) {
			v.b.log.Warn("capability not listed over MCP: its tool name is one of the bridge's tools", "capabilityId", desc.ID, "tool", name)
			continue
		}
		other, taken := byName[name]
		if !taken {
			byName[name] = desc
			continue
		}
		if !v.loaded {
			return fmt.Errorf("%w: %s and %s are both %s; rename one, or serve them with ToolNames %q (capstan mcp --tool-names ids) if every host takes dots",
				ErrToolNameCollision, other.ID, desc.ID, name, ToolNamesCapabilityIDs)
		}
		if have, ok := v.tools[name]; ok && have.capID == desc.ID {
			byName[name] = desc
		}
		v.b.log.Warn("capability not listed over MCP: another capability has its tool name", "capabilityId", desc.ID,
			"listed", byName[name].ID, "tool", name)
	}
	for name, desc := range byName {
		t := toolOf(desc, v.b.cfg.ToolNames)
		if have, ok := v.tools[name]; ok && have.fingerprint == t.fingerprint {
			continue
		}
		v.tools[name] = t
		v.names[desc.ID] = name
		id := desc.ID
		v.server.AddTool(t.def, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			res, err := v.b.callTool(ctx, v, id, req)
			return v.b.answer(ctx, id, res, err)
		})
	}
	var gone []string
	for name, t := range v.tools {
		if _, ok := byName[name]; !ok {
			gone = append(gone, name)
			delete(v.tools, name)
			if v.names[t.capID] == name {
				delete(v.names, t.capID)
			}
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		v.server.RemoveTools(gone...)
	}
	v.loaded = true
	return nil
}

// lookup returns the tool of a capability id as listed now.
func (v *view) lookup(capID string) (tool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tools[v.names[capID]]
	return t, ok
}

// byName returns the tool listed under name, or, for a client that calls a
// capability by its id (as hosts did before portable names), the tool of
// that capability.
func (v *view) byName(name string) (tool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if t, ok := v.tools[name]; ok {
		return t, true
	}
	t, ok := v.tools[v.names[name]]
	return t, ok
}

func resumeToolDef() *mcp.Tool {
	f := false
	return controlTool(ResumeTool, "Runs a call that needed an approval, once someone else approved it. "+
		"Give the approvalId from the approval-required result. It runs at most once, whoever asks.",
		"approvalId", "The approval id.", &mcp.ToolAnnotations{DestructiveHint: &f, OpenWorldHint: &f})
}

func statusToolDef() *mcp.Tool {
	f := false
	return controlTool(StatusTool, "Reads the result of an execution you started, by its executionId: the result if it ended, "+
		"else its state. Use it after a call that was still running or a lost connection.",
		"executionId", "The execution id.", &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &f})
}

// controlTool is one of the bridge's own tools: its input is one required
// string, an id.
func controlTool(name, description, id, idDescription string, annotations *mcp.ToolAnnotations) *mcp.Tool {
	return &mcp.Tool{
		Name:        name,
		Description: description,
		InputSchema: map[string]any{"type": "object", "required": []string{id},
			"properties": map[string]any{id: map[string]any{"type": "string", "description": idDescription}}},
		Annotations: annotations,
	}
}
