package envelope_test

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/envelope"
)

// A timestamp in a value reads as RFC 3339 in UTC, whatever the reader's
// local zone: msgpack carries the instant, not the zone it was written in.
func TestRawJSON_TimestampsReadAsRFC3339InUTC(t *testing.T) {
	local := time.Local
	time.Local = time.FixedZone("UTC+5", 5*3600)
	t.Cleanup(func() { time.Local = local })

	at := time.Date(2026, 11, 30, 10, 0, 0, 5, time.FixedZone("CET", 3600))
	b, err := json.Marshal(envelope.MustRaw(map[string]any{"at": at, "list": []any{at}}))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"at":"2026-11-30T09:00:00.000000005Z","list":["2026-11-30T09:00:00.000000005Z"]}`; string(b) != want {
		t.Fatalf("%s\nwant %s", b, want)
	}
}

// A value keeps every field its json tag does not mark omitempty, as
// encoding/json writes it: zeros, and structs without exported fields.
func TestNewRaw_KeepsFieldsThatAreNotOmitempty(t *testing.T) {
	type v struct {
		Addr netip.Addr `json:"addr"`
		Zero int        `json:"zero"`
		Gone int        `json:"gone,omitempty"`
	}
	var got map[string]any
	raw := envelope.MustRaw(v{Addr: netip.MustParseAddr("10.0.0.1")})
	if err := raw.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got["addr"]; !ok || len(got) != 2 || got["zero"] != int8(0) {
		t.Fatalf("%#v: want addr and zero, not gone", got)
	}
	var back v
	if err := raw.Decode(&back); err != nil || back.Addr != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("%+v, %v", back, err)
	}
}
