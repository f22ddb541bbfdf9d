package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/grantwatch"
	"github.com/capstan-dev/capstan/internal/pauses"
	"github.com/capstan-dev/capstan/internal/policies"
)

// Only admins pause and put policies in force (DESIGN §12, §18): with the
// real generated credentials, a worker, a producer and an approver are each
// refused every write to the pauses and policies buckets, their creation,
// and a message's removal; a producer and an approver may not even read
// them; a worker cannot take their subjects with a stream of its own before
// an admin first writes them. The worker reads and watches them. What the
// admin wrote is there, unchanged, after every attempt.
func TestPermissions_OnlyAdminsWritePausesAndPolicies(t *testing.T) {
	t.Parallel()
	testOnlyAdminsWriteOperatorBuckets(t, newRigOn(t, embedded))
}

func TestPermissionsOnOfficialServer_OnlyAdminsWritePausesAndPolicies(t *testing.T) {
	t.Parallel()
	testOnlyAdminsWriteOperatorBuckets(t, newRigOn(t, official))
}

func testOnlyAdminsWriteOperatorBuckets(t *testing.T, r *rig) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	n := broker.NewNames(r.setup.Prefix)
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

	// Before any admin wrote them, the worker's streams of its own that
	// would hold the buckets' subjects, and so keep an admin from ever
	// creating them (an emergency stop that cannot be made).
	wjs, err := jetstream.New(r.connect(t, auth.WorkerPrincipal, quiet))
	if err != nil {
		t.Fatal(err)
	}
	for name, bucket := range map[string]string{"SQUAT_PAUSES": n.PausesBucket(), "SQUAT_POLICIES": n.PoliciesBucket()} {
		if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"$KV." + bucket + ".>"}}); err == nil {
			t.Errorf("the worker created stream %s on the subjects of %s", name, bucket)
		}
	}

	admin := r.admin.NC
	ch, err := pauses.Apply(ctx, admin, n, &pauses.Pause{Scope: pauses.Scope{Capability: "email.send"}, Mode: pauses.Hold,
		Reason: "mail loop", By: "admin"})
	if err != nil {
		t.Fatalf("the admin's pause: %v", err)
	}
	js := r.admin.JS
	pkv, err := policies.Bucket(ctx, js, n, true)
	if err != nil {
		t.Fatalf("the admin's policies bucket: %v", err)
	}
	if _, err := pkv.Put(ctx, "current", []byte(`{"v":1}`)); err != nil {
		t.Fatalf("the admin's write: %v", err)
	}
	before := func() map[string]uint64 {
		out := map[string]uint64{}
		for _, b := range []string{n.PausesBucket(), n.PoliciesBucket()} {
			s, err := js.Stream(ctx, "KV_"+b)
			if err != nil {
				t.Fatal(err)
			}
			out[b] = s.CachedInfo().State.LastSeq
		}
		return out
	}
	was := before()

	attempts := func(who string) []string {
		s := []string{
			"$KV." + n.PausesBucket() + "." + ch.Pause.Scope.Key(),
			"$KV." + n.PausesBucket() + ".all",
			"$KV." + n.PoliciesBucket() + ".current",
			"$KV." + n.PoliciesBucket() + ".v.1",
			"$JS.API.STREAM.CREATE.KV_" + n.PausesBucket(),
			"$JS.API.STREAM.CREATE.KV_" + n.PoliciesBucket(),
			"$JS.API.STREAM.UPDATE.KV_" + n.PausesBucket(),
			"$JS.API.STREAM.MSG.DELETE.KV_" + n.PausesBucket(),
			"$JS.API.STREAM.MSG.DELETE.KV_" + n.PoliciesBucket(),
			"$JS.API.STREAM.PURGE.KV_" + n.PausesBucket(),
			"$JS.API.STREAM.DELETE.KV_" + n.PoliciesBucket(),
		}
		if who != auth.WorkerPrincipal {
			// Reading them is a worker's and an admin's.
			s = append(s, "$JS.API.DIRECT.GET.KV_"+n.PausesBucket()+".$KV."+n.PausesBucket()+".all",
				"$JS.API.STREAM.INFO.KV_"+n.PoliciesBucket(), n.AppliedSubject())
		}
		return s
	}
	for _, who := range []string{auth.WorkerPrincipal, "alice", "carol"} {
		v := newViolations()
		nc := r.connect(t, who, v.handler())
		for _, subject := range attempts(who) {
			if err := nc.Publish(subject, []byte(`{"v":1,"scope":{},"mode":"hold","reason":"forged"}`)); err != nil {
				t.Fatal(err)
			}
			v.wait(t, ctx, subject)
		}
	}
	if now := before(); now[n.PausesBucket()] != was[n.PausesBucket()] || now[n.PoliciesBucket()] != was[n.PoliciesBucket()] {
		t.Fatalf("the buckets changed: %v, were %v", now, was)
	}

	// The worker reads and watches what the admin wrote.
	w, err := pauses.Watch(ctx, wjs, n, nil, nil)
	if err != nil {
		t.Fatalf("the worker's watch: %v", err)
	}
	defer w.Stop()
	if err := w.WaitRevision(ctx, ch.Revision); err != nil || w.Load().Len() != 1 {
		t.Fatalf("the worker's copy: %v, %d pauses", err, w.Load().Len())
	}
}

