package envelope

import (
	"bytes"
	"encoding/binary"
	"math"
	"time"

	"github.com/capstan-dev/capstan/internal/msgpackhead"
)

// decodeRequestFast decodes a request in the form capstan's clients write it
// (a map of the known fields, strings as strings, integers as integers,
// times as the msgpack timestamp) by reading the bytes directly: every worker
// decodes one per execution. Anything else (another encoding of a value, a
// repeated key, bytes after the map) returns ok false and is left to the
// reflective decoder, so that both decode every request alike.
func decodeRequestFast(b []byte) (r Request, ok bool) {
	h, off, err := msgpackhead.Read(b, 0)
	if err != nil || h.Class != msgpackhead.Map {
		return r, false
	}
	var seen uint16
	for range h.N {
		var key []byte
		if key, off, ok = readStr(b, off); !ok {
			return r, false
		}
		bit := uint16(0)
		switch string(key) {
		case "v":
			bit = 1 << 0
			r.V, off, ok = readInt(b, off)
		case "executionId":
			bit = 1 << 1
			r.ExecutionID, off, ok = readString(b, off)
		case "capabilityId":
			bit = 1 << 2
			r.CapabilityID, off, ok = readString(b, off)
		case "input":
			bit = 1 << 3
			r.Input, off, ok = readRaw(b, off)
		case "actor":
			bit = 1 << 4
			r.Actor, off, ok = readActor(b, off)
		case "surface":
			bit = 1 << 5
			r.Surface, off, ok = readString(b, off)
		case "correlationId":
			bit = 1 << 6
			r.CorrelationID, off, ok = readString(b, off)
		case "submittedAt":
			bit = 1 << 7
			r.SubmittedAt, off, ok = readTime(b, off)
		case "deadline":
			bit = 1 << 8
			r.Deadline, off, ok = readTimePtr(b, off)
		case "startBy":
			bit = 1 << 9
			r.StartBy, off, ok = readTimePtr(b, off)
		case "approvalId":
			bit = 1 << 10
			r.ApprovalID, off, ok = readString(b, off)
		case "traceparent":
			bit = 1 << 11
			r.Traceparent, off, ok = readString(b, off)
		default:
			off, ok = skipValue(b, off)
		}
		if !ok || seen&bit != 0 {
			return r, false
		}
		seen |= bit
	}
	return r, off == len(b)
}

// readStr returns the bytes of the string at off.
func readStr(b []byte, off int) ([]byte, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.String || h.N > uint64(len(b)-next) {
		return nil, off, false
	}
	end := next + int(h.N)
	return b[next:end], end, true
}

func readString(b []byte, off int) (string, int, bool) {
	s, next, ok := readStr(b, off)
	return string(s), next, ok
}

func readInt(b []byte, off int) (int, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Int || h.Mag > math.MaxInt32 {
		return 0, off, false
	}
	if h.Neg {
		return -int(h.Mag), next, true
	}
	return int(h.Mag), next, true
}

// readRaw keeps the next value's bytes, as Raw.DecodeMsgpack does.
func readRaw(b []byte, off int) (Raw, int, bool) {
	end, ok := skipValue(b, off)
	if !ok {
		return nil, off, false
	}
	if end == off+1 && b[off] == 0xc0 {
		return nil, end, true
	}
	return Raw(bytes.Clone(b[off:end])), end, true
}

// skipValue returns the offset after the value at off.
func skipValue(b []byte, off int) (int, bool) {
	w := walker{b: b, off: off}
	if err := w.value(0); err != nil {
		return off, false
	}
	return w.off, true
}

func readActor(b []byte, off int) (a Actor, next int, ok bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Map {
		return a, off, false
	}
	var seen uint8
	for range h.N {
		var key []byte
		if key, next, ok = readStr(b, next); !ok {
			return a, off, false
		}
		bit := uint8(0)
		switch string(key) {
		case "id":
			bit = 1
			a.ID, next, ok = readString(b, next)
		case "kind":
			bit = 2
			a.Kind, next, ok = readString(b, next)
		case "attrs":
			bit = 4
			a.Attrs, next, ok = readAttrs(b, next)
		default:
			next, ok = skipValue(b, next)
		}
		if !ok || seen&bit != 0 {
			return a, off, false
		}
		seen |= bit
	}
	return a, next, true
}

func readAttrs(b []byte, off int) (map[string]string, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Map || h.N > uint64(len(b)-next) {
		return nil, off, false
	}
	m := make(map[string]string, h.N)
	for range h.N {
		var k, v string
		var ok bool
		if k, next, ok = readString(b, next); !ok {
			return nil, off, false
		}
		if v, next, ok = readString(b, next); !ok {
			return nil, off, false
		}
		if _, dup := m[k]; dup {
			return nil, off, false
		}
		m[k] = v
	}
	return m, next, true
}

