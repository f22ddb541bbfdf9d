package mcpbridge_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// hostNames is what the Anthropic and OpenAI tool APIs take as a tool's name.
var hostNames = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func TestToolName_EveryHostTakesIt(t *testing.T) {
	t.Parallel()
	long := "a" + strings.Repeat(".abcdefghij", 12) // 121 bytes, a valid id
	for _, tc := range []struct {
		id, want string
	}{
		{"demo.echo", "demo_echo"},
		{"orders.refund", "orders_refund"},
		{"crm.contact.get-by_email", "crm_contact_get-by_email"},
		{"plain", "plain"},
		{long, ""}, // shortened with a hash: checked below
	} {
		got := mcpbridge.ToolName(tc.id, mcpbridge.ToolNamesPortable)
		if !hostNames.MatchString(got) {
			t.Errorf("%s is named %q, which hosts refuse", tc.id, got)
		}
		if tc.want != "" && got != tc.want {
			t.Errorf("%s is named %q, want %q", tc.id, got, tc.want)
		}
		if ids := mcpbridge.ToolName(tc.id, mcpbridge.ToolNamesCapabilityIDs); ids != tc.id {
			t.Errorf("with ToolNamesCapabilityIDs %s is named %q", tc.id, ids)
		}
	}
	if a, b := mcpbridge.ToolName(long, mcpbridge.ToolNamesPortable), mcpbridge.ToolName(long+"x", mcpbridge.ToolNamesPortable); a == b {
		t.Errorf("two long ids share the name %s", a)
	}
	for _, own := range []string{mcpbridge.ResumeTool, mcpbridge.StatusTool} {
		if !hostNames.MatchString(own) {
			t.Errorf("the bridge's own tool %q is refused by hosts", own)
		}
	}
}

// Every tool's name is one hosts take; the capability id is in its
// description and its _meta; a capability called by its id (as before) still
// runs; a capability whose policies may ask for an approval says so.
func TestToolNames_PortableByDefault_TheIDStaysVisible(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	cs := f.connectMemory(t, alice, newEvents())
	res, err := cs.ListTools(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var refund *mcp.Tool
	for _, tl := range res.Tools {
		if !hostNames.MatchString(tl.Name) {
			t.Errorf("tool %q: hosts refuse its name", tl.Name)
		}
		if tl.Name == "orders_refund" {
			refund = tl
		}
	}
	if refund == nil {
		t.Fatal("orders.refund is not listed as orders_refund")
	}
	if !strings.Contains(refund.Description, "capstan capability orders.refund") ||
		!strings.Contains(refund.Description, "Some calls need someone else's approval") {
		t.Errorf("orders_refund's description: %q", refund.Description)
	}
	if m, _ := refund.Meta["capstan/capability"].(map[string]any); m["id"] != "orders.refund" || m["mayRequireApproval"] != true {
		t.Errorf("orders_refund's _meta: %v", refund.Meta)
	}
	for _, name := range []string{"demo_echo", "demo.echo"} {
		res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"via": name}})
		if err != nil || res.IsError {
			t.Fatalf("call %s: %v %s", name, err, textOf(res))
		}
		if got := structured(t, res)["via"]; got != name {
			t.Fatalf("call %s answered %v", name, got)
		}
	}
}

// Two capabilities whose tool names would be one are refused when the bridge
// starts serving, naming both; with the ids as names they are both listed.
func TestToolNames_CollisionRefusedAtStart(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	echo := func(id string) executor.Capability {
		return executor.Define(id, executor.Meta{Description: "Echoes.", Expose: executor.On(executor.SurfaceMCP), SideEffect: executor.SideEffectNone},
			func(ctx context.Context, c executor.Call[blockIn]) (string, error) { return id, nil })
	}
	f.runWorker(t, "twins", echo("twin.a_b"), echo("twin_a.b"))
	b, err := mcpbridge.New(f.nc, mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Server(testCtx(t), alice)
	if !errors.Is(err, mcpbridge.ErrToolNameCollision) || !strings.Contains(err.Error(), "twin.a_b") || !strings.Contains(err.Error(), "twin_a.b") {
		t.Fatalf("serving two capabilities named twin_a_b: %v, want ErrToolNameCollision naming both", err)
	}
	ids, err := mcpbridge.New(f.nc, mcpbridge.Config{ToolNames: mcpbridge.ToolNamesCapabilityIDs})
	if err != nil {
		t.Fatal(err)
	}
	defer ids.Close()
	if _, err := ids.Server(testCtx(t), alice); err != nil {
		t.Fatalf("with the ids as names: %v", err)
	}
}
