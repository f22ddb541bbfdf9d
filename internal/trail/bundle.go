package trail

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// A bundle is a log exported for an auditor who has no access to the
// deployment (docs/wire.md, "Bundles"): JSON lines, in this order — a
// header, every stored checkpoint, every stored tile, then every message
// the stream holds.
//
//	{"capstanAuditBundle":1,"stream":{...},"exportedAt":"..."}
//	{"checkpoint":"<signed note>"}
//	{"tile":"tile/8/0/000","hashes":"<base64>"}
//	{"msg":{"seq":1,"subject":"...","header":{...},"data":"<base64>","time":"..."}}

// bundleVersion is the bundle format's version.
const bundleVersion = 1

type bundleHeader struct {
	Version    int         `json:"capstanAuditBundle"`
	Stream     StreamState `json:"stream"`
	ExportedAt time.Time   `json:"exportedAt"`
}

type bundleLine struct {
	Version    int    `json:"capstanAuditBundle,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Tile       string `json:"tile,omitempty"`
	Hashes     []byte `json:"hashes,omitempty"`
	Msg        *Msg   `json:"msg,omitempty"`
}

// Export writes src's log to w as a bundle. It returns how many messages
// it wrote.
func Export(ctx context.Context, src Source, w io.Writer, now time.Time) (int64, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	st, err := src.Stream(ctx)
	if err != nil {
		return 0, err
	}
	if err := enc.Encode(bundleHeader{Version: bundleVersion, Stream: st, ExportedAt: now.UTC()}); err != nil {
		return 0, err
	}
	if err := src.Checkpoints(ctx, func(c []byte) error { return enc.Encode(bundleLine{Checkpoint: string(c)}) }); err != nil {
		return 0, err
	}
	for level := 0; ; level++ {
		n := int64(0)
		for ; ; n++ {
			d, err := src.Tile(ctx, level, n)
			if errors.Is(err, ErrNoTile) {
				break
			}
			if err != nil {
				return 0, err
			}
			if err := enc.Encode(bundleLine{Tile: tileKey(level, n), Hashes: d}); err != nil {
				return 0, err
			}
			if len(d) < tileWidth*tlog.HashSize {
				n++
				break
			}
		}
		if n == 0 {
			break
		}
	}
	var count int64
	err = src.Messages(ctx, st.FirstSeq, func(m *Msg) error {
		count++
		return enc.Encode(bundleLine{Msg: m})
	})
	if err != nil {
		return count, err
	}
	return count, bw.Flush()
}

// bundle is a Source read from an exported bundle file, a line at a time:
// a month's bundle holds millions of checkpoints and messages.
type bundle struct {
	path   string
	stream StreamState
	// cpsAt is the offset of the first checkpoint line, msgsAt of the
	// first message line; tiles are where each tile's line is.
	cpsAt, msgsAt int64
	tiles         map[[2]int64][2]int64 // (level, n) → offset, length
}

// ReadBundle opens a bundle file as a Source: it reads it once through to
// know where its parts are.
func ReadBundle(path string) (Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := &bundle{path: path, tiles: map[[2]int64][2]int64{}, cpsAt: -1}
	r := bufio.NewReaderSize(f, 1<<16)
	var off int64
	for first := true; ; first = false {
		line, err := r.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			b.msgsAt = off
			break
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		if first {
			var h bundleHeader
			if jerr := json.Unmarshal(line, &h); jerr != nil || h.Version != bundleVersion {
				return nil, fmt.Errorf("%s: not an audit bundle of capstan's (made by 'capstan audit export')", path)
			}
			b.stream = h.Stream
			off += int64(len(line))
			continue
		}
		var l struct {
			Checkpoint *string          `json:"checkpoint"`
			Tile       string           `json:"tile"`
			Msg        *json.RawMessage `json:"msg"`
		}
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%s: line after offset %d: %w", path, off, err)
		}
		if l.Msg != nil {
			b.msgsAt = off
			break
		}
		switch {
		case l.Checkpoint != nil:
			if b.cpsAt < 0 {
				b.cpsAt = off
			}
		case l.Tile != "":
			t, err := tlog.ParseTilePath(l.Tile)
			if err != nil || t.H != TileHeight {
				return nil, fmt.Errorf("%s: tile %q: not a tile of height %d", path, l.Tile, TileHeight)
			}
			b.tiles[[2]int64{int64(t.L), t.N}] = [2]int64{off, int64(len(line))}
		}
		off += int64(len(line))
	}
	return b, nil
}

func (b *bundle) Stream(context.Context) (StreamState, error) { return b.stream, nil }

// lines calls fn with each line of the bundle from offset at on, until fn
// returns false or an error.
func (b *bundle) lines(ctx context.Context, at int64, fn func(line []byte) (bool, error)) error {
	f, err := os.Open(b.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(at, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			more, ferr := fn(line)
			if ferr != nil || !more {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func (b *bundle) Checkpoints(ctx context.Context, fn func([]byte) error) error {
	if b.cpsAt < 0 {
		return nil
	}
	return b.lines(ctx, b.cpsAt, func(line []byte) (bool, error) {
		var l bundleLine
		if err := json.Unmarshal(line, &l); err != nil {
			return false, fmt.Errorf("%s: %w", b.path, err)
		}
		if l.Checkpoint == "" {
			return false, nil // the tiles begin
		}
		return true, fn([]byte(l.Checkpoint))
	})
}

func (b *bundle) Tile(_ context.Context, level int, n int64) ([]byte, error) {
	at, ok := b.tiles[[2]int64{int64(level), n}]
	if !ok {
		return nil, ErrNoTile
	}
	f, err := os.Open(b.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	line := make([]byte, at[1])
	if _, err := f.ReadAt(line, at[0]); err != nil {
		return nil, err
	}
	var l bundleLine
	if err := json.Unmarshal(line, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", b.path, err)
	}
	return l.Hashes, nil
}

func (b *bundle) Messages(ctx context.Context, from uint64, fn func(*Msg) error) error {
	return b.lines(ctx, b.msgsAt, func(line []byte) (bool, error) {
		var l bundleLine
		if err := json.Unmarshal(line, &l); err != nil {
			return false, fmt.Errorf("%s: %w", b.path, err)
		}
		if l.Msg != nil && l.Msg.Seq >= from {
			return true, fn(l.Msg)
		}
		return true, nil
	})
}

// LastCheckpoint is the last checkpoint a Source stores (nil when none):
// what an auditor keeps of a bundle.
func LastCheckpoint(ctx context.Context, src Source) ([]byte, error) {
	var last []byte
	err := src.Checkpoints(ctx, func(c []byte) error { last = c; return nil })
	return last, err
}