// A worker may create streams and send requests in the buckets' account,
// and what the server stores for it there is not held to its permissions:
// with the real worker credentials, a stream republishing into the
// buckets only admins write (with an empty Nats-Stream header of its own,
// too), and a server's answer sent to a reply subject of theirs, do write
// them (a pause lifted, a policy set removed, a principal granted), and a
// republished rollup would purge them: the buckets refuse it. No
// worker honours such a change: a running one keeps what the admin wrote,
// and one starting then grants nothing the admin did not, and fails every
// call closed under a policy set it cannot trust. (What this does not stop
// is in docs/security.md: a worker is trusted with JetStream.)
func TestPermissions_AWorkersRepublishingStreamChangesNoOperatorBucket(t *testing.T) {
	t.Parallel()
	testRepublishingChangesNoOperatorBucket(t, newRigOn(t, embedded))
}

func TestPermissionsOnOfficialServer_AWorkersRepublishingStreamChangesNoOperatorBucket(t *testing.T) {
	t.Parallel()
	testRepublishingChangesNoOperatorBucket(t, newRigOn(t, official))
}

func testRepublishingChangesNoOperatorBucket(t *testing.T, r *rig) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	n := broker.NewNames(r.setup.Prefix)
	admin := r.admin.NC
	ch, err := pauses.Apply(ctx, admin, n, &pauses.Pause{Scope: pauses.Scope{Capability: "email.send"}, Mode: pauses.Hold,
		Reason: "mail loop", By: "admin"})
	if err != nil {
		t.Fatalf("the admin's pause: %v", err)
	}
	sms, err := pauses.Apply(ctx, admin, n, &pauses.Pause{Scope: pauses.Scope{Capability: "sms.send"}, Mode: pauses.Hold,
		Reason: "sms loop", By: "admin"})
	if err != nil {
		t.Fatalf("the admin's second pause: %v", err)
	}
	applied, err := policies.Apply(ctx, admin, n, policies.Applying{File: "allow.cedar",
		Text: []byte("permit (principal, action, resource);"), By: "admin", Reason: "testing"})
	if err != nil {
		t.Fatalf("the admin's policies: %v", err)
	}

	wnc := r.connect(t, auth.WorkerPrincipal)
	wjs, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	watchers := func() (*pauses.Watcher, *policies.Watcher, *grantwatch.Grants) {
		p, err := pauses.Watch(ctx, wjs, n, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		c, err := policies.Watch(ctx, wjs, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		g, err := grantwatch.Watch(ctx, wjs, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		return p, c, g
	}
	running, runningPolicies, runningGrants := watchers()
	if err := running.WaitRevision(ctx, sms.Revision); err != nil || running.Load().Len() != 2 {
		t.Fatalf("the worker's pauses: %v, %d", err, running.Load().Len())
	}
	if err := runningPolicies.WaitRevision(ctx, applied.Revision); err != nil || runningPolicies.Load() == nil ||
		runningPolicies.Load().Version != applied.Current.Version {
		t.Fatalf("the worker's policies: %v %+v", err, runningPolicies.Load())
	}

	// The worker's stream republishes evil.<bucket>.<key> as $KV.<bucket>.<key>.
	if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}, AllowRollup: true,
		RePublish: &jetstream.RePublish{Source: "evil.>", Destination: "$KV.>"}}); err != nil {
		t.Fatalf("the worker's stream: %v", err)
	}
	mallory, err := json.Marshal(auth.Grant{Principal: "mallory", Role: auth.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	forged := []*nats.Msg{
		{Subject: "evil." + n.PausesBucket() + "." + ch.Pause.Scope.Key(), Header: nats.Header{"KV-Operation": {"DEL"}}},
		{Subject: "evil." + n.PoliciesBucket() + ".current", Data: []byte(`{"v":1,"version":0,"by":"admin"}`)},
		{Subject: "evil." + n.GrantsBucket() + ".mallory", Data: mallory},
		// An empty Nats-Stream of its own comes before the server's.
		{Subject: "evil." + n.GrantsBucket() + ".mallory", Data: mallory, Header: nats.Header{"Nats-Stream": {""}}},
	}
	lastSeq := func(bucket string) uint64 {
		s, err := r.admin.JS.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}
	for _, m := range forged {
		bucket := strings.Split(m.Subject, ".")[1]
		was := lastSeq(bucket)
		if _, err := wjs.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the republished "+m.Subject+" stored in "+bucket, func() bool { return lastSeq(bucket) > was })
	}
	// A republished rollup would purge every other key of the bucket as it
	// is stored: the bucket refuses it.
	if _, err := wjs.PublishMsg(ctx, &nats.Msg{Subject: "evil." + n.PausesBucket() + ".x", Data: []byte("{}"),
		Header: nats.Header{"Nats-Rollup": {"all"}}}); err != nil {
		t.Fatal(err)
	}
	// A server's answer sent to a reply subject of the bucket is stored
	// there too: bytes that are no pause, which lift none.
	was := lastSeq(n.PausesBucket())
	if err := wnc.PublishRequest("$JS.API.INFO", "$KV."+n.PausesBucket()+"."+ch.Pause.Scope.Key(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answer stored in "+n.PausesBucket(), func() bool { return lastSeq(n.PausesBucket()) > was })
	// What the server stored reached the watchers: a probe written by the
	// admin after the forged ones is applied once they are.
	probe, err := pauses.Apply(ctx, admin, n, &pauses.Pause{Scope: pauses.Scope{Capability: "probe"}, Mode: pauses.Hold,
		Reason: "probe", By: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	if err := running.WaitRevision(ctx, probe.Revision); err != nil {
		t.Fatal(err)
	}
	if got := running.Load(); got.Len() != 3 {
		t.Errorf("a running worker holds %d pauses, want the admin's three: a forged change lifted one", got.Len())
	}
	if err := runningPolicies.WaitRevision(ctx, lastSeq(n.PoliciesBucket())); err != nil {
		t.Fatal(err)
	}
	if s := runningPolicies.Load(); s == nil || s.Version != applied.Current.Version || s.Err() != nil {
		t.Errorf("a running worker's policies: %+v, want v%d in force", s, applied.Current.Version)
	}
	grants, err := r.admin.JS.KeyValue(ctx, n.GrantsBucket())
	if err != nil {
		t.Fatal(err)
	}
	zed, err := json.Marshal(auth.Grant{Principal: "zed", Role: auth.RoleProducer, Actors: []string{"user:zed"}, Capabilities: []string{"demo.echo"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grants.Put(ctx, "zed", zed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the running worker's grants read past the forged one (the admin's grant of zed)", func() bool {
		_, ok := runningGrants.Lookup("zed")
		return ok
	})
	if g, ok := runningGrants.Lookup("mallory"); ok {
		t.Errorf("a running worker grants mallory %+v", g)
	}

	// A worker starting now.
	startingPauses, startingPolicies, startingGrants := watchers()
	if startingPauses.Load().Match("alice", "sms.send", envelope.Actor{Kind: "user", ID: "alice"}) == nil {
		t.Errorf("a starting worker does not hold the admin's pause of sms.send: the rollup purged it")
	}
	if s := startingPolicies.Load(); s == nil || s.Err() == nil {
		t.Errorf("a starting worker's policies: %+v, want a broken set (every call fails closed)", s)
	}
	if g, ok := startingGrants.Lookup("mallory"); ok {
		t.Errorf("a starting worker grants mallory %+v", g)
	}
	if _, ok := startingGrants.Lookup("alice"); !ok {
		t.Errorf("a starting worker lost alice's grant")
	}

	// An admin's listing names what no worker honours; the admin's commands
	// replace it (a compare-and-swap from the revision it was stored at,
	// which its own headers hide from a key-value read).
	fax := pauses.Pause{V: 1, Scope: pauses.Scope{Capability: "fax.send"}, Mode: pauses.Hold, Reason: "forged", By: "admin",
		At: time.Now().UTC()}
	faxed, err := json.Marshal(&fax)
	if err != nil {
		t.Fatal(err)
	}
	was = lastSeq(n.PausesBucket())
	if _, err := wjs.PublishMsg(ctx, &nats.Msg{Subject: "evil." + n.PausesBucket() + "." + fax.Scope.Key(), Data: faxed}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the republished pause of fax.send stored", func() bool { return lastSeq(n.PausesBucket()) > was })
	pkv, err := pauses.Bucket(ctx, r.admin.JS, n, false)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := pauses.List(ctx, admin, pkv)
	if !errors.Is(err, pauses.ErrIgnored) || !strings.Contains(err.Error(), fax.Scope.Key()) || !strings.Contains(err.Error(), "EVIL") {
		t.Errorf("the admin's listing of pauses: %v, want the forged fax.send named as ignored", err)
	}
	for _, p := range listed {
		if p.Scope.Capability == "fax.send" {
			t.Errorf("the admin's listing shows the forged pause of fax.send as in force")
		}
	}
	again, err := pauses.Apply(ctx, admin, n, &pauses.Pause{Scope: pauses.Scope{Capability: "email.send"}, Mode: pauses.Hold,
		Reason: "mail loop, again", By: "admin"})
	if err != nil {
		t.Fatalf("the admin pausing email.send again, over the forged removal: %v", err)
	}
	reapplied, err := policies.Apply(ctx, admin, n, policies.Applying{File: "allow.cedar",
		Text: []byte("permit (principal, action, resource);"), By: "admin", Reason: "again"})
	if err != nil {
		t.Fatalf("the admin applying policies again, over the forged removal: %v", err)
	}
	later, laterPolicies, _ := watchers()
	if err := later.WaitRevision(ctx, again.Revision); err != nil ||
		later.Load().Match("alice", "email.send", envelope.Actor{Kind: "user", ID: "alice"}) == nil {
		t.Errorf("a worker starting after the admin paused again does not hold email.send: %v", err)
	}
	if err := laterPolicies.WaitRevision(ctx, reapplied.Revision); err != nil || laterPolicies.Load() == nil ||
		laterPolicies.Load().Err() != nil || laterPolicies.Load().Version != reapplied.Current.Version {
		t.Errorf("a worker starting after the admin applied again: %v %+v, want v%d in force", err, laterPolicies.Load(), reapplied.Current.Version)
	}
}
