package auth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// A handler's progress reaches its execution's principal alone (DESIGN §5
// "Progress", §12): with her own credentials alice may not subscribe to
// bob's progress or publish anyone's; and in the accounts layout even a user
// of alice's account allowed every subject receives only what the one line
// of auth's crossings imports into it, her own progress, never bob's.
func TestForge_ProgressReachesItsPrincipalAlone(t *testing.T) {
	t.Parallel()
	r := newRigOn(t, embedded)
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	bob, _, _ := r.client(t, "bob", executor.SurfaceDirect)
	alice, aliceNC, v := r.client(t, "alice", executor.SurfaceDirect)

	// With alice's credentials: bob's subjects and every principal's are
	// refused; her own are hers.
	for _, subject := range []string{"capstan.progress.>", n.ProgressSubjectsOf("bob"), "capstan.*.bob.>", ">"} {
		if _, err := aliceNC.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}
	own, err := aliceNC.SubscribeSync(n.ProgressSubjectsOf("alice"))
	if err != nil {
		t.Fatal(err)
	}
	// A user of alice's account that may subscribe to anything: what crosses
	// into her account is all it can receive.
	wide := accountUser(t, r, "alice")
	all, err := wide.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := wide.Flush(); err != nil {
		t.Fatal(err)
	}

	// bob's execution reports "progress of bob's secret": bob receives it.
	bobID := envelope.NewExecutionID()
	bobs, err := bob.Progress(ctx, bobID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Submit(ctx, "t.report", Echo{Text: "bob's secret"}, executor.WithID(bobID)); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-bobs:
		if p.ExecutionID != bobID || p.Message != "progress of bob's secret" || p.Done != 1 || p.Total != 2 {
			t.Fatalf("bob's progress: %+v", p)
		}
	case <-ctx.Done():
		t.Fatal("bob received no progress of his own execution")
	}
	// Forged progress: no producer publishes on a progress subject, its own
	// or another's.
	for _, subject := range []string{n.ProgressSubject("bob", bobID), n.ProgressSubject("alice", bobID)} {
		if err := aliceNC.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		v.wait(t, ctx, subject)
	}

	// Then alice's own execution reports, after bob's, from the same worker:
	// whatever of bob's reached alice's account came before it.
	aliceID := envelope.NewExecutionID()
	mine, err := alice.Progress(ctx, aliceID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Submit(ctx, "t.report", Echo{Text: "alice's"}, executor.WithID(aliceID)); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-mine:
		if p.ExecutionID != aliceID || p.Message != "progress of alice's" {
			t.Fatalf("alice's progress: %+v", p)
		}
	case <-ctx.Done():
		t.Fatal("alice received no progress of her own execution")
	}
	// Each of alice's subscriptions gets her progress; anything of bob's
	// that reached it came before (one worker published both, in order).
	for name, sub := range map[string]*nats.Subscription{"alice's own progress": own, "alice's account, every subject": all} {
		for {
			m, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				t.Fatalf("%s did not receive alice's progress: %v", name, err)
			}
			if strings.Contains(string(m.Data), "bob") || strings.Contains(m.Subject, ".bob.") || strings.Contains(m.Subject, bobID) {
				t.Fatalf("%s received bob's %s: %q", name, m.Subject, m.Data)
			}
			if m.Subject == n.ProgressSubject("alice", aliceID) {
				break
			}
		}
	}
	r.reportedOnce.Do(func() { close(r.reported) })
	for _, e := range []struct {
		c  *executor.Client
		id string
	}{{bob, bobID}, {alice, aliceID}} {
		env, err := e.c.Await(ctx, e.id)
		if err != nil || env.Status != envelope.StatusCompleted {
			t.Fatalf("%v %+v", err, env)
		}
	}
}

// accountUser connects a user of principal's own account, signed with the
// account's key from the setup, that may publish and subscribe to anything:
// what it receives is what the account imports.
func accountUser(t *testing.T, r *rig, principal string) *nats.Conn {
	t.Helper()
	seed, err := os.ReadFile(filepath.Join(r.setup.Dir, principal+".account.nk"))
	if err != nil {
		t.Fatal(err)
	}
	akp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	apub, _ := akp.PublicKey()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = principal + "-wide"
	uc.IssuerAccount = apub
	uc.Pub.Allow.Add(">")
	uc.Sub.Allow.Add(">")
	token, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	useed, _ := ukp.Seed()
	nc, err := nats.Connect(r.url, nats.UserJWTAndSeed(token, string(useed)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
