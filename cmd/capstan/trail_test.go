package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/trail"
)

// The audit log as a user of the command line meets it: dev signs it with a
// development key, an execution is proved with its envelope, a checkpoint
// copied out is kept, the log is exported and verified offline against it,
// and a bundle whose event was edited fails, naming the event.
func TestAuditLog_DevProveExportVerifyOffline(t *testing.T) {
	t.Parallel()
	d, url := startDev(t)
	pub := ""
	for _, line := range strings.Split(d.out.String(), "\n") {
		if _, after, ok := strings.Cut(line, "capstan audit verify --key "); ok {
			pub = strings.TrimSpace(after)
		}
	}
	if pub == "" {
		t.Fatalf("dev did not say where its audit key is:\n%s", d.out.String())
	}
	out, _, code := capstan(t, url, "call", "demo.echo", "--input", `{"hello":"world"}`, "-o", "json")
	if code != exitOK {
		t.Fatalf("call: %d\n%s", code, out)
	}
	id := decode[struct {
		ExecutionID string `json:"executionId"`
	}](t, out).ExecutionID

	out, errOut, code := capstan(t, url, "audit", "prove", id, "--key", pub)
	if code != exitOK || !strings.Contains(out, "verified") || !strings.Contains(out, "committed to by the terminal event") {
		t.Fatalf("audit prove: %d\n%s%s", code, out, errOut)
	}
	out, _, code = capstan(t, url, "audit", "prove", id, "--key", pub, "-o", "json")
	if code != exitOK || len(decode[struct {
		Messages []json.RawMessage `json:"messages"`
	}](t, out).Messages) == 0 {
		t.Fatalf("audit prove -o json: %d\n%s", code, out)
	}

	dir := t.TempDir()
	kept := filepath.Join(dir, "kept")
	out, _, code = capstan(t, url, "audit", "checkpoint", "--key", pub)
	if code != exitOK || !strings.Contains(out, "\n— ") {
		t.Fatalf("audit checkpoint: %d\n%s", code, out)
	}
	if err := os.WriteFile(kept, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		out, _, _ = capstan(t, url, "call", "demo.echo", "--input", `{"hello":"again"}`, "-o", "json")
	}
	// Proved once a checkpoint covers the last call: the one --keep keeps
	// below is larger than the kept one.
	id = decode[struct {
		ExecutionID string `json:"executionId"`
	}](t, out).ExecutionID
	if out, errOut, code := capstan(t, url, "audit", "prove", id, "--key", pub); code != exitOK {
		t.Fatalf("audit prove of the last call: %d\n%s%s", code, out, errOut)
	}
	bundle := filepath.Join(dir, "bundle")
	if _, errOut, code := capstan(t, url, "audit", "export", "--out", bundle); code != exitOK {
		t.Fatalf("audit export: %d\n%s", code, errOut)
	}
	out, errOut, code = capstan(t, "nats://127.0.0.1:1", "audit", "verify", "--bundle", bundle, "--key", pub, "--since", kept)
	if code != exitOK || !strings.Contains(out, "holds: every event it covered") {
		t.Fatalf("audit verify of the bundle: %d\n%s%s", code, out, errOut)
	}
	out, _, code = capstan(t, url, "audit", "verify", "--key", pub, "--since", bundle)
	if code != exitOK || !strings.Contains(out, "verified") {
		t.Fatalf("audit verify of the deployment since the bundle: %d\n%s", code, out)
	}
	// A witness keeps the latest checkpoint once it proved it extends the
	// one it kept: verify --since and --keep the same file.
	before, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := capstan(t, url, "audit", "verify", "--key", pub, "--since", kept, "--keep", kept); code != exitOK {
		t.Fatalf("audit verify --keep: %d\n%s%s", code, out, errOut)
	}
	after, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	oldCP, err := trail.OpenUnverified(before)
	if err != nil {
		t.Fatal(err)
	}
	newCP, err := trail.OpenUnverified(after)
	if err != nil || newCP.Size <= oldCP.Size {
		t.Fatalf("kept after verify --keep: %v, size %d, before %d", err, newCP.Size, oldCP.Size)
	}

	// An auditor's copy whose execution's events say otherwise.
	b, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	edited := ""
	for _, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var l struct {
			Msg *trail.Msg `json:"msg"`
		}
		if err := json.Unmarshal(line, &l); err == nil && l.Msg != nil && edited == "" {
			l.Msg.Data[len(l.Msg.Data)-1] ^= 1
			edited = l.Msg.Execution()
			if line, err = json.Marshal(l); err != nil {
				t.Fatal(err)
			}
		}
		lines = append(lines, line)
	}
	forged := filepath.Join(dir, "forged")
	if err := os.WriteFile(forged, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	notKept := filepath.Join(dir, "not-kept")
	out, _, code = capstan(t, url, "audit", "verify", "--bundle", forged, "--key", pub, "--keep", notKept)
	if code != exitFailed || !strings.Contains(out, "edited: leaf 0 (sequence 1, execution "+edited+")") {
		t.Fatalf("audit verify of an edited bundle: %d\n%s", code, out)
	}
	if _, err := os.Stat(notKept); err == nil {
		t.Fatal("verify --keep kept the checkpoint of a log that does not verify")
	}
	out, _, code = capstan(t, url, "audit", "verify", "--bundle", forged, "--key", pub, "-o", "json")
	if r := decode[trail.Report](t, out); code != exitFailed || r.OK() || r.Problems[0].Kind != trail.KindEdited || r.Problems[0].Execution != edited {
		t.Fatalf("audit verify -o json of an edited bundle: %d\n%s", code, out)
	}
}

