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
	end, ok := readFields(b, 0, func(key []byte, off int) (next int, bit uint16, ok bool) {
		switch string(key) {
		case "v":
			bit = 1 << 0
			r.V, next, ok = readInt(b, off)
		case "executionId":
			bit = 1 << 1
			r.ExecutionID, next, ok = readString(b, off)
		case "capabilityId":
			bit = 1 << 2
			r.CapabilityID, next, ok = readString(b, off)
		case "input":
			bit = 1 << 3
			r.Input, next, ok = readRaw(b, off)
		case "actor":
			bit = 1 << 4
			r.Actor, next, ok = readActor(b, off)
		case "surface":
			bit = 1 << 5
			r.Surface, next, ok = readString(b, off)
		case "correlationId":
			bit = 1 << 6
			r.CorrelationID, next, ok = readString(b, off)
		case "submittedAt":
			bit = 1 << 7
			r.SubmittedAt, next, ok = readTime(b, off)
		case "deadline":
			bit = 1 << 8
			r.Deadline, next, ok = readTimePtr(b, off)
		case "startBy":
			bit = 1 << 9
			r.StartBy, next, ok = readTimePtr(b, off)
		case "approvalId":
			bit = 1 << 10
			r.ApprovalID, next, ok = readString(b, off)
		case "traceparent":
			bit = 1 << 11
			r.Traceparent, next, ok = readString(b, off)
		default:
			next, ok = skipValue(b, off)
		}
		return next, bit, ok
	})
	return r, ok && end == len(b)
}

// readFields reads the msgpack map at off, handing each member's key and
// the offset of its value to field, which reads the value and returns the
// offset after it and the field's bit (0 for a key it skips, or one that
// may repeat). A member field cannot read, a key that is not a string, or
// a bit seen twice is not ok.
func readFields(b []byte, off int, field func(key []byte, off int) (next int, bit uint16, ok bool)) (int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Map {
		return off, false
	}
	var seen uint16
	for range h.N {
		key, at, ok := readStr(b, next)
		if !ok {
			return off, false
		}
		var bit uint16
		if next, bit, ok = field(key, at); !ok || seen&bit != 0 {
			return off, false
		}
		seen |= bit
	}
	return next, true
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
	next, ok = readFields(b, off, func(key []byte, off int) (next int, bit uint16, ok bool) {
		switch string(key) {
		case "id":
			bit = 1 << 0
			a.ID, next, ok = readString(b, off)
		case "kind":
			bit = 1 << 1
			a.Kind, next, ok = readString(b, off)
		case "attrs":
			bit = 1 << 2
			a.Attrs, next, ok = readAttrs(b, off)
		default:
			next, ok = skipValue(b, off)
		}
		return next, bit, ok
	})
	return a, next, ok
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
	end, ok := readFields(b, 0, func(key []byte, off int) (next int, bit uint16, ok bool) {
		switch string(key) {
		case "v":
			bit = 1 << 0
			e.V, next, ok = readInt(b, off)
		case "executionId":
			bit = 1 << 1
			e.ExecutionID, next, ok = readString(b, off)
		case "capabilityId":
			bit = 1 << 2
			e.CapabilityID, next, ok = readString(b, off)
		case "status":
			bit = 1 << 3
			var s string
			s, next, ok = readString(b, off)
			e.Status = Status(s)
		case "output":
			bit = 1 << 4
			e.Output, next, ok = readRaw(b, off)
		case "attempts":
			bit = 1 << 5
			e.Attempts, next, ok = readInt(b, off)
		case "durationMs":
			bit = 1 << 6
			var n int
			n, next, ok = readInt(b, off)
			e.DurationMs = int64(n)
		case "finalizedBy":
			bit = 1 << 7
			e.FinalizedBy, next, ok = readString(b, off)
		case "finalizedAt":
			bit = 1 << 8
			e.FinalizedAt, next, ok = readTime(b, off)
		case "error":
			bit = 1 << 9
			e.Error, next, ok = readError(b, off)
		case "approval", "recovered":
			// Left to the reflective decoder unless nil, which leaves the
			// pointer nil as it does (and may repeat).
			next, ok = readNil(b, off)
		default:
			next, ok = skipValue(b, off)
		}
		return next, bit, ok
	})
	return e, ok && end == len(b)
}

// readError reads an envelope's error, nil or one without details.
func readError(b []byte, off int) (*Error, int, bool) {
	if next, ok := readNil(b, off); ok {
		return nil, next, true
	}
	e := &Error{}
	next, ok := readFields(b, off, func(key []byte, off int) (next int, bit uint16, ok bool) {
		switch string(key) {
		case "code":
			bit = 1 << 0
			var s string
			s, next, ok = readString(b, off)
			e.Code = Code(s)
		case "message":
			bit = 1 << 1
			e.Message, next, ok = readString(b, off)
		case "retryable":
			bit = 1 << 2
			e.Retryable, next, ok = readBool(b, off)
		case "exposeToModel":
			bit = 1 << 3
			e.ExposeToModel, next, ok = readBool(b, off)
		case "stage":
			bit = 1 << 4
			e.Stage, next, ok = readString(b, off)
		case "details":
			// Left to the reflective decoder unless nil.
			bit = 1 << 5
			next, ok = readNil(b, off)
		default:
			next, ok = skipValue(b, off)
		}
		return next, bit, ok
	})
	if !ok {
		return nil, off, false
	}
	return e, next, true
}

// readNil reads a msgpack nil at off.
func readNil(b []byte, off int) (int, bool) {
	return off + 1, off < len(b) && b[off] == 0xc0
}

func readBool(b []byte, off int) (bool, int, bool) {
	h, next, err := msgpackhead.Read(b, off)
	if err != nil || h.Class != msgpackhead.Bool {
		return false, off, false
	}
	return h.True, next, true
}
