//go:build cgo && (linux || darwin)

package mlx

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// ringSlack is how many positions before a sliding layer's window are kept
// when old positions are dropped (as on the cpu backend).
const ringSlack = engine.RingSlack

// mslab holds positions [base, base+cap) of one layer as kept MLX arrays
// [Hkv, cap, Dh].
type mslab struct {
	base, cap int
	k, v      *array
}

type ringLayer struct {
	w                 int
	s                 mslab
	lo, extent        int
	stage             *mslab
	stageLo, stageEnd int
}

// ringCache is the MLX KV cache of a model with sliding-window layers, with
// the semantics of the cpu backend's ringCache: a sliding layer keeps a
// suffix of its positions in a slab about twice its window, and drops what
// no later position can see when a step would overflow it (a slice of the
// kept positions into a fresh slab: MLX arrays are values). Views are
// slices of the slab, so attention sees a contiguous [Hkv, T, Dh].
type ringCache struct {
	b      *backend
	g      engine.CacheGeometry
	dt     engine.DType
	n      int
	layers []ringLayer
}

func newRingCache(b *backend, g engine.CacheGeometry, dt engine.DType) *ringCache {
	if len(g.Windows) != g.Layers {
		panic(fmt.Sprintf("mlx: NewKVCache: %d windows for %d layers", len(g.Windows), g.Layers))
	}
	c := &ringCache{b: b, g: g, dt: dt, layers: make([]ringLayer, g.Layers)}
	for i := range c.layers {
		c.layers[i].w = g.Windows[i]
	}
	return c
}

func (c *ringCache) Len() int                       { return c.n }
func (c *ringCache) DType() engine.DType            { return c.dt }
func (c *ringCache) Geometry() engine.CacheGeometry { return c.g }

func (c *ringCache) freeSlab(s *mslab) {
	c.b.release(s.k)
	c.b.release(s.v)
	*s = mslab{}
}

// realloc makes a slab of cp positions from base holding s's positions
// [from, to) (on the MLX thread) and frees s.
func (c *ringCache) realloc(s *mslab, base, cp, from, to int) mslab {
	ns := mslab{base: base, cap: cp}
	for _, p := range []struct {
		old *array
		dst **array
	}{{s.k, &ns.k}, {s.v, &ns.v}} {
		var next *array
		if p.old != nil && to > from {
			part := c.b.slice(p.old, 1, from-s.base, to-s.base)
			if rest := cp - (to - from) - (from - base); rest > 0 || from > base {
				parts := []*array{}
				if from > base {
					parts = append(parts, c.b.zeros([]int{c.g.KVHeads, from - base, c.g.HeadDim}, c.dt))
				}
				parts = append(parts, part)
				if rest > 0 {
					parts = append(parts, c.b.zeros([]int{c.g.KVHeads, rest, c.g.HeadDim}, c.dt))
				}
				next = c.b.concat(1, parts...)
				for _, x := range parts {
					c.b.release(x)
				}
			} else {
				next = part
			}
		} else {
			next = c.b.zeros([]int{c.g.KVHeads, cp, c.g.HeadDim}, c.dt)
		}
		c.b.keep(next)
		*p.dst = next
	}
	c.freeSlab(s)
	return ns
}

func (c *ringCache) keepFrom(l *ringLayer, n int) int {
	if l.w == 0 {
		return 0
	}
	return max(l.lo, engine.WindowStart(l.w, n)-ringSlack)
}

// room makes l's slab hold [keep, end), keeping [keep, held).
func (c *ringCache) room(l *ringLayer, keep, end int) {
	if l.s.cap > 0 && keep >= l.s.base && end <= l.s.base+l.s.cap {
		return
	}
	held := max(c.n, l.extent)
	need := end - keep
	var cp int
	switch {
	case l.w == 0:
		cp = (need + kvStep - 1) / kvStep * kvStep
	case need <= l.s.cap:
		cp = l.s.cap
	default:
		cp = (max(need, 2*(l.w+ringSlack)) + 15) / 16 * 16
	}
	l.s = c.realloc(&l.s, keep, cp, max(keep, l.lo), held)
	l.lo = max(l.lo, keep)
}

