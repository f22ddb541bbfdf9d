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
	cps, err := src.Checkpoints(ctx)
	if err != nil {
		return 0, err
	}
	for _, c := range cps {
		if err := enc.Encode(bundleLine{Checkpoint: string(c)}); err != nil {
			return 0, err
		}
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

// bundle is a Source read from an exported bundle file.
type bundle struct {
	path   string
	stream StreamState
	cps    [][]byte
	tiles  map[[2]int64][]byte
	// msgsAt is the offset of the first message line.
	msgsAt int64
}

// ReadBundle opens a bundle file as a Source. The checkpoints and tiles are
// read at once; the messages as they are needed.
func ReadBundle(path string) (Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := &bundle{path: path, tiles: map[[2]int64][]byte{}}
	r := bufio.NewReaderSize(f, 1<<16)
	var off int64
	for first := true; ; first = false {
		line, err := r.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			b.msgsAt = off
			return b, nil
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
		var l bundleLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%s: line after offset %d: %w", path, off, err)
		}
		switch {
		case l.Msg != nil:
			b.msgsAt = off
			return b, nil
		case l.Checkpoint != "":
			b.cps = append(b.cps, []byte(l.Checkpoint))
		case l.Tile != "":
			t, err := tlog.ParseTilePath(l.Tile)
			if err != nil || t.H != TileHeight {
				return nil, fmt.Errorf("%s: tile %q: not a tile of height %d", path, l.Tile, TileHeight)
			}
			b.tiles[[2]int64{int64(t.L), t.N}] = l.Hashes
		}
		off += int64(len(line))
	}
}

func (b *bundle) Stream(context.Context) (StreamState, error) { return b.stream, nil }

func (b *bundle) Checkpoints(context.Context) ([][]byte, error) { return b.cps, nil }

func (b *bundle) Tile(_ context.Context, level int, n int64) ([]byte, error) {
	d, ok := b.tiles[[2]int64{int64(level), n}]
	if !ok {
		return nil, ErrNoTile
	}
	return d, nil
}

func (b *bundle) Messages(ctx context.Context, from uint64, fn func(*Msg) error) error {
	f, err := os.Open(b.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(b.msgsAt, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			var l bundleLine
			if jerr := json.Unmarshal(line, &l); jerr != nil {
				return fmt.Errorf("%s: %w", b.path, jerr)
			}
			if l.Msg != nil && l.Msg.Seq >= from {
				if err := fn(l.Msg); err != nil {
					return err
				}
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

// LastCheckpoint is the last checkpoint a Source stores (nil when none):
// what an auditor keeps of a bundle.
func LastCheckpoint(ctx context.Context, src Source) ([]byte, error) {
	cps, err := src.Checkpoints(ctx)
	if err != nil || len(cps) == 0 {
		return nil, err
	}
	return cps[len(cps)-1], nil
}
