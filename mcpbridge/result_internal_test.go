package mcpbridge

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
)

// A completed result recovered from a lost attempt tells the model so, in
// its text and its meta, beside the output; one that was not says nothing of
// recovery.
func TestResultOf_RecoveredOutcomeToldToTheModel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		recovered *envelope.Recovered
		want      string
	}{
		{"not recovered", nil, ""},
		{"receipt", &envelope.Recovered{How: envelope.RecoveredByReceipt, Attempt: 1}, "recovered from the receipt"},
		{"reconciler", &envelope.Recovered{How: envelope.RecoveredByReconciler, Attempt: 2}, "recovered by checking the system"},
	} {
		env := &envelope.Envelope{ExecutionID: "x", Status: envelope.StatusCompleted, Output: envelope.MustRaw(map[string]any{"outboxSeq": 7}),
			Recovered: c.recovered}
		r := resultOf(env)
		var texts []string
		for _, ct := range r.Content {
			texts = append(texts, ct.(*mcp.TextContent).Text)
		}
		if r.IsError || texts[0] != `{"outboxSeq":7}` {
			t.Fatalf("%s: result %+v, texts %q: want the output first", c.name, r, texts)
		}
		how, _ := r.Meta[metaKey+"recovered"].(string)
		switch {
		case c.recovered == nil && (len(texts) != 1 || how != ""):
			t.Errorf("%s: texts %q, meta recovered %q: want the output alone", c.name, texts, how)
		case c.recovered != nil && (len(texts) != 2 || !strings.Contains(texts[1], c.want) ||
			!strings.Contains(texts[1], "Do not call it again") || how != c.recovered.How):
			t.Errorf("%s: texts %q, meta recovered %q: want the model told how (%q)", c.name, texts, how, c.want)
		}
	}
}

// A request the workers refused for the bridge principal's quota reaches
// the model as QUOTA_EXCEEDED with the figures to wait on, as a tool error;
// any other error is not taken for one.
func TestQuotaRefusal_TheModelSeesTheQuota(t *testing.T) {
	t.Parallel()
	res := quotaRefusal(fmt.Errorf("capstan: list approvals: %w",
		envelope.QuotaExceeded("", envelope.QuotaControlPerSecond, "control requests a second", 50, 20*time.Millisecond)))
	if res == nil || !res.IsError {
		t.Fatalf("result %+v", res)
	}
	me, ok := res.StructuredContent.(*envelope.ModelError)
	if !ok || me.Code != envelope.CodeQuotaExceeded || !me.Retryable || me.Details["quota"] != envelope.QuotaControlPerSecond ||
		me.Details["limit"] != int64(50) || me.Details["retryAfterMs"] != int64(20) {
		t.Fatalf("the model sees %+v", res.StructuredContent)
	}
	if quotaRefusal(errors.New("capstan: no worker")) != nil || quotaRefusal(nil) != nil {
		t.Fatal("another error taken for a quota's refusal")
	}
}
