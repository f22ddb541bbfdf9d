package jsget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/internal/jsget"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// A message get and a direct get read what the stream holds, headers and
// all, and say plainly when it holds nothing for the request, when the
// stream is missing, and when it allows no direct gets.
func TestGet_ReadsWhatIsStoredAndSaysWhatIsNot(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DIRECT", Subjects: []string{"d.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"p.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"d.a", "d.b", "d.a", "p.a"} {
		m := nats.NewMsg(subj)
		m.Header.Set("Who", subj)
		m.Data = []byte("body of " + subj)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	last, err := jsget.Get(ctx, nc, "DIRECT", jsget.Request{LastFor: "d.a"})
	if err != nil || last.Sequence != 3 || last.Subject != "d.a" || string(last.Data) != "body of d.a" || last.Header.Get("Who") != "d.a" || last.Time.IsZero() {
		t.Fatalf("last of d.a = %+v, %v", last, err)
	}
	next, err := jsget.Get(ctx, nc, "DIRECT", jsget.Request{Seq: 2, NextFor: "d.a"})
	if err != nil || next.Sequence != 3 {
		t.Fatalf("next of d.a from 2 = %+v, %v", next, err)
	}
	if _, err := jsget.Get(ctx, nc, "DIRECT", jsget.Request{LastFor: "d.none"}); !errors.Is(err, jsget.ErrNoMessage) || !jsget.Absent(err) {
		t.Fatalf("a subject without messages: %v", err)
	}
	_, err = jsget.Get(ctx, nc, "MISSING", jsget.Request{LastFor: "m.a"})
	var api *jsget.APIError
	if errors.Is(err, jsget.ErrNoMessage) || !errors.As(err, &api) || api.Code != 404 || !jsget.Absent(err) {
		t.Fatalf("a missing stream: %v", err)
	}

	direct := func(stream, subject string) (*jetstream.RawStreamMsg, error) {
		t.Helper()
		m, err := nc.RequestWithContext(ctx, jsget.DirectSubject(stream, subject), nil)
		if err != nil {
			t.Fatal(err)
		}
		return jsget.Direct(m)
	}
	got, err := direct("DIRECT", "d.b")
	if err != nil || got.Sequence != 2 || got.Subject != "d.b" || string(got.Data) != "body of d.b" || got.Header.Get("Who") != "d.b" || got.Time.IsZero() {
		t.Fatalf("direct get of d.b = %+v, %v", got, err)
	}
	if _, err := direct("DIRECT", "d.none"); !errors.Is(err, jsget.ErrNoMessage) {
		t.Fatalf("direct get of nothing: %v", err)
	}
	// A stream without direct gets has no responder for them.
	if _, err := nc.RequestWithContext(ctx, jsget.DirectSubject("PLAIN", "p.a"), nil); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("direct get of a stream without them: %v", err)
	}
}
