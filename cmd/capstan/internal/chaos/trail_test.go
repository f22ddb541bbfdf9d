//go:build unix

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
)

// The audit log that nobody touched verifies across SIGKILLs: of the
// checkpointer that holds the lease, while it checkpoints a steady load
// (another takes over), and of workers in the middle of executions. The
// command line checks it as an auditor would: a checkpoint copied out with
// 'capstan audit checkpoint' early, then 'capstan audit verify --since' it.
func TestAuditLog_VerifiesAcrossKilledCheckpointersAndWorkers(t *testing.T) {
	bin := cliBin()
	if bin == "" {
		t.Skip("needs a capstan binary")
	}
	r := newRig(t, 2*time.Second, 16)
	r.startServer()
	r.startWorker()
	r.startWorker()
	keys := filepath.Join(r.dir, "keys")
	run(t, bin, "audit", "keygen", "--dir", keys, "--log-name", "chaos.example/log")

	var mu sync.Mutex
	var cps []*proc
	n := 0
	startCheckpointer := func() {
		mu.Lock()
		n++
		name := fmt.Sprintf("checkpointer-%d", n)
		mu.Unlock()
		p := r.spawnBin(name, bin, "audit", "checkpointer", "--nats", r.url, "--key", filepath.Join(keys, "audit.key"),
			"--every", "200ms", "--lease", "1s", "--name", name)
		mu.Lock()
		cps = append(cps, p)
		mu.Unlock()
	}
	startCheckpointer()
	startCheckpointer()

	c := r.client("demo.echo")
	ctx, stop := context.WithCancel(context.Background())
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if _, err := c.Call(cctx, "demo.echo", map[string]any{"hello": "chaos"}); err == nil {
					calls.Add(1)
				}
				cancel()
			}
		}()
	}
	b := r.broker()
	kept := filepath.Join(r.dir, "kept.checkpoint")
	waitFor(t, "a first checkpoint", func() bool { return leaseHolder(b) != "" && latestSize(b) > 0 })
	out := run(t, bin, "audit", "checkpoint", "--nats", r.url, "--key", filepath.Join(keys, "audit.pub"))
	if err := os.WriteFile(kept, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}

	takeovers := 0
	for range 3 {
		holder := leaseHolder(b)
		mu.Lock()
		var victim *proc
		for i, p := range cps {
			if p.name == holder {
				victim = p
				cps = append(cps[:i], cps[i+1:]...)
			}
		}
		mu.Unlock()
		if victim == nil {
			t.Fatalf("the lease names %q, no running checkpointer", holder)
		}
		before := latestSize(b)
		victim.kill()
		r.killWorker("")
		r.startWorker()
		startCheckpointer()
		waitFor(t, "another checkpointer to take over and sign", func() bool {
			h := leaseHolder(b)
			return h != "" && h != holder && latestSize(b) > before
		})
		takeovers++
	}
	stop()
	wg.Wait()

	last := func() uint64 {
		info, err := b.Audit.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	time.Sleep(time.Second) // the last events of the killed workers' survivors
	waitFor(t, "a checkpoint of every event", func() bool { return uint64(latestSize(b)) >= last() })
	out = run(t, bin, "audit", "verify", "--nats", r.url, "--key", filepath.Join(keys, "audit.pub"), "--since", kept)
	if !strings.Contains(out, "verified") || !strings.Contains(out, "holds: every event it covered") {
		t.Fatalf("capstan audit verify:\n%s", out)
	}
	t.Logf("%d calls, %d checkpointer takeovers, %d worker kills; capstan audit verify:\n%s", calls.Load(), takeovers, r.kills, out)
}

// run runs the capstan binary and returns its output, failing the test
// when it fails.
func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("capstan %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// spawnBin starts the capstan binary bin with args as the rig's child
// process name, killed when the test ends.
func (r *rig) spawnBin(name, bin string, args ...string) *proc {
	r.t.Helper()
	log, err := os.Create(filepath.Join(r.dir, name+".log"))
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	r.t.Cleanup(p.kill)
	return p
}

// broker opens the deployment's resources on a connection of the test's.
func (r *rig) broker() *broker.Broker {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		b, err := broker.OpenAll(ctx, r.connect(), broker.Config{})
		if err == nil && b.Trail != nil && b.Checkpoints != nil {
			return b
		}
		if ctx.Err() != nil {
			r.t.Fatalf("open the deployment: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaseHolder names the checkpointer holding a live lease, "" for none.
func leaseHolder(b *broker.Broker) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, _, err := broker.Load[struct {
		Name  string    `json:"name"`
		Until time.Time `json:"until"`
	}](ctx, b.Trail, "lease")
	if err != nil || time.Now().After(l.Until) {
		return ""
	}
	return l.Name
}

// latestSize is the size of the latest stored checkpoint (0: none).
func latestSize(b *broker.Broker) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m, err := b.Checkpoints.GetLastMsgForSubject(ctx, b.Names.CheckpointSubject())
	if err != nil {
		return 0
	}
	var size int64
	if lines := strings.SplitN(string(m.Data), "\n", 3); len(lines) == 3 {
		_, _ = fmt.Sscan(lines[1], &size)
	}
	return size
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
