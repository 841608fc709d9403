package prefill

import (
	"bytes"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
)

// TestPrefixCacheSlidingReuseRule: the block-hashed cache copies a shared
// prefix out of an entry only while the entry's sliding layer still holds
// that prefix's window; the copy then carries the window only, byte for
// byte, and a prefix whose window has rotated away is not served.
func TestPrefixCacheSlidingReuseRule(t *testing.T) {
	b := cpu.New(1)
	g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 4, Windows: []int{0, 16}}
	newCache := func() engine.KVCache { return b.NewKVCache(g, engine.F32) }
	p := newPrefixCache(32, 1<<20, 64)
	a := seq(256, 1)
	src := newCache()
	for i := 0; i < len(a); i += 8 { // chunked, so the sliding layer rotates
		for l := range g.Layers {
			k := make([]float32, 8*4)
			for j := range k {
				k[j] = float32(i*4 + j + 1000*l)
			}
			src.Append(l, b.FromFloat32(k, 1, 8, 4), b.FromFloat32(k, 1, 8, 4))
		}
	}
	p.release(a, src)

	// Shares all but the last 6 tokens: within the kept slack.
	near := append(append([]int32(nil), a[:250]...), seq(20, 900)...)
	c, n, err := p.acquire(near, len(near)-1, newCache, false)
	if err != nil || n != 250 || c.Len() != 250 {
		t.Fatalf("near divergence: n=%d err=%v", n, err)
	}
	k1, _, err1 := c.Export(1, 250-15, 15)
	k2, _, err2 := src.Export(1, 250-15, 15)
	if err1 != nil || err2 != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("copied window differs: %v %v", err1, err2)
	}
	if _, _, err := c.Export(1, 0, 1); err == nil {
		t.Fatal("the copy holds positions before the window")
	}
	p.release(near[:250], c)

	// Shares 100 tokens: the sliding layer has moved past position 100's
	// window in every entry, so nothing is served.
	far := append(append([]int32(nil), a[:100]...), seq(20, 900)...)
	if c, n, err := p.acquire(far, len(far)-1, newCache, false); err != nil || n != 0 || c.Len() != 0 {
		t.Fatalf("far divergence served %d tokens (err %v)", n, err)
	}
}
