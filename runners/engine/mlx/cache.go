//go:build cgo && (linux || darwin)

package mlx

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// kvStep is how many positions a layer's storage grows by at a time.
const kvStep = 256

// kvCache keeps each layer's K and V as one kept MLX array [Hkv, cap, Dh]
// in the cache dtype. New positions are written with slice_update; the old
// handle is released at once so that MLX can update the buffer in place
// once the step's temporaries are freed.
type kvCache struct {
	b      *backend
	g      engine.CacheGeometry
	dt     engine.DType
	k, v   []*array // per layer; nil until first written
	n      int      // Len()
	extent []int    // per layer: positions written by Import beyond n
	// slab: the batched decode's slab that holds this cache's K/V as its
	// row row (k and v are nil meanwhile; batch.go), or nil.
	slab *kvSlab
	row  int
}

func (b *backend) NewKVCache(g engine.CacheGeometry, dt engine.DType) engine.KVCache {
	if g.Layers <= 0 || g.KVHeads <= 0 || g.HeadDim <= 0 {
		panic(fmt.Sprintf("mlx: NewKVCache: bad geometry %+v", g))
	}
	switch dt {
	case engine.F32, engine.F16, engine.BF16:
	default:
		panic(fmt.Sprintf("mlx: NewKVCache: dtype %v (want float32, float16 or bfloat16)", dt))
	}
	if g.Sliding() {
		return newRingCache(b, g, dt)
	}
	return &kvCache{
		b: b, g: g, dt: dt,
		k: make([]*array, g.Layers), v: make([]*array, g.Layers),
		extent: make([]int, g.Layers),
	}
}

func (c *kvCache) Len() int                       { return c.n }
func (c *kvCache) DType() engine.DType            { return c.dt }
func (c *kvCache) Geometry() engine.CacheGeometry { return c.g }

func (c *kvCache) checkLayer(op string, layer int) {
	if layer < 0 || layer >= c.g.Layers {
		panic(fmt.Sprintf("mlx: KVCache.%s: layer %d of %d", op, layer, c.g.Layers))
	}
}

// capacity is the number of positions layer's storage holds.
func (c *kvCache) capacity(layer int) int {
	if c.k[layer] == nil {
		return 0
	}
	return c.k[layer].shape[1]
}

// ensure grows layer's storage to hold at least need positions (on the MLX
// thread).
func (c *kvCache) ensure(layer, need int) {
	have := c.capacity(layer)
	if need <= have {
		return
	}
	grow := (need+kvStep-1)/kvStep*kvStep - have
	for _, s := range []*[]*array{&c.k, &c.v} {
		old := (*s)[layer]
		z := c.b.zeros([]int{c.g.KVHeads, grow, c.g.HeadDim}, c.dt)
		next := z
		if old != nil {
			next = c.b.concat(1, old, z)
			c.b.release(old)
			c.b.release(z)
		}
		c.b.keep(next)
		(*s)[layer] = next
	}
}

// write stores k, v [Hkv, L, Dh] at position start of layer (on the MLX
// thread) and returns the new storage arrays.
func (c *kvCache) write(layer, start int, k, v *array) {
	c.ensure(layer, start+k.shape[1])
	for _, p := range []struct {
		s   []*array
		upd *array
	}{{c.k, k}, {c.v, v}} {
		old := p.s[layer]
		upd := c.b.astype(p.upd, toMLX(c.dt))
		next := c.b.sliceUpdate(old, upd, 1, start)
		c.b.keep(next)
		c.b.release(old)
		if upd != p.upd {
			c.b.release(upd)
		}
		p.s[layer] = next
	}
}

func (c *kvCache) checkStep(op string, k, v *array) {
	want := []int{c.g.KVHeads, k.shape[min(1, len(k.shape)-1)], c.g.HeadDim}
	if len(k.shape) != 3 || k.shape[0] != want[0] || k.shape[2] != want[2] ||
		len(v.shape) != 3 || v.shape[0] != want[0] || v.shape[1] != k.shape[1] || v.shape[2] != want[2] {
		panic(fmt.Sprintf("mlx: KVCache.%s: k %v v %v, want [%d, L, %d]", op, k.shape, v.shape, c.g.KVHeads, c.g.HeadDim))
	}
}

// Append is queued like an op; the views it returns are made in order.
func (c *kvCache) Append(layer int, k, v engine.Array) (kAll, vAll engine.Array) {
	c.checkLayer("Append", layer)
	return c.b.queueAppend(c, layer, k, v)
}

