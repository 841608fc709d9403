package prefill

import (
	"bytes"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
)

var geom = engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 4}

// filled returns a cache holding "KV" for tokens: K of position p is
// (token, p, layer, 1), V its negation, so copies can be checked.
func filled(t *testing.T, b engine.Backend, tokens []int32) engine.KVCache {
	t.Helper()
	c := b.NewKVCache(geom, engine.F32)
	n := len(tokens)
	for l := range geom.Layers {
		k := make([]float32, n*4)
		v := make([]float32, n*4)
		for p, tok := range tokens {
			copy(k[4*p:], []float32{float32(tok), float32(p), float32(l), 1})
			copy(v[4*p:], []float32{-float32(tok), -float32(p), -float32(l), -1})
		}
		c.Append(l, b.FromFloat32(k, 1, n, 4), b.FromFloat32(v, 1, n, 4))
	}
	return c
}

func seq(n int, base int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = base + int32(i%97)
	}
	return s
}

func TestPrefixCacheHitsAndCopies(t *testing.T) {
	b := cpu.New(1)
	newCache := func() engine.KVCache { return b.NewKVCache(geom, engine.F32) }
	bpt := int64(2 * geom.Layers * geom.KVHeads * geom.HeadDim * 4)
	p := newPrefixCache(64, 1<<20, bpt)

	a := seq(200, 1)
	c, n, err := p.acquire(a, len(a), newCache, false)
	if err != nil || n != 0 || c.Len() != 0 {
		t.Fatalf("cold acquire: n=%d len=%d err=%v", n, c.Len(), err)
	}
	p.release(a, filled(t, b, a))

	// An extension of a takes the entry itself (no copy).
	ext := append(append([]int32(nil), a...), seq(50, 500)...)
	c, n, err = p.acquire(ext, len(ext)-1, newCache, false)
	if err != nil || n != 200 || c.Len() != 200 {
		t.Fatalf("extension: n=%d len=%d err=%v", n, c.Len(), err)
	}
	if e, _ := p.stats(); e != 0 {
		t.Fatalf("the taken entry is still listed (%d entries)", e)
	}
	p.release(a, c)

	// A prompt sharing 130 tokens (past two full blocks) gets a copy of
	// exactly those 130, and the entry stays.
	fork := append(append([]int32(nil), a[:130]...), seq(100, 900)...)
	c, n, err = p.acquire(fork, len(fork)-1, newCache, false)
	if err != nil || n != 130 || c.Len() != 130 {
		t.Fatalf("fork: n=%d len=%d err=%v", n, c.Len(), err)
	}
	if e, _ := p.stats(); e != 1 {
		t.Fatalf("entries %d after a copy, want 1", e)
	}
	want := filled(t, b, a)
	for l := range geom.Layers {
		gk, gv, err := c.Export(l, 0, 130)
		if err != nil {
			t.Fatal(err)
		}
		wk, wv, _ := want.Export(l, 0, 130)
		if !bytes.Equal(gk, wk) || !bytes.Equal(gv, wv) {
			t.Fatalf("layer %d: copied KV differs", l)
		}
	}

	// Less than one block in common: no hit.
	other := append(append([]int32(nil), a[:40]...), seq(100, 7000)...)
	if _, n, _ := p.acquire(other, len(other)-1, newCache, false); n != 0 {
		t.Fatalf("a prefix shorter than a block hit %d tokens", n)
	}
	// The limit caps a hit (the server never ships past N-1).
	if _, n, _ := p.acquire(a, 100, newCache, false); n != 100 {
		t.Fatalf("limited hit %d, want 100", n)
	}
}

func TestPrefixCacheEvictsLRU(t *testing.T) {
	b := cpu.New(1)
	bpt := int64(2 * geom.Layers * geom.KVHeads * geom.HeadDim * 4)
	p := newPrefixCache(64, 300*bpt, bpt) // room for 300 tokens
	x, y, z := seq(128, 1), seq(128, 1000), seq(128, 2000)
	p.release(x, filled(t, b, x))
	p.release(y, filled(t, b, y))
	if e, used := p.stats(); e != 2 || used != 256*bpt {
		t.Fatalf("entries %d used %d", e, used)
	}
	p.release(z, filled(t, b, z)) // evicts x, the least recently used
	newCache := func() engine.KVCache { return b.NewKVCache(geom, engine.F32) }
	if _, n, _ := p.acquire(x, 128, newCache, false); n != 0 {
		t.Fatalf("x still cached (%d)", n)
	}
	if _, n, _ := p.acquire(z, 128, newCache, false); n != 128 {
		t.Fatalf("z not cached (%d)", n)
	}
	// Too big for the bound: not kept.
	big := seq(400, 5)
	p.release(big, filled(t, b, big))
	if _, n, _ := p.acquire(big, 400, newCache, false); n != 0 {
		t.Fatalf("oversized entry kept")
	}
}
