//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestBatchAttentionSlabMLX: batched decode steps with the slab (one
// attention over the padded K/V of every sequence, batch.go) give what the
// row loop gives on the same batch (cosine ≥ 0.99999, same greedy token,
// the same K/V bit for bit) and what each sequence's own steps give it
// (cosine ≥ 0.9999, same token), for B = 1…5 of different lengths, through
// batch changes (a member leaves, one steps alone, the order changes). The
// models whose caches are ring caches (gemma3, gptoss: sliding windows) or
// hybrid caches (qwen3_next) take the row loop for every layer, which the
// test checks too (no slab is made).
func TestBatchAttentionSlabMLX(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	gen := func(spec testmodel.Spec) string { return testmodel.Dir(t, spec) }
	for _, mc := range []struct {
		name string
		dir  string
		slab bool
	}{
		{"llama", gen(testmodel.Spec{Arch: "llama", Seed: 4}), true},
		{"qwen3-bf16", gen(testmodel.Spec{Arch: "qwen3", DType: engine.BF16, Seed: 4}), true},
		{"qwen3moe", gen(testmodel.Spec{Arch: "qwen3moe", Seed: 4, Layers: 3}), true},
		{"gemma3", gen(testmodel.Spec{Arch: "gemma3", Seed: 4, Layers: 3}), false},
		{"gptoss", gen(testmodel.Spec{Arch: "gptoss", Seed: 4}), false},
		{"qwen3_next", filepath.Join("..", "testdata", "reference", "qwen3_next"), false},
	} {
		t.Run(mc.name, func(t *testing.T) {
			m := load(t, mc.dir, b)
			vocab := min(m.Info().Vocab, 500)
			for B := 1; B <= 5; B++ {
				t.Run(fmt.Sprintf("B=%d", B), func(t *testing.T) {
					// alone: each sequence's own steps; slab and rows: the
					// same batches with the slab and with the row loop.
					alone, slab, rows := make([]engine.KVCache, B), make([]engine.KVCache, B), make([]engine.KVCache, B)
					next := make([]int32, B)
					for i := range B {
						p := make([]int32, 5+4*i)
						for j := range p {
							p[j] = int32(10 + (7*j+13*i+3)%(vocab-10))
						}
						for _, set := range [][]engine.KVCache{alone, slab, rows} {
							set[i] = m.NewCache()
							defer set[i].Free()
						}
						next[i] = argmax(forward(t, m, alone[i], p...))
						forward(t, m, slab[i], p...)
						forward(t, m, rows[i], p...)
					}
					step := func(members []int) {
						t.Helper()
						pick := func(set []engine.KVCache) []engine.KVCache {
							var cs []engine.KVCache
							for _, i := range members {
								cs = append(cs, set[i])
							}
							return cs
						}
						toks := make([]int32, len(members))
						for j, i := range members {
							toks[j] = next[i]
						}
						got, err := m.ForwardBatch(ctx, pick(slab), toks)
						if err != nil {
							t.Fatal(err)
						}
						b.slabErr = errors.New("test: the row loop")
						ref, err := m.ForwardBatch(ctx, pick(rows), toks)
						b.slabErr = nil
						if err != nil {
							t.Fatal(err)
						}
						inSlab := len(members) > 1 && mc.slab
						for j, i := range members {
							kc, ok := slab[i].(*kvCache)
							if has := ok && kc.slab != nil; has != inSlab {
								t.Fatalf("members %v: sequence %d in a slab %v, want %v", members, i, has, inSlab)
							}
							if c, ok := rows[i].(*kvCache); ok && c.slab != nil {
								t.Fatalf("the row loop put sequence %d in a slab", i)
							}
							want := forward(t, m, alone[i], next[i])
							if cs := fixture.Cosine(got[j], ref[j]); cs < 0.99999 || argmax(got[j]) != argmax(ref[j]) {
								t.Fatalf("members %v sequence %d: slab vs row loop cosine %.7f, argmax %d vs %d", members, i, cs, argmax(got[j]), argmax(ref[j]))
							}
							if cs := fixture.Cosine(got[j], want); cs < 0.9999 || argmax(got[j]) != argmax(want) {
								t.Fatalf("members %v sequence %d: batched vs alone cosine %.7f, argmax %d vs %d", members, i, cs, argmax(got[j]), argmax(want))
							}
							next[i] = argmax(want)
						}
					}
					all := make([]int, B)
					for i := range all {
						all[i] = i
					}
					for range 3 {
						step(all)
					}
					if B > 1 {
						step(all[1:]) // the first leaves
						// One member steps alone (its row leaves the slab).
						toks := []int32{next[B-1]}
						want := forward(t, m, alone[B-1], toks...)
						got := forward(t, m, slab[B-1], toks...)
						forward(t, m, rows[B-1], toks...)
						if cs := fixture.Cosine(got, want); cs < 0.9999 {
							t.Fatalf("after leaving the slab: cosine %.7f", cs)
						}
						next[B-1] = argmax(want)
						rev := make([]int, B)
						for i := range rev {
							rev[i] = B - 1 - i
						}
						for range 2 {
							step(rev) // all again, in another order
						}
					}
					for i := range B {
						if slab[i].Len() != alone[i].Len() || rows[i].Len() != alone[i].Len() {
							t.Fatalf("sequence %d: %d/%d positions, alone %d", i, slab[i].Len(), rows[i].Len(), alone[i].Len())
						}
						for l := range m.Info().Layers {
							n := slab[i].Len()
							start := engine.WindowStart(slab[i].Geometry().Window(l), n)
							k1, v1, err1 := slab[i].Export(l, start, n-start)
							k2, v2, err2 := rows[i].Export(l, start, n-start)
							if (err1 == nil) != (err2 == nil) {
								t.Fatalf("sequence %d layer %d: export %v vs %v", i, l, err1, err2)
							}
							if string(k1) != string(k2) || string(v1) != string(v2) {
								t.Fatalf("sequence %d layer %d: the slab's K/V differ from the row loop's", i, l)
							}
						}
					}
				})
			}
		})
	}
}