func (c *kvCache) appendOn(o *appendOp) {
	kx, vx := c.b.arr(o.kIn), c.b.arr(o.vIn)
	c.checkStep("Append", kx, vx)
	c.detach()
	end := c.n + kx.shape[1]
	c.write(o.layer, c.n, kx, vx)
	since := len(c.b.temps)
	c.b.adoptSince(&o.k, c.b.slice(c.k[o.layer], 1, 0, end), since)
	c.b.adoptSince(&o.v, c.b.slice(c.v[o.layer], 1, 0, end), since)
	if o.layer == c.g.Layers-1 {
		c.n = end
	}
}

// CanTruncate: a cache without sliding layers can go back anywhere.
func (c *kvCache) CanTruncate(n int) (ok bool) {
	c.b.do(func() { ok = n >= 0 && n <= c.n })
	return ok
}

func (c *kvCache) Truncate(n int) {
	c.b.do(func() {
		if n < 0 || n > c.n {
			panic(fmt.Sprintf("mlx: KVCache.Truncate(%d) with %d cached", n, c.n))
		}
		c.n = n
		for i := range c.extent {
			c.extent[i] = min(c.extent[i], n)
		}
	})
}

func (c *kvCache) Export(layer, start, n int) (kb, vb []byte, err error) {
	err = c.b.doErr(func() error {
		c.checkLayer("Export", layer)
		c.detach()
		if start < 0 || n < 0 || start+n > max(c.n, c.extent[layer]) {
			return fmt.Errorf("mlx: KVCache.Export: positions [%d, %d) of %d cached", start, start+n, c.n)
		}
		if n == 0 {
			kb, vb = []byte{}, []byte{}
			return nil
		}
		ks := c.b.slice(c.k[layer], 1, start, start+n)
		vs := c.b.slice(c.v[layer], 1, start, start+n)
		defer c.b.release(ks)
		defer c.b.release(vs)
		var err error
		if kb, err = c.b.hostBytes(ks); err != nil {
			return fmt.Errorf("export layer %d K: %w", layer, err)
		}
		if vb, err = c.b.hostBytes(vs); err != nil {
			return fmt.Errorf("export layer %d V: %w", layer, err)
		}
		return nil
	})
	return kb, vb, err
}

func (c *kvCache) Import(layer, start, n int, kb, vb []byte) error {
	return c.b.doErr(func() error {
		c.checkLayer("Import", layer)
		c.detach()
		if start < 0 || n < 0 || start > max(c.n, c.extent[layer]) {
			return fmt.Errorf("mlx: KVCache.Import at %d with %d cached in layer %d", start, max(c.n, c.extent[layer]), layer)
		}
		want := c.g.KVHeads * n * c.g.HeadDim * c.dt.Size()
		if len(kb) != want || len(vb) != want {
			return fmt.Errorf("mlx: KVCache.Import: %d and %d bytes for %d positions, want %d each", len(kb), len(vb), n, want)
		}
		if n == 0 {
			return nil
		}
		shape := []int{c.g.KVHeads, n, c.g.HeadDim}
		ka := c.b.fromBytes(kb, shape, c.dt)
		va := c.b.fromBytes(vb, shape, c.dt)
		c.write(layer, start, ka, va)
		c.b.release(ka)
		c.b.release(va)
		if err := c.b.eval(c.k[layer], c.v[layer]); err != nil {
			return fmt.Errorf("import layer %d: %w", layer, err)
		}
		c.extent[layer] = max(c.extent[layer], start+n)
		return nil
	})
}

func (c *kvCache) Commit(n int) error {
	return c.b.doErr(func() error {
		if n < 0 {
			return fmt.Errorf("mlx: KVCache.Commit(%d)", n)
		}
		for l := range c.g.Layers {
			if have := max(c.n, c.extent[l]); n > have {
				return fmt.Errorf("mlx: KVCache.Commit(%d): layer %d holds only %d positions", n, l, have)
			}
		}
		c.n = n
		return nil
	})
}

func (c *kvCache) Free() {
	c.b.do(func() {
		if c.slab != nil {
			c.slab.leave(c.b, c)
		}
		for l := range c.k {
			c.b.release(c.k[l])
			c.b.release(c.v[l])
			c.k[l], c.v[l] = nil, nil
		}
		c.n = 0
		clear(c.extent)
	})
}
