package auth_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
)

// An account signed by an earlier version, whose table of crossings lacked
// one (here: describe), gets it from Sync and the next push, with no
// restart: adding a request the workers serve is one line of crossings.
func TestSync_AccountsOfAnEarlierVersionGetNewCrossingsByAPush(t *testing.T) {
	t.Parallel()
	r := newRigOn(t, embedded)
	ctx := testCtx(t)
	n := broker.NewNames(r.setup.Prefix)
	// alice's account as a version without describe signed it.
	g, _ := r.setup.Grant("alice")
	ac, err := jwt.DecodeAccountClaims(g.AccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	ac.Imports = slices.DeleteFunc(ac.Imports, func(i *jwt.Import) bool { return string(i.Subject) == n.DescribeSubject("alice") })
	seed, err := os.ReadFile(filepath.Join(r.setup.Dir, "operator.nk"))
	if err != nil {
		t.Fatal(err)
	}
	okp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	old, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.setup.Principals {
		if r.setup.Principals[i].Principal == "alice" {
			r.setup.Principals[i].AccountJWT = old
		}
	}
	b, _ := json.Marshal(r.setup)
	if err := os.WriteFile(filepath.Join(r.setup.Dir, credfile.StateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.push(t)
	alice, _, _ := r.client(t, "alice", executor.SurfaceDirect)
	me := envelope.Actor{Kind: envelope.ActorUser, ID: "alice"}
	if _, err := alice.Describe(ctx, executor.SurfaceDirect, me, executor.Scope{}); err == nil {
		t.Fatal("alice described without the import")
	}

	s, err := auth.Load(r.setup.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Sync(); err != nil || !changed {
		t.Fatalf("sync: %v, changed %v", err, changed)
	}
	if changed, err := s.Sync(); err != nil || changed {
		t.Fatalf("a second sync: %v, changed %v", err, changed)
	}
	r.push(t)
	if d, err := alice.Describe(ctx, executor.SurfaceDirect, me, executor.Scope{}); err != nil || len(d.Capabilities) == 0 {
		t.Fatalf("alice's describe after the sync and push: %v %+v", err, d)
	}
}
