package envelope

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/codectest"
)

type plainProgress Progress

func TestProgressEncoder_WritesTheReflectiveEncodersBytes(t *testing.T) {
	t.Parallel()
	var filled Progress
	codectest.Fill(&filled)
	for name, p := range map[string]Progress{
		"every field": filled,
		"zero":        {},
		"whole":       {V: Version, ExecutionID: testExecutionID, Attempt: 2, Done: 37, Total: 120, Message: "page 37", At: time.Now().UTC()},
		"no total":    {V: Version, ExecutionID: testExecutionID, Done: 0.5, At: time.Unix(1, 0)},
	} {
		got, want := mustMarshal(t, &p), mustMarshal(t, (*plainProgress)(&p))
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got % x\nwant % x", name, got, want)
		}
	}
}

func TestDecodeProgress_RefusesWhatTheContractRefuses(t *testing.T) {
	t.Parallel()
	good := Progress{V: Version, ExecutionID: testExecutionID, Attempt: 1, Done: 3, Total: 4, Message: "m", At: time.Unix(5, 0).UTC()}
	got, err := DecodeProgress(mustMarshal(t, &good))
	if err != nil || !got.At.Equal(good.At) {
		t.Fatalf("%+v %v", got, err)
	}
	got.At = good.At
	if *got != good {
		t.Fatalf("%+v %v", got, err)
	}
	for name, p := range map[string]Progress{
		"another version":   {V: 2, ExecutionID: testExecutionID},
		"no version":        {ExecutionID: testExecutionID},
		"no execution id":   {V: Version},
		"a bad id":          {V: Version, ExecutionID: "a b"},
		"NaN":               {V: Version, ExecutionID: testExecutionID, Done: math.NaN()},
		"infinite total":    {V: Version, ExecutionID: testExecutionID, Total: math.Inf(1)},
		"negative progress": {V: Version, ExecutionID: testExecutionID, Done: -1},
	} {
		if _, err := DecodeProgress(mustMarshal(t, (*plainProgress)(&p))); !errors.Is(err, ErrDecode) {
			t.Errorf("%s: %v, want ErrDecode", name, err)
		}
	}
	if _, err := DecodeProgress([]byte{0x93, 0x01}); !errors.Is(err, ErrDecode) {
		t.Errorf("garbage: %v", err)
	}
	dirty := good
	dirty.Message = "page\x1b[2J 37\nnext" + strings.Repeat("é", MaxProgressMessage)
	got, err = DecodeProgress(mustMarshal(t, &dirty))
	if _, _, want := CleanProgress(0, 0, dirty.Message); err != nil || got.Message != want {
		t.Errorf("a dirty message decodes as %q (%v), want %q", got.Message, err, want)
	}
}

func TestCleanProgress(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", MaxProgressMessage) // 2 bytes each
	for _, c := range []struct {
		name              string
		done, total       float64
		msg               string
		wantDone, wantTot float64
		wantMsg           string
	}{
		{"as reported", 37, 120, "page 37", 37, 120, "page 37"},
		{"not finite", math.NaN(), math.Inf(1), "", 0, 0, ""},
		{"negative", -3, -1, "x", 0, 0, "x"},
		{"a terminal's escapes and newlines become spaces", 1, 2, "a\x1b[2Jb\nc\r", 1, 2, "a [2Jb c "},
		{"invalid UTF-8", 0, 0, "a\xffb", 0, 0, "a\uFFFDb"},
		{"cut at a character boundary", 0, 0, long, 0, 0, long[:MaxProgressMessage]},
	} {
		d, tot, m := CleanProgress(c.done, c.total, c.msg)
		if d != c.wantDone || tot != c.wantTot || m != c.wantMsg {
			t.Errorf("%s: %v %v %q", c.name, d, tot, m)
		}
	}
	_, _, m := CleanProgress(0, 0, long+"x")
	if len(m) > MaxProgressMessage {
		t.Errorf("%d bytes", len(m))
	}
}

func TestProgressString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p    *Progress
		want string
	}{
		{&Progress{Done: 37, Total: 120, Message: "rendering"}, "37 of 120 (30%): rendering"},
		{&Progress{Done: 37}, "37"},
		{&Progress{Done: 2.5, Message: "MB"}, "2.5: MB"},
		{&Progress{Message: "warming up"}, "warming up"},
		{&Progress{Done: 130, Total: 120}, "130 of 120 (100%)"},
		{nil, ""},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.p, got, c.want)
		}
	}
}