// TestBatchDecodeArraysMLX: the MLX arrays a batched decode step makes
// grow with B by a few a sequence (its position's rotation table), not by
// a dozen a layer as the row loop's did.
func TestBatchDecodeArraysMLX(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	const layers = 12
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 4, Layers: layers}); err != nil {
		t.Fatal(err)
	}
	m := load(t, dir, b)
	made := map[int]int64{}
	for _, B := range []int{2, 4} {
		cs := make([]engine.KVCache, B)
		toks := make([]int32, B)
		for i := range cs {
			cs[i] = m.NewCache()
			defer cs[i].Free()
			forward(t, m, cs[i], []int32{5, 6, 7, 8, 9, 10}[:2+i]...)
			toks[i] = int32(20 + i)
		}
		if _, err := m.ForwardBatch(ctx, cs, toks); err != nil { // builds the slab
			t.Fatal(err)
		}
		n0 := b.made.Load()
		const steps = 4
		for range steps {
			if _, err := m.ForwardBatch(ctx, cs, toks); err != nil {
				t.Fatal(err)
			}
		}
		made[B] = (b.made.Load() - n0) / steps
	}
	t.Logf("arrays a step: B=2 %d, B=4 %d (%d layers)", made[2], made[4], layers)
	if d := made[4] - made[2]; d > layers {
		t.Errorf("two more sequences add %d arrays a step over %d layers; want at most %d (the graph of a layer must not grow with B)", d, layers, layers)
	}
}

