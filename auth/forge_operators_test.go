package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
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
