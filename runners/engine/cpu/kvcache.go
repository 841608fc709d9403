package cpu

import (
	"fmt"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// kvStep is the growth step of the cache, in tokens.
const kvStep = 256

// kvCache stores per layer K and V as [Hkv, cap, Dh] in F32 or 16-bit words.
type kvCache struct {
	b      *Backend // whose step arena holds the views Append returns
	g      engine.CacheGeometry
	dt     engine.DType
	n      int // committed length
	cap    int // allocated tokens per head
	layers []kvLayer
}

type kvLayer struct {
	kvWords
	// extent is how far this layer holds valid data contiguously from 0:
	// n after Append/Commit/Truncate, further after Import.
	extent int
	// pending is the number of tokens appended in the current step.
	pending int
}

// NewKVCache makes an empty cache; dt is F32, F16 or BF16.
func (b *Backend) NewKVCache(g engine.CacheGeometry, dt engine.DType) engine.KVCache {
	switch dt {
	case engine.F32, engine.F16, engine.BF16:
	default:
		panic(fmt.Sprintf("cpu: KV cache dtype %v (want float32, float16 or bfloat16)", dt))
	}
	if g.Layers <= 0 || g.KVHeads <= 0 || g.HeadDim <= 0 {
		panic(fmt.Sprintf("cpu: KV cache geometry %+v", g))
	}
	if g.Sliding() {
		return newRingCache(b, g, dt)
	}
	return &kvCache{b: b, g: g, dt: dt, layers: make([]kvLayer, g.Layers)}
}

// CanTruncate: a cache without sliding layers can go back anywhere.
func (c *kvCache) CanTruncate(n int) bool { return n >= 0 && n <= c.n }

func (c *kvCache) Len() int                       { return c.n }
func (c *kvCache) DType() engine.DType            { return c.dt }
func (c *kvCache) Geometry() engine.CacheGeometry { return c.g }

// Free drops the storage; the cache is empty afterwards.
func (c *kvCache) Free() {
	c.n, c.cap = 0, 0
	c.layers = make([]kvLayer, c.g.Layers)
}

// reserve grows every layer to hold at least n tokens.
func (c *kvCache) reserve(n int) {
	if n <= c.cap {
		return
	}
	nc := (n + kvStep - 1) / kvStep * kvStep
	hd := c.g.KVHeads
	dh := c.g.HeadDim
	for li := range c.layers {
		l := &c.layers[li]
		keep := max(l.extent, c.n)
		if c.dt == engine.F32 {
			k, v := make([]float32, hd*nc*dh), make([]float32, hd*nc*dh)
			for h := 0; h < hd && keep > 0; h++ {
				copy(k[h*nc*dh:h*nc*dh+keep*dh], l.k32[h*c.cap*dh:])
				copy(v[h*nc*dh:h*nc*dh+keep*dh], l.v32[h*c.cap*dh:])
			}
			l.k32, l.v32 = k, v
		} else {
			k, v := make([]uint16, hd*nc*dh), make([]uint16, hd*nc*dh)
			for h := 0; h < hd && keep > 0; h++ {
				copy(k[h*nc*dh:h*nc*dh+keep*dh], l.k16[h*c.cap*dh:])
				copy(v[h*nc*dh:h*nc*dh+keep*dh], l.v16[h*c.cap*dh:])
			}
			l.k16, l.v16 = k, v
		}
	}
	c.cap = nc
}

// write stores src [Hkv, n, Dh] (float32) at token start of one layer.
func (c *kvCache) write(l *kvLayer, start, n int, k, v []float32) {
	dh := c.g.HeadDim
	for h := range c.g.KVHeads {
		dst := (h*c.cap + start) * dh
		src := h * n * dh
		if c.dt == engine.F32 {
			copy(l.k32[dst:dst+n*dh], k[src:src+n*dh])
			copy(l.v32[dst:dst+n*dh], v[src:src+n*dh])
		} else {
			toHalf(l.k16[dst:dst+n*dh], k[src:src+n*dh], c.dt)
			toHalf(l.v16[dst:dst+n*dh], v[src:src+n*dh], c.dt)
		}
	}
}

func (c *kvCache) view(l *kvLayer, n int) (engine.Array, engine.Array) {
	k, v := c.b.header3(c.g.KVHeads, n, c.g.HeadDim), c.b.header3(c.g.KVHeads, n, c.g.HeadDim)
	k.dt, v.dt = c.dt, c.dt
	k.kvv = kvView{dt: c.dt, heads: c.g.KVHeads, n: n, dh: c.g.HeadDim, cap: c.cap, f32: l.k32, u16: l.k16}
	v.kvv = kvView{dt: c.dt, heads: c.g.KVHeads, n: n, dh: c.g.HeadDim, cap: c.cap, f32: l.v32, u16: l.v16}
	k.kv, v.kv = &k.kvv, &v.kvv
	return k, v
}

// Append adds k, v [Hkv, L, Dh] to layer at Len() and returns views of the
// layer's whole K and V. Len() advances when the last layer is appended.
func (c *kvCache) Append(layer int, k, v engine.Array) (engine.Array, engine.Array) {
	ka, va := arr(k), arr(v)
	if layer < 0 || layer >= c.g.Layers {
		panic(fmt.Sprintf("cpu: KV Append: layer %d of %d", layer, c.g.Layers))
	}
	if len(ka.shape) != 3 || ka.shape[0] != c.g.KVHeads || ka.shape[2] != c.g.HeadDim || !slices.Equal(ka.shape, va.shape) {
		panic(fmt.Sprintf("cpu: KV Append: k %v v %v for geometry %+v", ka.shape, va.shape, c.g))
	}
	n := ka.shape[1]
	l := &c.layers[layer]
	if layer > 0 && c.layers[layer-1].pending != n || layer == 0 && l.pending != 0 {
		panic(fmt.Sprintf("cpu: KV Append: layer %d out of order", layer))
	}
	c.reserve(c.n + n)
	c.write(l, c.n, n, floats(ka), floats(va))
	l.pending = n
	kAll, vAll := c.view(l, c.n+n)
	if layer == c.g.Layers-1 {
		c.n += n
		for i := range c.layers {
			c.layers[i].pending = 0
			c.layers[i].extent = c.n
		}
	}
	return kAll, vAll
}

// Truncate drops positions ≥ n.
func (c *kvCache) Truncate(n int) {
	if n < 0 || n > c.n {
		panic(fmt.Sprintf("cpu: KV Truncate(%d) with %d cached", n, c.n))
	}
	c.n = n
	for i := range c.layers {
		c.layers[i].extent = n
		c.layers[i].pending = 0
	}
}

func (c *kvCache) checkRange(op string, layer, start, n int) error {
	if layer < 0 || layer >= c.g.Layers {
		return fmt.Errorf("cpu: KV %s: layer %d of %d", op, layer, c.g.Layers)
	}
	if start < 0 || n < 0 {
		return fmt.Errorf("cpu: KV %s: range [%d, %d+%d)", op, start, start, n)
	}
	return nil
}

// Export returns positions [start, start+n) of one layer as K then V bytes,
// each [Hkv, n, Dh] in the cache dtype.
func (c *kvCache) Export(layer, start, n int) ([]byte, []byte, error) {
	if err := c.checkRange("Export", layer, start, n); err != nil {
		return nil, nil, err
	}
	l := &c.layers[layer]
	if start+n > max(c.n, l.extent) {
		return nil, nil, fmt.Errorf("cpu: KV Export: range [%d, %d) past %d cached", start, start+n, max(c.n, l.extent))
	}
	kb, vb := l.export(c.dt, c.g.KVHeads, c.g.HeadDim, c.cap, start, n)
	return kb, vb, nil
}

// Import writes positions [start, start+n) of one layer from Export's
// layout. start may not leave a gap: it must be ≤ what the layer already
// holds (Len() or the end of earlier imports). Len() moves only on Commit.
func (c *kvCache) Import(layer, start, n int, k, v []byte) error {
	if err := c.checkRange("Import", layer, start, n); err != nil {
		return err
	}
	l := &c.layers[layer]
	have := max(c.n, l.extent)
	if start > have {
		return fmt.Errorf("cpu: KV Import: layer %d start %d leaves a gap after %d held", layer, start, have)
	}
	es := c.dt.Size()
	dh := c.g.HeadDim
	want := c.g.KVHeads * n * dh * es
	if len(k) != want || len(v) != want {
		return fmt.Errorf("cpu: KV Import: %d/%d bytes for %d tokens (want %d each)", len(k), len(v), n, want)
	}
	c.reserve(start + n)
	l = &c.layers[layer]
	l.load(c.dt, c.g.KVHeads, dh, c.cap, start, n, k, v)
	l.extent = max(have, start+n)
	return nil
}

// Commit makes positions [0, n) visible; every layer must hold them.
func (c *kvCache) Commit(n int) error {
	for i := range c.layers {
		if have := max(c.n, c.layers[i].extent); n > have {
			return fmt.Errorf("cpu: KV Commit(%d): layer %d holds only %d", n, i, have)
		}
	}
	if n < 0 {
		return fmt.Errorf("cpu: KV Commit(%d)", n)
	}
	c.n = n
	for i := range c.layers {
		c.layers[i].extent = n
	}
	return nil
}