// TestRoPERowsMatchesRoPEMLX: RoPERows rotates row n of [N, H, Dh] exactly
// as RoPE rotates that row alone at its position, bit for bit, compiled
// (the CPU device's stacked tables) and through MLX's rope with one offset
// per row (the path of devices with rope kernels, forced here), for plain
// and scaled schemes, partial rotation, float32 and bfloat16, and more
// rows than the table cache holds.
func TestRoPERowsMatchesRoPEMLX(t *testing.T) {
	b := newTestBackend(t)
	compiled := b.fallbackErr
	t.Cleanup(func() { b.fallbackErr = compiled })
	ropes := []engine.RoPE{
		{Dims: 16, Base: 10000},
		{Dims: 8, Base: 500000, Scale: engine.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}},
		{Dims: 16, Base: 150000, Scale: engine.RoPEScaling{Type: "yarn", Factor: 32, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1}},
	}
	for _, mode := range []string{"compiled", "rope_dynamic"} {
		if mode == "compiled" && compiled != nil {
			continue
		}
		b.fallbackErr = compiled
		if mode == "rope_dynamic" {
			b.fallbackErr = errors.New("test: MLX's rope")
		}
		for _, dt := range []engine.DType{engine.F32, engine.BF16} {
			for ri := range ropes {
				r := &ropes[ri]
				for _, pos := range [][]int{{7}, {3, 40, 3, 0, 129}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}} {
					N, H, Dh := len(pos), 3, 16
					vals := make([]float32, N*H*Dh)
					for i := range vals {
						vals[i] = float32(i%23)/7 - 1.5
					}
					x := b.AsType(b.FromFloat32(vals, N, H, Dh), dt)
					got, err := b.Bytes(b.RoPERows(x, pos, r))
					if err != nil {
						t.Fatal(err)
					}
					row := len(got) / N
					for n, p := range pos {
						one := b.Transpose(b.Slice(x, 0, n, n+1), 1, 0, 2) // [H, 1, Dh]
						want, err := b.Bytes(b.Transpose(b.RoPE(one, p, r), 1, 0, 2))
						if err != nil {
							t.Fatal(err)
						}
						if string(got[n*row:(n+1)*row]) != string(want) {
							t.Fatalf("%s %v %+v positions %v: row %d differs from RoPE at %d", mode, dt, *r, pos, n, p)
						}
					}
					b.Free()
				}
			}
		}
	}
}

// TestBatchAttentionUnevenMLX: a batch of one long sequence and short ones
// keeps the row loop (a slab padded to the long one would hold about B
// times its KV), and still gives each sequence its own step's logits; once
// the lengths are close enough the slab takes over.
func TestBatchAttentionUnevenMLX(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 4, MaxPositions: 2048}); err != nil {
		t.Fatal(err)
	}
	m := load(t, dir, b)
	lens := []int{900, 5, 7, 9}
	alone, batch := make([]engine.KVCache, len(lens)), make([]engine.KVCache, len(lens))
	next := make([]int32, len(lens))
	for i, n := range lens {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32(10 + (7*j+13*i)%400)
		}
		alone[i], batch[i] = m.NewCache(), m.NewCache()
		defer alone[i].Free()
		defer batch[i].Free()
		next[i] = argmax(forward(t, m, alone[i], p...))
		forward(t, m, batch[i], p...)
	}
	check := func(cs []int, wantSlab bool) {
		t.Helper()
		var caches []engine.KVCache
		var toks []int32
		for _, i := range cs {
			caches, toks = append(caches, batch[i]), append(toks, next[i])
		}
		got, err := m.ForwardBatch(ctx, caches, toks)
		if err != nil {
			t.Fatal(err)
		}
		for j, i := range cs {
			if has := batch[i].(*kvCache).slab != nil; has != wantSlab {
				t.Fatalf("sequences %v: %d in a slab %v, want %v", cs, i, has, wantSlab)
			}
			want := forward(t, m, alone[i], next[i])
			if c := fixture.Cosine(got[j], want); c < 0.9999 || argmax(got[j]) != argmax(want) {
				t.Fatalf("sequences %v: sequence %d cosine %.7f, argmax %d vs %d", cs, i, c, argmax(got[j]), argmax(want))
			}
			next[i] = argmax(want)
		}
	}
	check([]int{0, 1, 2, 3}, false)
	check([]int{1, 2, 3}, true)
	check([]int{0, 1, 2, 3}, false) // the long one joins: the rows copy out
}
