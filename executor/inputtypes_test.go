package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// degrees decodes itself from JSON: a number, or a string like "21.5C".
type degrees float64

func (d *degrees) UnmarshalJSON(b []byte) error {
	if s, ok := bytes.CutSuffix(b, []byte(`C"`)); ok && len(s) > 0 && s[0] == '"' {
		b = s[1:]
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return errors.New("expected degrees Celsius")
	}
	if f < -273.15 {
		return errors.New("below absolute zero")
	}
	*d = degrees(f)
	return nil
}

type typesPart struct {
	Note string `json:"note,omitempty"`
}

// typesIn holds every type an input reasonably declares.
type typesIn struct {
	At     time.Time          `json:"at,omitzero"`
	Every  time.Duration      `json:"every,omitempty"`
	I8     int8               `json:"i8,omitempty"`
	I16    int16              `json:"i16,omitempty"`
	I32    int32              `json:"i32,omitempty"`
	I64    int64              `json:"i64,omitempty"`
	I      int                `json:"i,omitempty"`
	U8     uint8              `json:"u8,omitempty"`
	U16    uint16             `json:"u16,omitempty"`
	U32    uint32             `json:"u32,omitempty"`
	U64    uint64             `json:"u64,omitempty"`
	U      uint               `json:"u,omitempty"`
	F32    float32            `json:"f32,omitempty"`
	F64    float64            `json:"f64,omitempty"`
	Blob   []byte             `json:"blob,omitempty"`
	Ptr    *int32             `json:"ptr,omitempty"`
	Nested *typesNested       `json:"nested,omitempty"`
	Tags   map[string]int     `json:"tags,omitempty"`
	Keys   map[int16]string   `json:"keys,omitempty"`
	Hosts  map[netip.Addr]int `json:"hosts,omitempty"`
	List   []string           `json:"list,omitempty"`
	Pair   [2]int             `json:"pair,omitzero"`
	Raw    json.RawMessage    `json:"raw,omitempty"`
	Temp   degrees            `json:"temp,omitempty"`
	Addr   netip.Addr         `json:"addr,omitzero"`
	ID     uuid.UUID          `json:"id,omitzero"`
	Quoted int64              `json:"quoted,string,omitempty"`
	typesPart
}

type typesNested struct {
	Name  string `json:"name"`
	Count uint16 `json:"count"`
}

