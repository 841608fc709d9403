package decode

import (
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
)

// TestKVPoolSlidingReuseRule: with a sliding layer of window 8, an entry
// serves a prompt diverging a few positions before its end (the layer
// still holds the window there), but not one diverging long before: the
// window has rotated past the divergence point, so the pool makes a
// fresh cache instead of truncating into a window it no longer has.
func TestKVPoolSlidingReuseRule(t *testing.T) {
	b := cpu.New(1)
	g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 4, Windows: []int{0, 8}}
	p := newKVPool(4, 10000, func() engine.KVCache { return b.NewKVCache(g, engine.F32) })
	long := make([]int32, 300)
	for i := range long {
		long[i] = int32(i)
	}
	e, _ := p.take(long)
	for range 300 {
		fill(b, e.cache, 1) // decode-like: one position per step
	}
	e.tokens = long
	p.put(e)

	near := append(append([]int32(nil), long[:295]...), 7, 7)
	e, n := p.take(near)
	if n != 295 || e.cache.Len() != 295 {
		t.Fatalf("divergence 5 positions before the end: hit %d, cache %d", n, e.cache.Len())
	}
	fill(b, e.cache, 2)
	e.tokens = near
	p.put(e)

	far := append(append([]int32(nil), near[:100]...), 7, 7)
	e, n = p.take(far)
	if n != 0 || e.cache.Len() != 0 {
		t.Fatalf("divergence at 100, window rotated past it: hit %d, cache %d", n, e.cache.Len())
	}
}
