package decode

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// BenchmarkAssemble: the decode side's own cost of a head-split fill,
// without the network: 16 MiB of f32 KV (8 layers × 4 KV heads × 64, 1024
// positions, 256-token chunks) injected into a cpu cache as one piece
// (imported as it comes, what a one-stream fill does) or as 2 and 4 head
// pieces assembled, the pieces' chunks interleaved as concurrent streams
// deliver them.
func BenchmarkAssemble(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 3, Layers: 8, Hidden: 512, Heads: 8, KVHeads: 4, HeadDim: 64, MaxPositions: 2048}); err != nil {
		b.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, cpu.New(2), engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	c := m.NewCache()
	defer c.Free()
	const tokens, chunk, layers, heads, row = 1024, 256, 8, 4, 64 * 4
	for _, n := range []int{1, 2, 4} {
		per := heads / n
		src := make([]byte, per*chunk*row)
		for i := range src {
			src[i] = byte(i)
		}
		pieces := make([][2]int, n)
		for i := range pieces {
			pieces[i] = [2]int{i * per, per}
		}
		b.Run(fmt.Sprintf("pieces-%d", n), func(b *testing.B) {
			b.SetBytes(2 * layers * heads * tokens * row)
			b.ReportAllocs()
			for b.Loop() {
				c.Truncate(0)
				a := newAssembler(c, 0, pieces)
				for s := 0; s < tokens; s += chunk {
					for l := range layers {
						for p := range n {
							if err := a.add(p, l, s, chunk, src, src); err != nil {
								b.Fatal(err)
							}
						}
					}
				}
				if err := a.complete(tokens); err != nil {
					b.Fatal(err)
				}
				if err := c.Commit(tokens); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestAssembleOwnsChunks: pieces whose chunks are cut differently and
// arrive interleaved are assembled into exactly the heads they carry,
// although the caller reuses (scribbles over) each chunk's buffer once add
// returns, as the KV-wire client may.
func TestAssembleOwnsChunks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 3, Layers: 2, Heads: 4, KVHeads: 4, HeadDim: 8, MaxPositions: 256}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	c := m.NewCache()
	defer c.Free()
	const tokens, row = 40, 8 * 4
	val := func(layer, head, pos int) byte { return byte(layer*97 + head*31 + pos) }
	// chunk makes piece p's (heads [h0, h0+n)) K rows of [s, s+cnt) into buf.
	chunk := func(buf []byte, layer, h0, n, s, cnt int) []byte {
		buf = buf[:0]
		for h := h0; h < h0+n; h++ {
			for pos := s; pos < s+cnt; pos++ {
				for range row {
					buf = append(buf, val(layer, h, pos))
				}
			}
		}
		return buf
	}
	pieces := [][2]int{{0, 1}, {1, 3}}
	cuts := [][]int{{0, 7, 20, 33, 40}, {0, 16, 32, 40}} // each piece's chunk bounds
	a := newAssembler(c, 0, pieces)
	buf := make([]byte, 0, 4*tokens*row)
	next := []int{0, 0}
	for next[0] < len(cuts[0])-1 || next[1] < len(cuts[1])-1 {
		for p := range 2 {
			if i := next[p]; i < len(cuts[p])-1 {
				s, e := cuts[p][i], cuts[p][i+1]
				for l := range 2 {
					k := chunk(buf, l, pieces[p][0], pieces[p][1], s, e-s)
					if err := a.add(p, l, s, e-s, k, k); err != nil {
						t.Fatal(err)
					}
					for j := range k {
						k[j] = 0xEE // the caller reuses its buffer
					}
				}
				next[p]++
			}
		}
	}
	if err := a.complete(tokens); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(tokens); err != nil {
		t.Fatal(err)
	}
	for l := range 2 {
		k, _, err := c.Export(l, 0, tokens)
		if err != nil {
			t.Fatal(err)
		}
		if want := chunk(nil, l, 0, 4, 0, tokens); string(k) != string(want) {
			t.Fatalf("layer %d: assembled K differs from the pieces' heads", l)
		}
	}
}