// Every type, sent as JSON the way the CLI, MCP hosts and clients in other
// languages send it, reaches a real worker's handler as the value
// encoding/json gives it; JSON that does not fit ends INPUT_INVALID with the
// issue's path.
func TestInputTypes_JSONReachesTheHandlerAsEncodingJSONReadsIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	// The handler answers with its input as encoding/json writes it.
	echo := executor.Define("types.echo", executor.Meta{
		Description: "Returns what it received.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[typesIn]) (string, error) {
		b, err := json.Marshal(c.Input)
		return string(b), err
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, echo)
	c := newClient(t, env.Connect(t))

	for _, row := range []struct {
		name  string
		input string
		same  string // JSON encoding/json reads as the same input; empty: input itself
		path  string // refused: the issue's path
	}{
		{name: "time.Time", input: `{"at":"2026-11-30T10:00:00Z"}`},
		{name: "time.Time with offset", input: `{"at":"2026-11-30T11:00:00.25+01:00"}`},
		{name: "time.Time not RFC 3339", input: `{"at":"30/11/2026"}`, path: "at"},
		{name: "time.Duration nanoseconds", input: `{"every":90000000000}`},
		{name: "time.Duration string", input: `{"every":"1m30s"}`, same: `{"every":90000000000}`},
		{name: "time.Duration bad string", input: `{"every":"a while"}`, path: "every"},
		{name: "int8", input: `{"i8":-128}`},
		{name: "int8 out of range", input: `{"i8":128}`, path: "i8"},
		{name: "int16", input: `{"i16":32767}`},
		{name: "int16 out of range", input: `{"i16":-32769}`, path: "i16"},
		{name: "int32", input: `{"i32":-2147483648}`},
		{name: "int32 out of range", input: `{"i32":2147483648}`, path: "i32"},
		{name: "int64", input: `{"i64":9223372036854775807}`},
		{name: "int64 out of range", input: `{"i64":9223372036854775808}`, path: "i64"},
		{name: "int", input: `{"i":-9223372036854775808}`},
		{name: "int fraction", input: `{"i":1.5}`, path: "i"},
		{name: "uint8", input: `{"u8":255}`},
		{name: "uint8 out of range", input: `{"u8":256}`, path: "u8"},
		{name: "uint16", input: `{"u16":65535}`},
		{name: "uint32", input: `{"u32":4294967295}`},
		{name: "uint32 out of range", input: `{"u32":4294967296}`, path: "u32"},
		{name: "uint64", input: `{"u64":18446744073709551615}`},
		{name: "uint64 out of range", input: `{"u64":18446744073709551616}`, path: "u64"},
		{name: "uint negative", input: `{"u":-1}`, path: "u"},
		{name: "float32", input: `{"f32":0.1}`},
		{name: "float32 out of range", input: `{"f32":1e39}`, path: "f32"},
		{name: "float64", input: `{"f64":-2.5e-300}`},
		{name: "float64 as a string", input: `{"f64":"1"}`, path: "f64"},
		{name: "[]byte", input: `{"blob":"AAEC/w=="}`},
		{name: "[]byte not base64", input: `{"blob":"hello!"}`, path: "blob"},
		{name: "pointer", input: `{"ptr":7}`},
		{name: "pointer null", input: `{"ptr":null}`},
		{name: "nested struct", input: `{"nested":{"name":"n","count":2}}`},
		{name: "nested unknown field", input: `{"nested":{"name":"n","count":1,"colour":"red"}}`, path: "nested.colour"},
		{name: "nested required field missing", input: `{"nested":{"name":"n"}}`, path: "nested.count"},
		{name: "nested wrong type", input: `{"nested":{"name":"n","count":-2}}`, path: "nested.count"},
		{name: "map", input: `{"tags":{"a":1,"b":2}}`},
		{name: "map wrong value", input: `{"tags":{"a":"1"}}`, path: "tags.a"},
		{name: "map with integer keys", input: `{"keys":{"-3":"x","12":"y"}}`},
		{name: "map key out of range", input: `{"keys":{"40000":"x"}}`, path: `keys["40000"]`},
		{name: "map with text keys", input: `{"hosts":{"10.0.0.1":1,"::1":2}}`},
		{name: "slice", input: `{"list":["a","b"]}`},
		{name: "slice wrong item", input: `{"list":["a",2]}`, path: "list[1]"},
		{name: "array", input: `{"pair":[1,2]}`},
		{name: "array too long", input: `{"pair":[1,2,3]}`, path: "pair"},
		{name: "json.RawMessage", input: `{"raw":{"free":["form",1,true,null]}}`},
		{name: "json.Unmarshaler", input: `{"temp":"21.5C"}`, same: `{"temp":21.5}`},
		{name: "json.Unmarshaler refuses", input: `{"temp":-300}`, path: "temp"},
		{name: "netip.Addr", input: `{"addr":"2001:db8::1"}`},
		{name: "netip.Addr invalid", input: `{"addr":"10.0.0.256"}`, path: "addr"},
		{name: "uuid.UUID", input: `{"id":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60"}`},
		{name: "uuid.UUID invalid", input: `{"id":"nope"}`, path: "id"},
		{name: "embedded struct", input: `{"note":"inlined"}`},
		{name: "embedded by name", input: `{"typesPart":{"note":"x"}}`, path: "typesPart"},
		{name: "string option", input: `{"quoted":"-42"}`},
		{name: "string option not a number", input: `{"quoted":"many"}`, path: "quoted"},
		{name: "unknown field", input: `{"i8":1,"bogus":true}`, path: "bogus"},
	} {
		t.Run(row.name, func(t *testing.T) {
			got, err := c.Call(ctxT(t), "types.echo", json.RawMessage(row.input))
			if err != nil {
				t.Fatal(err)
			}
			if row.path != "" {
				if got.Status != envelope.StatusFailed || got.Error == nil || got.Error.Code != envelope.CodeInputInvalid {
					t.Fatalf("status %s, error %+v; want INPUT_INVALID", got.Status, got.Error)
				}
				var d struct{ Issues []envelope.Issue }
				b, _ := json.Marshal(got.Error.Details)
				if err := json.Unmarshal(b, &d); err != nil || len(d.Issues) != 1 || d.Issues[0].Path != row.path {
					t.Fatalf("details %s, want one issue at %q", b, row.path)
				}
				return
			}
			if got.Status != envelope.StatusCompleted {
				t.Fatalf("status %s, error %+v", got.Status, got.Error)
			}
			var seen string
			if err := got.Output.Decode(&seen); err != nil {
				t.Fatal(err)
			}
			// What encoding/json makes of the same JSON, written back.
			same := row.same
			if same == "" {
				same = row.input
			}
			var want typesIn
			if err := json.Unmarshal([]byte(same), &want); err != nil {
				t.Fatalf("encoding/json refuses %s: %v", same, err)
			}
			wantJSON, _ := json.Marshal(want)
			if seen != string(wantJSON) {
				t.Fatalf("the handler saw %s\n want %s", seen, wantJSON)
			}
		})
	}
}

type typesOut struct {
	At     time.Time        `json:"at"`
	Every  time.Duration    `json:"every"`
	F32    float32          `json:"f32"`
	U64    uint64           `json:"u64"`
	I8     int8             `json:"i8"`
	Blob   []byte           `json:"blob"`
	Keys   map[int]string   `json:"keys"`
	Ptr    *int32           `json:"ptr"`
	Nested typesNested      `json:"nested"`
	List   []string         `json:"list"`
	Zero   int              `json:"zero"`
	Maybe  *typesNested     `json:"maybe"`
	Tags   map[string]int64 `json:"tags,omitempty"`
}

