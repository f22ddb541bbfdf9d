package auth_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A producer with real credentials can neither read nor change the limits'
// counters (design §17): they name other principals' actors, and a counter
// an agent could reset would be no limit. Every way in is tried — a publish
// to a counter's subject, with and without JetStream's acknowledgement, a
// direct get, stream information, a purge, a message delete, a consumer —
// and the bucket is exactly as it was afterwards.
func TestForge_ProducerCannotReadOrChangeLimitCounters(t *testing.T) {
	t.Parallel()
	r := newRig(t, false)
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	bucket, stream := n.LimitsBucket(), "KV_"+n.LimitsBucket()
	secret := "user:bob-the-only-one"
	counter, err := envelope.Marshal(map[string]any{"v": envelope.Version, "kind": "rate", "capability": "t.echo",
		"per": "actor", "who": secret, "max": 1, "intervalMs": 3_600_000, "tat": time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	key := "r.a.0123456789abcdef0123456789abcdef.t.echo"
	rev, err := r.admin.Limits.Put(ctx, key, counter)
	if err != nil {
		t.Fatal(err)
	}
	before := r.world(t)
	_, aliceNC, _ := r.client(t, "alice", executor.SurfaceDirect)
	js := func(api string) string { return "$JS.API." + api }
	attempts := []struct {
		subject string
		body    any
	}{
		{"$KV." + bucket + "." + key, map[string]any{"v": envelope.Version, "kind": "rate", "max": 1000000}},
		{js("DIRECT.GET." + stream + ".$KV." + bucket + "." + key), nil},
		{js("DIRECT.GET." + stream), map[string]any{"last_by_subj": "$KV." + bucket + "." + key}},
		{js("STREAM.MSG.GET." + stream), map[string]any{"last_by_subj": "$KV." + bucket + "." + key}},
		{js("STREAM.INFO." + stream), map[string]any{"subjects_filter": ">"}},
		{js("STREAM.PURGE." + stream), map[string]any{"filter": "$KV." + bucket + "." + key}},
		{js("STREAM.MSG.DELETE." + stream), map[string]any{"seq": rev}},
		{js("CONSUMER.CREATE." + stream), map[string]any{"stream_name": stream, "config": map[string]any{"deliver_policy": "all", "ack_policy": "none"}}},
		{js("STREAM.DELETE." + stream), nil},
	}
	for _, a := range attempts {
		var body []byte
		if a.body != nil {
			body, _ = json.Marshal(a.body)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := aliceNC.RequestWithContext(short, a.subject, body)
		cancel()
		if err != nil {
			continue // refused: answered by nothing
		}
		if strings.Contains(string(m.Data), secret) || strings.Contains(string(m.Data), key) {
			t.Errorf("%s answered alice with the counter: %s", a.subject, m.Data)
		}
		if !strings.Contains(string(m.Data), "error") {
			t.Errorf("%s answered alice without an error: %s", a.subject, m.Data)
		}
	}
	// A plain publish, unacknowledged, too.
	if err := aliceNC.Publish("$KV."+bucket+"."+key, []byte("reset")); err != nil && !strings.Contains(err.Error(), "permission") {
		t.Fatal(err)
	}
	_ = aliceNC.FlushTimeout(2 * time.Second)
	after := r.world(t)
	if after.streams[stream] != before.streams[stream] {
		t.Errorf("the limits bucket changed: %+v, before %+v", after.streams[stream], before.streams[stream])
	}
	e, err := r.admin.Limits.Get(ctx, key)
	if err != nil {
		t.Fatalf("the counter after alice's attempts: %v", err)
	}
	if e.Revision() != rev || string(e.Value()) != string(counter) {
		t.Errorf("the counter after alice's attempts: revision %d (was %d), %q", e.Revision(), rev, e.Value())
	}
}