// readTime reads a msgpack timestamp as the msgpack decoder does: the
// instant in the local zone, UTC when zero.
func readTime(b []byte, off int) (time.Time, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Ext || h.Ext != -1 || h.N > uint64(len(b)-next) {
		return time.Time{}, off, false
	}
	p := b[next : next+int(h.N)]
	var t time.Time
	switch len(p) {
	case 4:
		t = time.Unix(int64(binary.BigEndian.Uint32(p)), 0)
	case 8:
		sec := binary.BigEndian.Uint64(p)
		t = time.Unix(int64(sec&0x00000003ffffffff), int64(sec>>34))
	case 12:
		t = time.Unix(int64(binary.BigEndian.Uint64(p[4:])), int64(binary.BigEndian.Uint32(p)))
	default:
		return time.Time{}, off, false
	}
	if t.IsZero() {
		t = t.UTC()
	}
	return t, next + len(p), true
}

func readTimePtr(b []byte, off int) (*time.Time, int, bool) {
	if off < len(b) && b[off] == 0xc0 {
		return nil, off + 1, true
	}
	t, next, ok := readTime(b, off)
	if !ok {
		return nil, off, false
	}
	return &t, next, true
}

// decodeEnvelopeFast decodes an envelope in the form workers write it for
// a call that completes or fails (no approval, no recovery, an error without
// details) by reading the bytes directly: every client decodes one per call. Anything else returns ok
// false and is left to the reflective decoder, as decodeRequestFast does.
func decodeEnvelopeFast(b []byte) (e Envelope, ok bool) {
	h, off, err := msgpackhead.Read(b, 0)
	if err != nil || h.Class != msgpackhead.Map {
		return e, false
	}
	var seen uint16
	for range h.N {
		var key []byte
		if key, off, ok = readStr(b, off); !ok {
			return e, false
		}
		bit := uint16(0)
		switch string(key) {
		case "v":
			bit = 1 << 0
			e.V, off, ok = readInt(b, off)
		case "executionId":
			bit = 1 << 1
			e.ExecutionID, off, ok = readString(b, off)
		case "capabilityId":
			bit = 1 << 2
			e.CapabilityID, off, ok = readString(b, off)
		case "status":
			bit = 1 << 3
			var s string
			s, off, ok = readString(b, off)
			e.Status = Status(s)
		case "output":
			bit = 1 << 4
			e.Output, off, ok = readRaw(b, off)
		case "attempts":
			bit = 1 << 5
			e.Attempts, off, ok = readInt(b, off)
		case "durationMs":
			bit = 1 << 6
			var n int
			n, off, ok = readInt(b, off)
			e.DurationMs = int64(n)
		case "finalizedBy":
			bit = 1 << 7
			e.FinalizedBy, off, ok = readString(b, off)
		case "finalizedAt":
			bit = 1 << 8
			e.FinalizedAt, off, ok = readTime(b, off)
		case "error":
			bit = 1 << 9
			e.Error, off, ok = readError(b, off)
		case "approval", "recovered":
			// Left to the reflective decoder unless nil, which leaves the
			// pointer nil as it does.
			bit = 1 << 10
			ok = off < len(b) && b[off] == 0xc0
			off++
		default:
			off, ok = skipValue(b, off)
		}
		if !ok || (bit != 1<<10 && seen&bit != 0) {
			return e, false
		}
		seen |= bit
	}
	return e, off == len(b)
}

// readError reads an envelope's error, nil or one without details.
func readError(b []byte, off int) (*Error, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err == nil && h.Class == msgpackhead.Nil {
		return nil, next, true
	}
	if err != nil || h.Class != msgpackhead.Map {
		return nil, off, false
	}
	e := &Error{}
	var seen uint8
	ok := true
	for range h.N {
		var key []byte
		if key, next, ok = readStr(b, next); !ok {
			return nil, off, false
		}
		bit := uint8(0)
		switch string(key) {
		case "code":
			bit = 1 << 0
			var s string
			s, next, ok = readString(b, next)
			e.Code = Code(s)
		case "message":
			bit = 1 << 1
			e.Message, next, ok = readString(b, next)
		case "retryable":
			bit = 1 << 2
			e.Retryable, next, ok = readBool(b, next)
		case "exposeToModel":
			bit = 1 << 3
			e.ExposeToModel, next, ok = readBool(b, next)
		case "stage":
			bit = 1 << 4
			e.Stage, next, ok = readString(b, next)
		case "details":
			// Left to the reflective decoder unless nil.
			bit = 1 << 5
			ok = next < len(b) && b[next] == 0xc0
			next++
		default:
			next, ok = skipValue(b, next)
		}
		if !ok || seen&bit != 0 {
			return nil, off, false
		}
		seen |= bit
	}
	return e, next, true
}

func readBool(b []byte, off int) (bool, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Bool {
		return false, off, false
	}
	return h.True, next, true
}