// A handler's output reads in the envelope's JSON as encoding/json writes it:
// a time.Time in RFC 3339 (in UTC: msgpack keeps the instant), []byte in
// base64, float32 in its shortest form, every integer width exactly.
func TestOutputTypes_EnvelopeJSONReadsAsEncodingJSONWritesIt(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	seven := int32(7)
	out := typesOut{
		At: time.Date(2026, 11, 30, 11, 0, 0, 123456789, time.FixedZone("CET", 3600)), Every: 90 * time.Second,
		F32: 0.1, U64: math.MaxUint64, I8: -128, Blob: []byte{0, 1, 2, 255}, Keys: map[int]string{-1: "a", 2: "b"},
		Ptr: &seven, Nested: typesNested{Name: "n", Count: 3}, List: []string{"x"},
	}
	cap := executor.Define("types.out", executor.Meta{
		Description: "Returns typed values.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectNone,
	}, func(ctx context.Context, c executor.Call[struct{}]) (typesOut, error) {
		return out, nil
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, cap)
	c := newClient(t, env.Connect(t))

	got, err := c.Call(ctxT(t), "types.out", nil)
	if err != nil || got.Status != envelope.StatusCompleted {
		t.Fatalf("status %v, err %v", got, err)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var asJSON struct{ Output json.RawMessage }
	if err := json.Unmarshal(b, &asJSON); err != nil {
		t.Fatal(err)
	}
	var gotOut map[string]any
	if err := json.Unmarshal(asJSON.Output, &gotOut); err != nil {
		t.Fatal(err)
	}
	if gotOut["at"] != "2026-11-30T10:00:00.123456789Z" {
		t.Errorf("at reads %v, want RFC 3339 in UTC", gotOut["at"])
	}
	want := out
	want.At = out.At.UTC()
	wb, _ := json.Marshal(want)
	var wantOut map[string]any
	if err := json.Unmarshal(wb, &wantOut); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotOut, wantOut) {
		t.Errorf("output\n %s\nwant\n %s", asJSON.Output, wb)
	}
	// A Go client reads the output back as the type it was.
	var back typesOut
	if err := got.Output.Decode(&back); err != nil || !back.At.Equal(out.At) || back.F32 != out.F32 || back.U64 != out.U64 ||
		!bytes.Equal(back.Blob, out.Blob) || *back.Ptr != seven {
		t.Fatalf("decoded %+v, err %v", back, err)
	}
}

type meeting struct {
	At    time.Time     `json:"at"`
	Every time.Duration `json:"every"`
	Share float32       `json:"share"`
	Room  uuid.UUID     `json:"room"`
	Host  netip.Addr    `json:"host"`
	Notes []byte        `json:"notes"`
}

// An approval stores the validated input as canonical JSON, and a resume
// checks that JSON again against the input type: a time, a duration, a
// float32, a UUID, an IP address and bytes make the trip and reach the
// handler as they were.
func TestInputTypes_ApprovedInputResumesWithItsTypes(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	book := executor.Define("rooms.book", executor.Meta{
		Description: "Books a recurring meeting.", Expose: executor.On(executor.SurfaceDirect), SideEffect: executor.SideEffectWrite,
		Approval: &executor.ApprovalRule{Required: true, Reason: "bookings are reviewed"},
	}, func(ctx context.Context, c executor.Call[meeting]) (meeting, error) {
		return c.Input, nil
	})
	startWorker(t, env.Connect(t), executor.WorkerConfig{}, book)
	c := newClient(t, env.Connect(t))

	_, rec := requireApproval(t, c, "rooms.book", json.RawMessage(`{"at":"2026-12-01T09:30:00+01:00","every":"168h","share":0.25,`+
		`"room":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60","host":"10.0.0.1","notes":"AAH/"}`))
	if want := `{"at":"2026-12-01T09:30:00+01:00","every":604800000000000,"host":"10.0.0.1","notes":"AAH/",` +
		`"room":"0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60","share":0.25}`; string(rec.Input) != want {
		t.Fatalf("the approval holds %s\n want %s", rec.Input, want)
	}
	decide(t, c, rec.ID, true)
	done, err := c.Resume(ctxT(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != envelope.StatusCompleted {
		t.Fatalf("resume: %s %+v", done.Status, done.Error)
	}
	var got meeting
	if err := done.Output.Decode(&got); err != nil || !got.At.Equal(time.Date(2026, 12, 1, 8, 30, 0, 0, time.UTC)) ||
		got.Every != 7*24*time.Hour || got.Share != 0.25 || got.Room.String() != "0190d6c8-8b7e-7c3a-9f4e-2b1d3c4e5f60" ||
		got.Host != netip.MustParseAddr("10.0.0.1") || !bytes.Equal(got.Notes, []byte{0, 1, 255}) {
		t.Fatalf("the handler saw %+v (%v)", got, err)
	}
}
