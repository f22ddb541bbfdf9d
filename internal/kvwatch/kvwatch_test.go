package kvwatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/kvwatch"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The values a bucket holds at the start are applied, marked initial,
// before the channel closes; a later write follows, marked not initial; a
// watcher stopped before its first values still closes the channel.
func TestFollow_LoadsThenFollows(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(env.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FOLLOW"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := kv.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	type seen struct {
		key     string
		initial bool
	}
	got := make(chan seen, 10)
	loaded := kvwatch.Follow(w, func(e jetstream.KeyValueEntry, initial bool) { got <- seen{e.Key(), initial} })
	select {
	case <-loaded:
	case <-ctx.Done():
		t.Fatal("the initial values were never loaded")
	}
	if len(got) != 2 {
		t.Fatalf("applied %d values before loading ended, want 2", len(got))
	}
	for _, want := range []string{"a", "b"} {
		if s := <-got; s != (seen{want, true}) {
			t.Fatalf("applied %+v, want %s as initial", s, want)
		}
	}
	if _, err := kv.Put(ctx, "c", []byte("c")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != (seen{"c", false}) {
			t.Fatalf("applied %+v, want c as a later write", s)
		}
	case <-ctx.Done():
		t.Fatal("a later write was never applied")
	}

	stopped, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stopped.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kvwatch.Follow(stopped, func(jetstream.KeyValueEntry, bool) {}):
	case <-ctx.Done():
		t.Fatal("a stopped watcher's channel never closed")
	}
}
