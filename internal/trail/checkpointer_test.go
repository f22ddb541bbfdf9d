package trail

import (
	"context"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// A log that nobody touched verifies, across tile boundaries, and a
// checkpoint kept early still holds once the log grew; every message is
// proved in the latest checkpoint.
func TestCheckpointer_UntouchedLogVerifiesAndProves(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	b := provision(t, env.Connect(t))
	k := newKey(t, "test.example/log")
	runCheckpointer(t, b, k, "one")

	last := publish(t, b, "a", 300)
	kept := waitCovered(t, b, last)
	last = publish(t, b, "b", 400)
	waitCovered(t, b, last)

	r := verify(t, FromDeployment(b), k, VerifyOptions{Kept: kept})
	mustOK(t, r)
	if !r.KeptHolds || r.Kept != 300 || r.Size != 700 || r.Messages != 700 || r.Verified < 2 {
		t.Fatalf("report %+v", r)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	signed, incs, err := Prove(ctx, b, []uint64{1, 256, 257, 699, 700}, k.known)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := Open(signed, k.known)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range incs {
		if err := in.Check(cp); err != nil {
			t.Fatal(err)
		}
	}
	// A proof does not carry over to another message.
	forged := incs[0]
	forged.Msg = incs[1].Msg
	if forged.Check(cp) == nil {
		t.Fatal("a proof checked for another message")
	}
}
