package trail

import (
	"fmt"
	"math/bits"

	"golang.org/x/mod/sumdb/tlog"
)

// TileHeight is the height of the stored tiles: 256 hashes each, as the Go
// checksum database and C2SP tlog-tiles use.
const TileHeight = 8

const tileWidth = 1 << TileHeight

// edge is the right edge of an RFC 6962 tree grown one leaf at a time: the
// roots of its complete subtrees, largest first (one for each bit set in
// its size), and, for each tile level, the row of hashes of its rightmost
// tile that is not full. Appending a leaf costs one hash and, on average,
// one more: the tree's earlier hashes are never read again.
type edge struct {
	n     int64
	roots []tlog.Hash // len == bits.OnesCount64(n)
	// rows[L] holds the hashes at tree level 8L of tile-level L's last
	// tile, which is not full: (n >> 8L) mod 256 of them.
	rows [][]tlog.Hash
	// full collects the tiles that filled since the last take.
	full []tileData
}

// tileData is one tile's coordinates (with its width) and hashes.
type tileData struct {
	tile tlog.Tile
	data []byte
}

// append adds a leaf's hash.
func (e *edge) append(h tlog.Hash) {
	e.push(0, h)
	cur, level := h, 0
	for e.n&(1<<level) != 0 {
		left := e.roots[len(e.roots)-1]
		e.roots = e.roots[:len(e.roots)-1]
		cur = tlog.NodeHash(left, cur)
		level++
		if level%TileHeight == 0 {
			e.push(level/TileHeight, cur)
		}
	}
	e.roots = append(e.roots, cur)
	e.n++
}

// push adds a hash to tile-level L's row, moving the row to full when it
// has 256.
func (e *edge) push(L int, h tlog.Hash) {
	for len(e.rows) <= L {
		e.rows = append(e.rows, nil)
	}
	e.rows[L] = append(e.rows[L], h)
	if len(e.rows[L]) == tileWidth {
		// The hashes at level 8L before this row: n (before the append,
		// for L = 0 the leaf being added) shifted.
		count := (e.n + 1) >> (TileHeight * L)
		t := tlog.Tile{H: TileHeight, L: L, N: count/tileWidth - 1, W: tileWidth}
		e.full = append(e.full, tileData{tile: t, data: rowBytes(e.rows[L])})
		e.rows[L] = e.rows[L][:0]
	}
}

func rowBytes(row []tlog.Hash) []byte {
	b := make([]byte, 0, len(row)*tlog.HashSize)
	for _, h := range row {
		b = append(b, h[:]...)
	}
	return b
}

// root is the tree's hash (SHA-256 of nothing for an empty tree, as RFC
// 6962 says).
func (e *edge) root() tlog.Hash {
	if e.n == 0 {
		h, _ := tlog.TreeHash(0, nil)
		return h
	}
	r := e.roots[len(e.roots)-1]
	for i := len(e.roots) - 2; i >= 0; i-- {
		r = tlog.NodeHash(e.roots[i], r)
	}
	return r
}

// take returns the tiles to store for the tree as it is now: those that
// filled since the last take, then the partial last tile of each level.
func (e *edge) take() []tileData {
	out := e.full
	e.full = nil
	for L, row := range e.rows {
		if len(row) == 0 {
			continue
		}
		count := e.n >> (TileHeight * L)
		t := tlog.Tile{H: TileHeight, L: L, N: count / tileWidth, W: len(row)}
		out = append(out, tileData{tile: t, data: rowBytes(row)})
	}
	return out
}

// edgeAt rebuilds the right edge of the tree of size n from r, a reader of
// its stored hashes (tlog.TileHashReader authenticates them against a
// signed tree).
func edgeAt(n int64, r tlog.HashReader) (*edge, error) {
	e := &edge{n: n}
	if n == 0 {
		return e, nil
	}
	// The complete subtrees: one for each bit of n, largest first.
	var idx []int64
	start := int64(0)
	for level := 63 - bits.LeadingZeros64(uint64(n)); level >= 0; level-- {
		if n&(1<<level) == 0 {
			continue
		}
		idx = append(idx, tlog.StoredHashIndex(level, start>>level))
		start += 1 << level
	}
	// The rows of the partial tiles.
	type partial struct {
		L     int
		first int64 // index of the row's first hash at level 8L
		w     int
	}
	var parts []partial
	for L := 0; n>>(TileHeight*L) > 0; L++ {
		count := n >> (TileHeight * L)
		if w := int(count % tileWidth); w > 0 {
			parts = append(parts, partial{L: L, first: count - int64(w), w: w})
			for k := range int64(w) {
				idx = append(idx, tlog.StoredHashIndex(TileHeight*L, count-int64(w)+k))
			}
		}
	}
	hs, err := r.ReadHashes(idx)
	if err != nil {
		return nil, err
	}
	if len(hs) != len(idx) {
		return nil, fmt.Errorf("trail: read %d hashes, want %d", len(hs), len(idx))
	}
	k := bits.OnesCount64(uint64(n))
	e.roots = append([]tlog.Hash(nil), hs[:k]...)
	hs = hs[k:]
	for _, p := range parts {
		for len(e.rows) <= p.L {
			e.rows = append(e.rows, nil)
		}
		e.rows[p.L] = append([]tlog.Hash(nil), hs[:p.w]...)
		hs = hs[p.w:]
	}
	return e, nil
}
