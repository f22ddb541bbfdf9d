package trail

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a signed statement of the tree: a C2SP tlog-checkpoint
// (origin, size, base64 root hash) with three extension lines that capstan's
// verifier reads and other tools ignore:
//
//	<origin>
//	<size>
//	<root hash, base64>
//	stream <audit stream name> <stream sequence of leaf 0>
//	retained <index of the first leaf the stream still held>
//	time <RFC 3339 time at which the stream stored the last leaf>
//
// then a blank line and the signature lines (signed-note format).
type Checkpoint struct {
	// Origin is the deployment's log name; the signing key has the same name.
	Origin string
	// Size is the number of leaves; Root the RFC 6962 hash of the tree.
	Size int64
	Root tlog.Hash
	// Stream is the audit stream's name and FirstSeq the stream sequence of
	// leaf 0: leaf i is the message at FirstSeq+i.
	Stream   string
	FirstSeq uint64
	// Retained is the first leaf the stream still held when the checkpoint
	// was signed: the leaves before it were removed by retention (or never
	// stored: see GapLeaf) and are proved by the stored hashes alone.
	Retained int64
	// Time is when the stream stored the last leaf (zero for an empty
	// tree): every leaf below Size was stored at or before it.
	Time time.Time
}

// Tree is the checkpoint's tree for tlog's proofs.
func (c *Checkpoint) Tree() tlog.Tree { return tlog.Tree{N: c.Size, Hash: c.Root} }

// Text is the checkpoint's note text (unsigned).
func (c *Checkpoint) Text() string {
	return fmt.Sprintf("%s\n%d\n%s\nstream %s %d\nretained %d\ntime %s\n", c.Origin, c.Size,
		base64.StdEncoding.EncodeToString(c.Root[:]), c.Stream, c.FirstSeq, c.Retained,
		c.Time.UTC().Format(time.RFC3339Nano))
}

// Sign returns the signed note of c.
func (c *Checkpoint) Sign(s note.Signer) ([]byte, error) {
	return note.Sign(&note.Note{Text: c.Text()}, s)
}

// ErrCheckpoint marks a checkpoint that does not parse or verify.
var ErrCheckpoint = errors.New("checkpoint")

// ParseText reads a checkpoint's note text. Lines it does not know after
// the third are ignored, as C2SP says; a checkpoint of another log (without
// capstan's lines) has a zero Stream.
func ParseText(text string) (*Checkpoint, error) {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if !strings.HasSuffix(text, "\n") || len(lines) < 3 {
		return nil, fmt.Errorf("%w: want origin, size and root hash lines", ErrCheckpoint)
	}
	c := &Checkpoint{Origin: lines[0]}
	if c.Origin == "" {
		return nil, fmt.Errorf("%w: empty origin", ErrCheckpoint)
	}
	n, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != lines[1] {
		return nil, fmt.Errorf("%w: size %q", ErrCheckpoint, lines[1])
	}
	c.Size = n
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != tlog.HashSize {
		return nil, fmt.Errorf("%w: root hash %q", ErrCheckpoint, lines[2])
	}
	copy(c.Root[:], root)
	for _, l := range lines[3:] {
		if l == "" {
			return nil, fmt.Errorf("%w: an empty line in the text", ErrCheckpoint)
		}
		k, v, _ := strings.Cut(l, " ")
		switch k {
		case "stream":
			name, seq, ok := strings.Cut(v, " ")
			s, err := strconv.ParseUint(seq, 10, 64)
			if !ok || err != nil || name == "" {
				return nil, fmt.Errorf("%w: %q", ErrCheckpoint, l)
			}
			c.Stream, c.FirstSeq = name, s
		case "retained":
			r, err := strconv.ParseInt(v, 10, 64)
			if err != nil || r < 0 || r > c.Size {
				return nil, fmt.Errorf("%w: %q", ErrCheckpoint, l)
			}
			c.Retained = r
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, fmt.Errorf("%w: %q", ErrCheckpoint, l)
			}
			c.Time = t
		}
	}
	return c, nil
}

// Open verifies a signed checkpoint with the known keys and parses it. Its
// origin must be the name of the key that signed it.
func Open(signed []byte, known note.Verifiers) (*Checkpoint, error) {
	n, err := note.Open(signed, known)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	c, err := ParseText(n.Text)
	if err != nil {
		return nil, err
	}
	for _, s := range n.Sigs {
		if s.Name == c.Origin {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: origin %q is not the name of the key that signed it (%s)", ErrCheckpoint, c.Origin, n.Sigs[0].Name)
}

// OpenUnverified parses a signed checkpoint without checking its signature:
// for reports about a checkpoint whose signature failed.
func OpenUnverified(signed []byte) (*Checkpoint, error) {
	text, _, ok := bytes.Cut(signed, []byte("\n\n"))
	if !ok {
		return nil, fmt.Errorf("%w: no signature block", ErrCheckpoint)
	}
	return ParseText(string(text) + "\n")
}