// A signing key is private, never written over, and rotated with the old
// public key kept: the checkpoints the old key signed still verify, and
// those the new one signs too.
func TestAuditKeygen_PrivateRotatableOldCheckpointsVerify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, errOut, code := capstan(t, "", "audit", "keygen", "--dir", dir, "--log-name", "audit.example/payments"); code != exitOK {
		t.Fatalf("keygen: %d %s", code, errOut)
	}
	key := filepath.Join(dir, trail.KeyFile)
	fi, err := os.Stat(key)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, mode %v; want 0600", key, err, fi.Mode().Perm())
	}
	if _, errOut, code := capstan(t, "", "audit", "keygen", "--dir", dir); code == exitOK || !strings.Contains(errOut, "exists") {
		t.Fatalf("keygen over a key: %d %s", code, errOut)
	}
	if _, errOut, code := capstan(t, "", "audit", "keygen", "--dir", t.TempDir(), "--log-name", "two words"); code == exitOK {
		t.Fatalf("a log name with a space: %d %s", code, errOut)
	}
	s1, _, err := trail.LoadSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	cp := &trail.Checkpoint{Origin: s1.Name(), Size: 1, Stream: "CAPSTAN_AUDIT", FirstSeq: 1, Time: time.Now()}
	old, err := cp.Sign(s1)
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := capstan(t, "", "audit", "keygen", "--dir", dir, "--rotate"); code != exitOK {
		t.Fatalf("rotate: %d %s %s", code, out, errOut)
	}
	s2, _, err := trail.LoadSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Name() != s1.Name() || s2.KeyHash() == s1.KeyHash() {
		t.Fatal("rotation did not make a new key of the same log name")
	}
	newer, err := cp.Sign(s2)
	if err != nil {
		t.Fatal(err)
	}
	known, list, err := trail.LoadVerifiers(filepath.Join(dir, trail.PublicKeyFile))
	if err != nil || len(list) != 2 {
		t.Fatalf("public keys after a rotation: %d, %v", len(list), err)
	}
	for _, signed := range [][]byte{old, newer} {
		if _, err := trail.Open(signed, known); err != nil {
			t.Fatalf("a checkpoint of the log does not verify after the rotation: %v", err)
		}
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := trail.LoadSigner(key); err == nil {
		t.Fatal("a signing key others may read was used")
	}
}

