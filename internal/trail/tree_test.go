package trail

import (
	"bytes"
	"fmt"
	"testing"

	"golang.org/x/mod/sumdb/tlog"
)

// memHashes is a tree's stored hashes in memory, as tlog computes them: the
// reference the edge is checked against.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		if x >= int64(len(m)) {
			return nil, fmt.Errorf("index %d not stored", x)
		}
		out[i] = m[x]
	}
	return out, nil
}

func (m *memHashes) add(t *testing.T, n int64, data []byte) {
	hs, err := tlog.StoredHashes(n, data, *m)
	if err != nil {
		t.Fatal(err)
	}
	*m = append(*m, hs...)
}

// memTiles serves a memHashes as tiles.
type memTiles struct{ m memHashes }

func (memTiles) Height() int { return TileHeight }
func (r memTiles) ReadTiles(ts []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(ts))
	for i, t := range ts {
		d, err := tlog.ReadTileData(t, r.m)
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}
func (memTiles) SaveTiles([]tlog.Tile, [][]byte) {}

// TestEdge_MatchesTlog grows a tree leaf by leaf past two tile levels and
// checks, at every size, the edge's root against tlog's, the tiles it hands
// out against tlog's NewTiles and ReadTileData, and an edge rebuilt from
// authenticated tiles against the one grown.
func TestEdge_MatchesTlog(t *testing.T) {
	var m memHashes
	e := &edge{}
	stored := map[tlog.Tile][]byte{} // the latest data of each tile, by full coordinates
	last := int64(0)
	const n = 3*tileWidth*tileWidth + 300
	for i := int64(0); i < n; i++ {
		data := []byte(fmt.Sprintf("leaf %d", i))
		m.add(t, i, data)
		e.append(tlog.RecordHash(data))
		size := i + 1
		check := size < 600 || size%977 == 0 || size == n || size%tileWidth == 0
		if !check {
			continue
		}
		want, err := tlog.TreeHash(size, m)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.root(); got != want {
			t.Fatalf("size %d: root %v, want %v", size, got, want)
		}
		got := map[tlog.Tile]bool{}
		for _, td := range e.take() {
			wantData, err := tlog.ReadTileData(td.tile, m)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(td.data, wantData) {
				t.Fatalf("size %d: tile %v differs", size, td.tile.Path())
			}
			got[td.tile] = true
			full := td.tile
			full.W = tileWidth
			stored[full] = td.data
		}
		for _, w := range tlog.NewTiles(TileHeight, last, size) {
			if !got[w] {
				t.Fatalf("size %d: tile %v not handed out", size, w.Path())
			}
		}
		last = size
		if size%977 == 0 || size == n || size < 300 {
			r := tlog.TileHashReader(tlog.Tree{N: size, Hash: want}, memTiles{m})
			re, err := edgeAt(size, r)
			if err != nil {
				t.Fatalf("size %d: %v", size, err)
			}
			if re.root() != want {
				t.Fatalf("size %d: rebuilt edge's root differs", size)
			}
			// Both grow alike from here.
			probe := tlog.RecordHash([]byte("probe"))
			a, b := *e, *re
			a.roots, a.rows = append([]tlog.Hash(nil), e.roots...), cloneRows(e.rows)
			a.append(probe)
			b.append(probe)
			if a.root() != b.root() {
				t.Fatalf("size %d: rebuilt edge grows differently", size)
			}
		}
	}
}
