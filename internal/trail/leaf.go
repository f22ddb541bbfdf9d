package trail

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"golang.org/x/mod/sumdb/tlog"
)

// A leaf of the tree is one stored audit message: its subject, every header
// it was stored with, and its data, framed so that no two messages share a
// leaf (docs/wire.md, "The trail's leaves"):
//
//	leaf   = u32(len(subject)) subject u32(len(header)) header data
//	header = "" when the message has none, otherwise
//	         "NATS/1.0\r\n" (name ": " value "\r\n", names in byte order,
//	         each name's values in stored order) "\r\n"
//
// with u32 a big-endian 32-bit length. Its hash is RFC 6962's leaf hash,
// SHA-256(0x00 || leaf) (tlog.RecordHash). The stream sequence is not in
// the leaf: it is the leaf's place in the tree (Checkpoint.FirstSeq plus the
// index), so that a message moved to another place is told apart from one
// whose content changed.

// LeafData is the leaf of a message stored on subject with header h and
// data.
func LeafData(subject string, h nats.Header, data []byte) []byte {
	hdr := headerBlock(h)
	b := make([]byte, 0, 8+len(subject)+len(hdr)+len(data))
	b = binary.BigEndian.AppendUint32(b, uint32(len(subject)))
	b = append(b, subject...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(hdr)))
	b = append(b, hdr...)
	return append(b, data...)
}

// LeafHash is the RFC 6962 leaf hash of a message, tlog.RecordHash of its
// LeafData, without copying the message.
func LeafHash(subject string, h nats.Header, data []byte) tlog.Hash {
	hdr := headerBlock(h)
	var n [4]byte
	d := sha256.New()
	d.Write([]byte{0x00}) // RFC 6962's leaf prefix
	binary.BigEndian.PutUint32(n[:], uint32(len(subject)))
	d.Write(n[:])
	io.WriteString(d, subject)
	binary.BigEndian.PutUint32(n[:], uint32(len(hdr)))
	d.Write(n[:])
	d.Write(hdr)
	d.Write(data)
	var out tlog.Hash
	d.Sum(out[:0])
	return out
}

// GapLeaf is the leaf of a stream sequence that held no message when the
// checkpointer reached it (removed before it was read): an empty subject,
// which no stored message has, and the sequence in decimal as its data.
func GapLeaf(seq uint64) []byte {
	return LeafData("", nil, []byte(strconv.FormatUint(seq, 10)))
}

// headerBlock is h in the NATS header encoding, names sorted: the same bytes
// for the same header however it was read.
func headerBlock(h nats.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	var b []byte
	if len(h) == 1 {
		// An audit message's one header, Capstan-Execution: no sort.
		for k, vs := range h {
			b = make([]byte, 0, 14+len(k)*len(vs)+64*len(vs))
			b = append(b, "NATS/1.0\r\n"...)
			for _, v := range vs {
				b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
			}
		}
		return append(b, "\r\n"...)
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	b = []byte("NATS/1.0\r\n")
	for _, k := range names {
		for _, v := range h[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}