// write stores k, v [Hkv, L, Dh] at position start of s.
func (c *ringCache) write(s *mslab, start int, k, v *array) {
	for _, p := range []struct {
		dst **array
		upd *array
	}{{&s.k, k}, {&s.v, v}} {
		old := *p.dst
		upd := c.b.astype(p.upd, toMLX(c.dt))
		next := c.b.sliceUpdate(old, upd, 1, start-s.base)
		c.b.keep(next)
		c.b.release(old)
		if upd != p.upd {
			c.b.release(upd)
		}
		*p.dst = next
	}
}

func (c *ringCache) checkStep(k, v *array) {
	if len(k.shape) != 3 || k.shape[0] != c.g.KVHeads || k.shape[2] != c.g.HeadDim ||
		len(v.shape) != 3 || v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2] {
		panic(fmt.Sprintf("mlx: KVCache.Append: k %v v %v, want [%d, L, %d]", k.shape, v.shape, c.g.KVHeads, c.g.HeadDim))
	}
}

func (c *ringCache) Append(layer int, k, v engine.Array) (kAll, vAll engine.Array) {
	if layer < 0 || layer >= c.g.Layers {
		panic(fmt.Sprintf("mlx: KVCache.Append: layer %d of %d", layer, c.g.Layers))
	}
	return c.b.queueAppend(c, layer, k, v)
}

func (c *ringCache) appendOn(o *appendOp) {
	kx, vx := c.b.arr(o.kIn), c.b.arr(o.vIn)
	c.checkStep(kx, vx)
	L := kx.shape[1]
	l := &c.layers[o.layer]
	if l.stage != nil {
		c.freeSlab(l.stage)
		l.stage = nil
	}
	c.room(l, c.keepFrom(l, c.n), c.n+L)
	c.write(&l.s, c.n, kx, vx)
	from := max(l.lo, engine.WindowStart(l.w, c.n)) - l.s.base
	since := len(c.b.temps)
	c.b.adoptSince(&o.k, c.b.slice(l.s.k, 1, from, c.n+L-l.s.base), since)
	c.b.adoptSince(&o.v, c.b.slice(l.s.v, 1, from, c.n+L-l.s.base), since)
	if o.layer == c.g.Layers-1 {
		c.n += L
		for i := range c.layers {
			c.layers[i].extent = c.n
		}
	}
}

func (c *ringCache) canTruncate(n int) bool {
	if n < 0 || n > c.n {
		return false
	}
	if n == 0 {
		return true
	}
	for i := range c.layers {
		if c.layers[i].lo > engine.WindowStart(c.layers[i].w, n) {
			return false
		}
	}
	return true
}

func (c *ringCache) CanTruncate(n int) (ok bool) {
	c.b.do(func() { ok = c.canTruncate(n) })
	return ok
}

func (c *ringCache) Truncate(n int) {
	c.b.do(func() {
		if !c.canTruncate(n) {
			panic(fmt.Sprintf("mlx: KVCache.Truncate(%d) with %d cached: a sliding layer no longer holds its window", n, c.n))
		}
		c.n = n
		for i := range c.layers {
			l := &c.layers[i]
			l.extent = n
			if l.stage != nil {
				c.freeSlab(l.stage)
				l.stage = nil
			}
			if n == 0 {
				c.freeSlab(&l.s)
				l.lo = 0
			}
		}
	})
}