// 'capstan auth init' makes the audit log's signing key beside the
// credentials, and a server started on the directory signs with it.
func TestAuthInit_MakesTheAuditKeyTheServerSignsWith(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	if out, errOut, code := capstan(t, "", "auth", "init", dir, "--log-name", "audit.example/init"); code != exitOK {
		t.Fatalf("auth init: %d %s %s", code, out, errOut)
	}
	fi, err := os.Stat(filepath.Join(dir, trail.KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("audit key: %v, %v", err, fi)
	}
	if _, errOut, code := capstan(t, "", "auth", "add", dir, "alice", "--role", "producer", "--actor", "user:alice", "--capabilities", "demo.*"); code != exitOK {
		t.Fatalf("auth add: %s", errOut)
	}
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	d := spawn(t, nil, "server", "--auth", dir, "--store", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--checkpoint-every", "100ms")
	d.waitOutput(t, serverReady)
	if !strings.Contains(d.out.String(), "audit log signed with "+filepath.Join(dir, trail.KeyFile)) {
		t.Fatalf("the server does not sign with the auth directory's key:\n%s", d.out.String())
	}
	admin := filepath.Join(dir, "admin.creds")
	w := spawn(t, nil, "worker", "--nats", url, "--creds", filepath.Join(dir, "worker.creds"))
	w.waitOutput(t, "worker started")
	// A call, refused or not, files audit events to sign.
	capstan(t, url, "call", "demo.echo", "--creds", admin, "--input", `{"hello":"init"}`)
	// The key of the checkpoints is the one beside the admin's credentials.
	deadline := time.Now().Add(guard)
	for {
		out, errOut, code := capstan(t, url, "audit", "checkpoint", "--creds", admin)
		if code == exitOK && strings.HasPrefix(out, "audit.example/init\n") {
			if strings.Contains(errOut, "the deployment states") {
				t.Fatal("the admin's check used the deployment's word, not the key beside its credentials")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint: %d %s %s", code, out, errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, errOut, code := capstan(t, url, "audit", "verify", "--creds", admin); code != exitOK {
		t.Fatalf("audit verify as the admin: %d %s %s", code, out, errOut)
	}
	// A producer reads its own trails through the workers, not the log.
	if out, errOut, code := capstan(t, url, "audit", "verify", "--creds", filepath.Join(dir, "alice.creds")); code != exitUsage || !strings.Contains(errOut, "only admins") {
		t.Fatalf("audit verify as a producer: %d %s %s", code, out, errOut)
	}
}

// A three-node cluster of servers shares the checkpointing duty; the node
// whose server holds it is killed while executions run, another takes
// over, and the log verifies against a checkpoint kept before the loss.
func TestAuditLog_ClusterOfServers_NodeHoldingTheDutyKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of processes")
	}
	keys := t.TempDir()
	if _, errOut, code := capstan(t, "", "audit", "keygen", "--dir", keys, "--log-name", "audit.example/cluster"); code != exitOK {
		t.Fatalf("keygen: %s", errOut)
	}
	pub := filepath.Join(keys, trail.PublicKeyFile)
	nodes, urls := startServerCluster(t, "--audit-key", filepath.Join(keys, trail.KeyFile), "--checkpoint-every", "200ms")
	w := spawn(t, []string{"CAPSTAN_NATS_URL=" + urls}, "worker", "--concurrency", "32")
	w.waitOutput(t, "worker started")
	nc := connect(t, urls)
	ctx, cancel := context.WithTimeout(context.Background(), 3*guard)
	defer cancel()
	b := openLog(t, ctx, nc)

	calls := func(n int) {
		for range n {
			if _, errOut, code := capstan(t, urls, "call", "demo.echo", "--input", `{"hello":"cluster"}`); code != exitOK {
				t.Logf("call: %d %s", code, errOut)
			}
		}
	}
	calls(5)
	kept := filepath.Join(t.TempDir(), "kept")
	var holder string
	for holder == "" {
		out, _, code := capstan(t, urls, "audit", "checkpoint", "--key", pub)
		holder = leaseName(ctx, b)
		if code == exitOK && holder != "" {
			if err := os.WriteFile(kept, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			break
		}
		holder = ""
		time.Sleep(200 * time.Millisecond)
	}
	var victim *serverNode
	for _, n := range nodes {
		if n.name == holder {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("the lease names %q, no node", holder)
	}
	victim.d.kill(t)
	calls(10)
	deadline := time.Now().Add(guard)
	for {
		if h := leaseName(ctx, b); h != "" && h != holder {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no other node took the checkpointing duty")
		}
		time.Sleep(200 * time.Millisecond)
	}
	calls(5)
	for {
		out, errOut, code := capstan(t, urls, "audit", "verify", "--key", pub, "--since", kept)
		if code == exitOK && strings.Contains(out, "holds: every event it covered") && !strings.Contains(out, "not in a checkpoint yet") {
			t.Logf("node %s killed; capstan audit verify:\n%s", holder, out)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit verify: %d\n%s%s", code, out, errOut)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// openLog binds the deployment's resources, the log's among them.
func openLog(t *testing.T, ctx context.Context, nc *nats.Conn) *broker.Broker {
	t.Helper()
	for {
		b, err := broker.OpenAll(ctx, nc, broker.Config{})
		if err == nil && b.Trail != nil {
			return b
		}
		if ctx.Err() != nil {
			t.Fatalf("open the deployment: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaseName names the checkpointer holding a live checkpointing lease.
func leaseName(ctx context.Context, b *broker.Broker) string {
	l, _, err := broker.Load[struct {
		Name  string    `json:"name"`
		Until time.Time `json:"until"`
	}](ctx, b.Trail, "lease")
	if err != nil || time.Now().After(l.Until) {
		return ""
	}
	return l.Name
}

// `capstan dev --metrics` reports the checkpointer: it holds the duty, the
// checkpoints it signed, the size of the last, and the lag of the oldest
// event each covered, within the seconds its interval bounds.
func TestAuditLog_CheckpointerMetrics(t *testing.T) {
	t.Parallel()
	metricsPort := freePort(t)
	_, url := startDev(t, "--metrics", fmt.Sprintf("127.0.0.1:%d", metricsPort))
	for range 3 {
		if out, errOut, code := capstan(t, url, "call", "demo.echo", "--input", `{"hello":"lag"}`); code != exitOK {
			t.Fatalf("call: %d\n%s%s", code, out, errOut)
		}
	}
	nc := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	b, err := broker.OpenAll(ctx, nc, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for {
		fams := scrapeMetrics(t, metricsPort)
		value := func(name string) float64 {
			for _, m := range fams[name].GetMetric() {
				switch {
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Histogram != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
			return -1
		}
		if value("capstan_audit_checkpoint_size") >= float64(info.State.LastSeq) {
			if value("capstan_audit_checkpointer_holding") != 1 || value("capstan_audit_checkpoints_total") < 1 ||
				value("capstan_audit_checkpoint_lag_seconds") < 1 || value("capstan_audit_checkpoint_errors_total") != 0 {
				t.Fatalf("checkpointer metrics: holding %v, signed %v, lags observed %v, errors %v", value("capstan_audit_checkpointer_holding"),
					value("capstan_audit_checkpoints_total"), value("capstan_audit_checkpoint_lag_seconds"), value("capstan_audit_checkpoint_errors_total"))
			}
			h := fams["capstan_audit_checkpoint_lag_seconds"].GetMetric()[0].GetHistogram()
			if h.GetSampleSum() <= 0 {
				t.Fatalf("lag histogram %+v: no lag measured", h)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint covered the %d audit messages: size %v", info.State.LastSeq, value("capstan_audit_checkpoint_size"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scrapeMetrics reads the metrics served on port.
func scrapeMetrics(t *testing.T, port int) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %v %s", err, res.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	return fams
}
