package decode

import (
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
)

func fill(b engine.Backend, c engine.KVCache, n int) {
	g := c.Geometry()
	for l := range g.Layers {
		x := make([]float32, g.KVHeads*n*g.HeadDim)
		c.Append(l, b.FromFloat32(x, g.KVHeads, n, g.HeadDim), b.FromFloat32(x, g.KVHeads, n, g.HeadDim))
	}
}

func TestKVPoolLongestPrefixAndLRU(t *testing.T) {
	b := cpu.New(1)
	g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 4}
	made := 0
	p := newKVPool(2, 1000, func() engine.KVCache { made++; return b.NewKVCache(g, engine.F32) })

	put := func(tokens []int32) {
		e, n := p.take(tokens)
		if n != 0 {
			t.Fatalf("unexpected hit %d", n)
		}
		fill(b, e.cache, len(tokens))
		e.tokens = tokens
		p.put(e)
	}
	a := []int32{1, 2, 3, 4, 5, 6}
	c := []int32{9, 9, 9}
	put(a)
	put(c)
	// Second turn of a: shares 4 tokens → takes a's entry truncated to 4.
	e, n := p.take([]int32{1, 2, 3, 4, 7, 8})
	if n != 4 || e.cache.Len() != 4 || len(e.tokens) != 4 {
		t.Fatalf("hit %d, cache %d, tokens %d", n, e.cache.Len(), len(e.tokens))
	}
	p.put(e)
	// Pool full (2) and no match: recycles the LRU entry (c) instead of
	// allocating.
	before := made
	e, n = p.take([]int32{5, 5})
	if n != 0 || made != before || e.cache.Len() != 0 {
		t.Fatalf("no-match take: n=%d made %d→%d len %d", n, before, made, e.cache.Len())
	}
	// Token bound: an entry over maxTokens is freed, not kept.
	e.tokens = make([]int32, 1001)
	p.put(e)
	if len(p.entries) != 1 {
		t.Fatalf("%d entries", len(p.entries))
	}
}