func (c *ringCache) Export(layer, start, n int) (kb, vb []byte, err error) {
	err = c.b.doErr(func() error {
		if layer < 0 || layer >= c.g.Layers {
			return fmt.Errorf("mlx: KVCache.Export: layer %d of %d", layer, c.g.Layers)
		}
		l := &c.layers[layer]
		held := max(c.n, l.extent)
		if start < 0 || n < 0 || start+n > held {
			return fmt.Errorf("mlx: KVCache.Export: positions [%d, %d) of %d cached", start, start+n, held)
		}
		if n == 0 {
			kb, vb = []byte{}, []byte{}
			return nil
		}
		if start < l.lo {
			return fmt.Errorf("mlx: KVCache.Export: layer %d (window %d) no longer holds position %d (holds from %d)", layer, l.w, start, l.lo)
		}
		ks := c.b.slice(l.s.k, 1, start-l.s.base, start+n-l.s.base)
		vs := c.b.slice(l.s.v, 1, start-l.s.base, start+n-l.s.base)
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

func (c *ringCache) Import(layer, start, n int, kb, vb []byte) error {
	return c.b.doErr(func() error {
		if layer < 0 || layer >= c.g.Layers || start < 0 || n < 0 {
			return fmt.Errorf("mlx: KVCache.Import: layer %d [%d, +%d)", layer, start, n)
		}
		want := c.g.KVHeads * n * c.g.HeadDim * c.dt.Size()
		if len(kb) != want || len(vb) != want {
			return fmt.Errorf("mlx: KVCache.Import: %d and %d bytes for %d positions, want %d each", len(kb), len(vb), n, want)
		}
		if n == 0 {
			return nil
		}
		l := &c.layers[layer]
		have := max(c.n, l.extent)
		shape := []int{c.g.KVHeads, n, c.g.HeadDim}
		ka := c.b.fromBytes(kb, shape, c.dt)
		va := c.b.fromBytes(vb, shape, c.dt)
		defer c.b.release(ka)
		defer c.b.release(va)
		var dst *mslab
		switch {
		case l.stage != nil:
			if start != l.stageEnd {
				return fmt.Errorf("mlx: KVCache.Import: layer %d start %d, staged import ends at %d", layer, start, l.stageEnd)
			}
			if start+n > l.stage.base+l.stage.cap {
				ns := c.realloc(l.stage, l.stage.base, max(2*l.stage.cap, start+n-l.stage.base), l.stageLo, l.stageEnd)
				l.stage = &ns
			}
			dst = l.stage
			l.stageEnd += n
		case start > have:
			if l.w == 0 {
				return fmt.Errorf("mlx: KVCache.Import at %d with %d cached in layer %d", start, have, layer)
			}
			ns := c.realloc(&mslab{}, start, max(n, 2*(l.w+ringSlack)), start, start)
			l.stage, l.stageLo, l.stageEnd = &ns, start, start+n
			dst = l.stage
		default:
			if start < l.lo {
				return fmt.Errorf("mlx: KVCache.Import: layer %d start %d before the held window from %d", layer, start, l.lo)
			}
			c.room(l, min(c.keepFrom(l, c.n), start), start+n)
			dst = &l.s
			l.extent = max(have, start+n)
		}
		c.write(dst, start, ka, va)
		if err := c.b.eval(dst.k, dst.v); err != nil {
			return fmt.Errorf("import layer %d: %w", layer, err)
		}
		return nil
	})
}

func (c *ringCache) Commit(n int) error {
	return c.b.doErr(func() error {
		if n < 0 {
			return fmt.Errorf("mlx: KVCache.Commit(%d)", n)
		}
		for i := range c.layers {
			l := &c.layers[i]
			ws := engine.WindowStart(l.w, n)
			if l.stage != nil {
				if l.stageEnd < n || l.stageLo > ws {
					return fmt.Errorf("mlx: KVCache.Commit(%d): layer %d imported [%d, %d), needs [%d, %d)", n, i, l.stageLo, l.stageEnd, ws, n)
				}
				continue
			}
			if have := max(c.n, l.extent); n > have || (n > 0 && l.lo > ws) {
				return fmt.Errorf("mlx: KVCache.Commit(%d): layer %d holds [%d, %d), needs [%d, %d)", n, i, l.lo, have, ws, n)
			}
		}
		c.n = n
		for i := range c.layers {
			l := &c.layers[i]
			if l.stage != nil {
				c.freeSlab(&l.s)
				l.s, l.lo = *l.stage, l.stageLo
				l.stage = nil
			}
			l.extent = n
		}
		return nil
	})
}

func (c *ringCache) Free() {
	c.b.do(func() {
		for i := range c.layers {
			l := &c.layers[i]
			c.freeSlab(&l.s)
			if l.stage != nil {
				c.freeSlab(l.stage)
			}
			*l = ringLayer{w: l.w}
		}
		c.n = 0
	})
}
