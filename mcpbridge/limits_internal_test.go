package mcpbridge

import (
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/executor"
)

// A tool tells the model its capability's limits, in words, before it calls.
func TestTool_ShowsTheCapabilitysLimits(t *testing.T) {
	t.Parallel()
	d := executor.Descriptor{ID: "orders.refund", Description: "Refunds an order.", SideEffect: executor.SideEffectWrite,
		Limits: []executor.LimitInfo{{Kind: executor.LimitRate, Per: executor.LimitPerActor, Max: 5, IntervalMs: 60000,
			AtLimit: executor.AtLimitRefuse, Text: "5 per 1m per actor"}}}
	tl := toolOf(d, ToolNamesPortable)
	if !strings.Contains(tl.def.Description, "Limits: 5 per 1m per actor.") {
		t.Errorf("description %q", tl.def.Description)
	}
	meta, _ := tl.def.Meta[metaKey+"capability"].(map[string]any)
	if ls, _ := meta["limits"].([]executor.LimitInfo); len(ls) != 1 {
		t.Errorf("meta %+v", meta)
	}
	plain := toolOf(executor.Descriptor{ID: "demo.echo", Description: "Echoes."}, ToolNamesPortable)
	if strings.Contains(plain.def.Description, "Limits") {
		t.Errorf("a capability without limits: %q", plain.def.Description)
	}
	if _, ok := plain.def.Meta[metaKey+"capability"].(map[string]any)["limits"]; ok {
		t.Error("a capability without limits has limits in its meta")
	}
}
