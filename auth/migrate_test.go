package auth_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var migrationGrants = []auth.Grant{
	{Principal: "alice", Role: auth.RoleProducer, Actors: []string{"user:alice"}, Capabilities: []string{"*"}},
	{Principal: "carol", Role: auth.RoleApprover, Actors: []string{"user:carol"}, Types: []string{"finance"}},
}

// TestMigrate_KeepsEveryStreamBucketAndMessage moves a one-account
// deployment with data in every stream and bucket: a finished call, one
// waiting for its approval, one still queued (no worker runs), the audit
// trail, grants, catalog and pools. After the migration and one restart on
// the new configuration, then a push, every stream and key is as it was; the
// producer's and approver's old credentials are refused, their new ones work
// on everything they left behind, and the admin's and worker's are unchanged.
func TestMigrate_KeepsEveryStreamBucketAndMessage(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "secrets")
	v1 := testenv.LegacySetup(t, dir, migrationGrants...)
	env := testenv.Start(t, testenv.Auth(v1))
	r := &rig{setup: v1, url: env.URL, nodes: []string{env.URL}}
	r.connect = func(t *testing.T, p string, opts ...nats.Option) *nats.Conn { return env.ConnectAs(t, p, opts...) }
	var err error
	if r.admin, err = broker.Provision(ctx, env.Connect(t), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := auth.PublishGrants(ctx, r.admin.JS, v1, 0); err != nil {
		t.Fatal(err)
	}
	stopWorker := r.startStoppableWorker(t)
	t.Cleanup(stopWorker)
	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	done, err := alice.Call(ctx, "t.echo", Echo{Text: "before the migration"})
	if err != nil || done.Status != envelope.StatusCompleted {
		t.Fatalf("%v %+v", err, done)
	}
	waiting, err := alice.Call(ctx, "t.refund", Refund{OrderID: "o1", Amount: 900})
	if err != nil || waiting.Status != envelope.StatusApprovalRequired {
		t.Fatalf("%v %+v", err, waiting)
	}
	r.settled(t, "alice", done.ExecutionID)
	r.settled(t, "alice", waiting.ExecutionID)
	stopWorker()
	queued, err := alice.Submit(ctx, "t.echo", Echo{Text: "queued across the migration"})
	if err != nil {
		t.Fatal(err)
	}
	_ = alice.Close()
	// The work queue holds the queued request alone once the worker's
	// acknowledgements of the others are applied.
	r.waitExecDrained(t, broker.NewNames(v1.Prefix).QueueStream("alice"), 1)
	// A limit's counter, as a worker leaves one (the rig's capabilities
	// declare none): the migration keeps the limits bucket too.
	counter, err := envelope.Marshal(map[string]any{"v": envelope.Version, "kind": "concurrency", "capability": "t.echo", "max": 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.admin.Limits.Put(ctx, "c.t.echo", counter); err != nil {
		t.Fatal(err)
	}
	before := r.world(t)
	for _, s := range r.streamNames(t) {
		if strings.HasPrefix(s, broker.NewNames(v1.Prefix).ExecStream()) && s != broker.NewNames(v1.Prefix).QueueStream("alice") {
			continue // the shared exec stream and the others' queues: alice's request is in hers
		}
		if before.streams[s].Msgs == 0 {
			t.Fatalf("stream %s is empty: the migration would prove nothing for it", s)
		}
	}
	oldAlice := readCreds(t, v1.CredsPath("alice"))
	oldWorker := readCreds(t, v1.CredsPath(auth.WorkerPrincipal))

	rep, err := auth.Migrate(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Reissued, []string{"alice", "carol"}) {
		t.Fatalf("reissued %v", rep.Reissued)
	}
	// The backup holds what was rewritten, as it was.
	if b := readCreds(t, filepath.Join(rep.Backup, "alice.creds")); !bytes.Equal(b, oldAlice) {
		t.Fatal("the backup's alice.creds is not the old one")
	}
	if s, err := auth.Load(rep.Backup); err != nil || s.V != 1 {
		t.Fatalf("backup state: %v %+v", err, s)
	}
	// Run again: nothing to do, nothing changed.
	state := readCreds(t, filepath.Join(dir, credfile.StateFile))
	if again, err := auth.Migrate(dir, nil); err != nil || !again.Current {
		t.Fatalf("second migration: %v %+v", err, again)
	}
	if !bytes.Equal(state, readCreds(t, filepath.Join(dir, credfile.StateFile))) {
		t.Fatal("a second migration rewrote the setup")
	}
	if !bytes.Equal(oldWorker, readCreds(t, v1.CredsPath(auth.WorkerPrincipal))) {
		t.Fatal("the worker's credentials changed")
	}
	v2, err := auth.Load(dir)
	if err != nil || v2.Current() != nil || v2.Account != v1.Account {
		t.Fatalf("migrated setup: %v, v%d, capstan account %s (was %s)", err, v2.V, v2.Account, v1.Account)
	}
	for _, p := range []string{"alice", "carol"} {
		if g, _ := v2.Grant(p); g.Account == "" || g.Limits == nil || *g.Limits != auth.DefaultLimits {
			t.Fatalf("%s after the migration: %+v", p, g)
		}
	}

	// One restart on the new configuration, then the push.
	env.Restart(t)
	env.PushAccounts(t)
	r.setup = v2
	if r.admin, err = broker.OpenAll(ctx, env.Connect(t), broker.Config{}); err != nil {
		t.Fatal(err)
	}
	r.assertWorldUnchanged(t, before)
	if err := auth.PublishGrants(ctx, r.admin.JS, v2, 0); err != nil {
		t.Fatal(err)
	}

	old := filepath.Join(t.TempDir(), "alice.creds")
	if err := os.WriteFile(old, oldAlice, 0o600); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(env.URL, nats.UserCredentials(old), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("alice's old credentials connected after the migration")
	}
	if u := userOf(t, v2.CredsPath("alice")); u.IssuerAccount != "" || u.Issuer != mustGrant(t, v2, "alice").Account {
		t.Fatalf("alice's new user is signed by %s, not her account", u.Issuer)
	}
	r.startWorker(t)
	alice, _, _ = r.client(t, "alice", executor.SurfaceDirect)
	if st, err := alice.Status(ctx, done.ExecutionID); err != nil || st.Envelope == nil || st.Envelope.Status != envelope.StatusCompleted {
		t.Fatalf("alice's execution from before: %v %+v", err, st)
	}
	if env, err := alice.Await(ctx, queued); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("the request queued across the migration: %v %+v", err, env)
	}
	if _, err := approvalsrpc.Decide(ctx, r.connect(t, "carol"), broker.NewNames(v2.Prefix), approvalsrpc.DecideRequest{ApprovalID: waiting.Approval.ID, Approve: true}); err != nil {
		t.Fatalf("carol, migrated, deciding the approval from before: %v", err)
	}
	if env, err := alice.Resume(ctx, waiting.Approval.ID); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %v %+v", err, env)
	}
}

