package msgenc

import (
	"bytes"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// record is a record of the shapes capstan's have: plain fields, a nested
// map, a pointer, and a field written by its own EncodeMsgpack.
type record struct {
	V        int            `json:"v"`
	ID       string         `json:"id,omitempty"`
	Empty    string         `json:"empty,omitempty"`
	At       time.Time      `json:"at"`
	Attrs    map[string]any `json:"attrs,omitempty"`
	Deadline *time.Time     `json:"deadline,omitempty"`
	Hot      hot            `json:"hot"`
}

type hot struct{ Name string }

func (h hot) EncodeMsgpack(enc *msgpack.Encoder) error {
	var f Fields
	f.String("name", h.Name)
	return f.Encode(enc)
}

func TestEncode_BytesAsMarshalsUntilReleased(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	for name, v := range map[string]any{
		"record": &record{V: 1, ID: "x", At: now, Attrs: map[string]any{"b": 1, "a": "2"}, Deadline: &now, Hot: hot{"h"}},
		"zero":   &record{},
		"slice":  []*record{{V: 1}, {V: 2, Attrs: map[string]any{"z": nil}}},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := Encode(v)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got := bytes.Clone(enc.Bytes())
			enc.Release()
			if !bytes.Equal(got, want) {
				t.Errorf("Encode wrote other bytes than Marshal\n got: %x\nwant: %x", got, want)
			}
		})
	}
	if _, err := Encode(make(chan int)); err == nil {
		t.Error("Encode of a channel: no error")
	}
}

// A record leaves every empty field out; a value only those its tags say.
func TestMarshalValue_KeepsWhatIsNotOmitempty(t *testing.T) {
	v := struct {
		A string `json:"a"`
		B int    `json:"b,omitempty"`
	}{}
	rec, err := Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	val, err := MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec, []byte{0x80}) || !bytes.Equal(val, []byte{0x81, 0xa1, 'a', 0xa0}) {
		t.Fatalf("record % x, value % x", rec, val)
	}
}