// TestMigrate_ResumesAfterAnInterruption: a migration stopped half-way
// leaves the setup in the one-account layout, its backup whole; run again,
// it finishes with the keys and credentials the first run made, and the
// backup still holds the credentials from before either run.
func TestMigrate_ResumesAfterAnInterruption(t *testing.T) {
	// Not parallel: FailMigrationAt changes the package's migration hook,
	// which every Migrate reads (a parallel migration test raced with it).
	dir := filepath.Join(t.TempDir(), "secrets")
	v1 := testenv.LegacySetup(t, dir, migrationGrants...)
	oldAlice := readCreds(t, v1.CredsPath("alice"))
	for _, step := range []string{"backed up", "reissued alice", "configured"} {
		restore := auth.FailMigrationAt(step)
		_, err := auth.Migrate(dir, nil)
		restore()
		if err == nil {
			t.Fatalf("migration interrupted at %q succeeded", step)
		}
		if s, err := auth.Load(dir); err != nil || s.V != 1 {
			t.Fatalf("after an interruption at %q: %v v%d", step, err, s.V)
		}
	}
	interrupted := userOf(t, v1.CredsPath("alice")).Subject
	rep, err := auth.Migrate(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := auth.Load(dir)
	if err != nil || v2.Current() != nil {
		t.Fatalf("%v %+v", err, v2)
	}
	if g := mustGrant(t, v2, "alice"); g.PublicKey != interrupted {
		t.Fatalf("alice's user %s, the interrupted run wrote %s", g.PublicKey, interrupted)
	}
	if !bytes.Equal(readCreds(t, filepath.Join(rep.Backup, "alice.creds")), oldAlice) {
		t.Fatal("the backup lost alice's credentials from before the migration")
	}
	// The old user is revoked in the capstan account.
	ac, err := jwt.DecodeAccountClaims(v2.AccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ac.Revocations[mustGrant(t, v1, "alice").PublicKey]; !ok {
		t.Fatal("alice's old user is not revoked in the capstan account")
	}
}

func TestMigrate_RefusesWhatItCannotMigrate(t *testing.T) {
	t.Parallel()
	s, err := auth.Init(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := auth.Migrate(s.Dir, nil); err != nil || !rep.Current {
		t.Fatalf("migrating a current setup: %v %+v", err, rep)
	}
	v1 := testenv.LegacySetup(t, t.TempDir(), migrationGrants...)
	if _, err := auth.Migrate(v1.Dir, &auth.Limits{Connections: 0, Subscriptions: 1, Payload: 1}); err == nil {
		t.Fatal("migrated with a zero connection limit")
	}
	for _, op := range []func() error{
		func() error {
			return v1.Add(auth.Grant{Principal: "x", Role: auth.RoleProducer, Actors: []string{"user:x"}})
		},
		func() error { return v1.Remove("alice") },
	} {
		if err := op(); err == nil || !errors.Is(err, auth.ErrNeedsMigration) {
			t.Fatalf("a change of a one-account setup: %v, want %v", err, auth.ErrNeedsMigration)
		}
	}
}

func readCreds(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func userOf(t *testing.T, creds string) *jwt.UserClaims {
	t.Helper()
	tok, err := jwt.ParseDecoratedJWT(readCreds(t, creds))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

func mustGrant(t *testing.T, s *auth.Setup, p string) auth.Grant {
	t.Helper()
	g, ok := s.Grant(p)
	if !ok {
		t.Fatalf("no grant of %s", p)
	}
	return g
}
