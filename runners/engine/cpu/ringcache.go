package cpu

import (
	"fmt"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// ringSlack is how many positions before a sliding layer's window the
// cache keeps when it drops old positions, so that a conversation can be
// rolled back a little (a chat template that re-renders the end of the
// last turn) without losing the window.
const ringSlack = engine.RingSlack

// ringCache is the KV cache of a model with sliding-window layers. Each
// layer keeps its positions in its own slab; a full layer (window 0) grows
// like kvCache, a sliding layer of window W keeps a suffix: when a step
// would overflow its slab it first drops the positions no later token can
// see (all but the last W-1+ringSlack) by moving the rest to the front,
// so its slab stays about 2·(W+ringSlack) plus one step's tokens, and the
// cost of moving is amortized over W steps. Views handed to attention are
// contiguous, so the attention kernels are those of full layers.
type ringCache struct {
	g      engine.CacheGeometry
	dt     engine.DType
	n      int // committed length
	layers []ringLayer
	b      *Backend // whose step arena holds the views Append returns
}

// slab holds positions [base, base+cap) of one layer as [Hkv, cap, Dh].
type slab struct {
	base, cap int
	kvWords
}

type ringLayer struct {
	w int // window (0: full attention)
	s slab
	// lo is the first position held; the layer holds [lo, max(n, extent)).
	lo, extent int
	pending    int
	// stage holds an import that started past what the layer holds (a
	// sliding layer skipping positions it will never need); it replaces s
	// on Commit and is dropped by Truncate. stageLo/stageEnd bound it.
	stage             *slab
	stageLo, stageEnd int
}

func newRingCache(b *Backend, g engine.CacheGeometry, dt engine.DType) *ringCache {
	if len(g.Windows) != g.Layers {
		panic(fmt.Sprintf("cpu: KV cache with %d windows for %d layers", len(g.Windows), g.Layers))
	}
	c := &ringCache{b: b, g: g, dt: dt, layers: make([]ringLayer, g.Layers)}
	for i := range c.layers {
		if g.Windows[i] < 0 {
			panic(fmt.Sprintf("cpu: KV cache window %d for layer %d", g.Windows[i], i))
		}
		c.layers[i].w = g.Windows[i]
	}
	return c
}

func (c *ringCache) Len() int                       { return c.n }
func (c *ringCache) DType() engine.DType            { return c.dt }
func (c *ringCache) Geometry() engine.CacheGeometry { return c.g }

func (c *ringCache) Free() {
	c.n = 0
	for i := range c.layers {
		c.layers[i] = ringLayer{w: c.layers[i].w}
	}
}

func (c *ringCache) alloc(cp int) slab {
	sz := c.g.KVHeads * cp * c.g.HeadDim
	s := slab{cap: cp}
	if c.dt == engine.F32 {
		s.k32, s.v32 = make([]float32, sz), make([]float32, sz)
	} else {
		s.k16, s.v16 = make([]uint16, sz), make([]uint16, sz)
	}
	return s
}

// move copies positions [from, to) of src into dst (both slabs, same dtype;
// dst may be src: the copy is a memmove towards the front).
func (c *ringCache) move(dst, src *slab, from, to int) {
	n := to - from
	if n <= 0 {
		return
	}
	dh := c.g.HeadDim
	for h := range c.g.KVHeads {
		so := (h*src.cap + from - src.base) * dh
		do := (h*dst.cap + from - dst.base) * dh
		if c.dt == engine.F32 {
			copy(dst.k32[do:do+n*dh], src.k32[so:so+n*dh])
			copy(dst.v32[do:do+n*dh], src.v32[so:so+n*dh])
		} else {
			copy(dst.k16[do:do+n*dh], src.k16[so:so+n*dh])
			copy(dst.v16[do:do+n*dh], src.v16[so:so+n*dh])
		}
	}
}

// room makes layer l's slab hold [keep, end) with keep ≥ l.lo, keeping the
// positions [keep, held) it holds and dropping those before keep.
func (c *ringCache) room(l *ringLayer, keep, end int) {
	held := max(c.n, l.extent)
	if l.s.cap > 0 && keep >= l.s.base && end <= l.s.base+l.s.cap {
		return
	}
	need := end - keep
	if l.w > 0 && need <= l.s.cap {
		// Slide: move what stays to the front of the same slab.
		old := l.s
		l.s.base = keep
		c.move(&l.s, &old, keep, held)
		l.lo = keep
		return
	}
	var cp int
	if l.w == 0 {
		cp = (need + kvStep - 1) / kvStep * kvStep
	} else {
		cp = (max(need, 2*(l.w+ringSlack)) + 15) / 16 * 16
	}
	ns := c.alloc(cp)
	ns.base = keep
	if l.s.cap > 0 {
		c.move(&ns, &l.s, max(keep, l.lo), held)
	}
	l.s = ns
	l.lo = max(l.lo, keep)
}

// keepFrom is the first position layer l must keep while the committed
// length is n: a sliding layer may drop what is before its window (less
// the slack), a full layer nothing.
func (c *ringCache) keepFrom(l *ringLayer, n int) int {
	if l.w == 0 {
		return 0
	}
	return max(l.lo, engine.WindowStart(l.w, n)-ringSlack)
}

// write stores k, v [Hkv, n, Dh] (float32) at position start of s.
func (c *ringCache) write(s *slab, start, n int, k, v []float32) {
	dh := c.g.HeadDim
	for h := range c.g.KVHeads {
		dst := (h*s.cap + start - s.base) * dh
		src := h * n * dh
		if c.dt == engine.F32 {
			copy(s.k32[dst:dst+n*dh], k[src:src+n*dh])
			copy(s.v32[dst:dst+n*dh], v[src:src+n*dh])
		} else {
			toHalf(s.k16[dst:dst+n*dh], k[src:src+n*dh], c.dt)
			toHalf(s.v16[dst:dst+n*dh], v[src:src+n*dh], c.dt)
		}
	}
}

// view returns K and V views of positions [from, to) of s.
func (c *ringCache) view(s *slab, from, to int) (engine.Array, engine.Array) {
	n := to - from
	off := (from - s.base) * c.g.HeadDim
	k, v := c.b.header3(c.g.KVHeads, n, c.g.HeadDim), c.b.header3(c.g.KVHeads, n, c.g.HeadDim)
	k.dt, v.dt = c.dt, c.dt
	k.kvv = kvView{dt: c.dt, heads: c.g.KVHeads, n: n, dh: c.g.HeadDim, cap: s.cap}
	v.kvv = k.kvv
	if c.dt == engine.F32 {
		k.kvv.f32, v.kvv.f32 = s.k32[off:], s.v32[off:]
	} else {
		k.kvv.u16, v.kvv.u16 = s.k16[off:], s.v16[off:]
	}
	k.kv, v.kv = &k.kvv, &v.kvv
	return k, v
}

// Append adds k, v [Hkv, L, Dh] at Len() and returns views of what the new
// positions can see: from the layer's window start (0 for a full layer).
func (c *ringCache) Append(layer int, k, v engine.Array) (engine.Array, engine.Array) {
	ka, va := arr(k), arr(v)
	if layer < 0 || layer >= c.g.Layers {
		panic(fmt.Sprintf("cpu: KV Append: layer %d of %d", layer, c.g.Layers))
	}
	if len(ka.shape) != 3 || ka.shape[0] != c.g.KVHeads || ka.shape[2] != c.g.HeadDim || !slices.Equal(ka.shape, va.shape) {
		panic(fmt.Sprintf("cpu: KV Append: k %v v %v for geometry %+v", ka.shape, va.shape, c.g))
	}
	L := ka.shape[1]
	l := &c.layers[layer]
	if layer > 0 && c.layers[layer-1].pending != L || layer == 0 && l.pending != 0 {
		panic(fmt.Sprintf("cpu: KV Append: layer %d out of order", layer))
	}
	l.stage = nil
	c.room(l, c.keepFrom(l, c.n), c.n+L)
	c.write(&l.s, c.n, L, floats(ka), floats(va))
	l.pending = L
	kAll, vAll := c.view(&l.s, max(l.lo, engine.WindowStart(l.w, c.n)), c.n+L)
	if layer == c.g.Layers-1 {
		c.n += L
		for i := range c.layers {
			c.layers[i].pending = 0
			c.layers[i].extent = c.n
		}
	}
	return kAll, vAll
}

// CanTruncate reports whether every sliding layer still holds the window
// that position n needs.
func (c *ringCache) CanTruncate(n int) bool {
	if n < 0 || n > c.n {
		return false
	}
	if n == 0 {
		return true
	}
	for i := range c.layers {
		l := &c.layers[i]
		if l.lo > engine.WindowStart(l.w, n) {
			return false
		}
	}
	return true
}

// Truncate drops positions ≥ n and any staged import.
func (c *ringCache) Truncate(n int) {
	if !c.CanTruncate(n) {
		panic(fmt.Sprintf("cpu: KV Truncate(%d) with %d cached: a sliding layer no longer holds its window", n, c.n))
	}
	c.n = n
	for i := range c.layers {
		l := &c.layers[i]
		l.extent, l.pending, l.stage = n, 0, nil
		if n == 0 {
			l.lo, l.s.base = 0, 0
		}
	}
}

func (c *ringCache) checkRange(op string, layer, start, n int) error {
	if layer < 0 || layer >= c.g.Layers {
		return fmt.Errorf("cpu: KV %s: layer %d of %d", op, layer, c.g.Layers)
	}
	if start < 0 || n < 0 {
		return fmt.Errorf("cpu: KV %s: range [%d, %d+%d)", op, start, start, n)
	}
	return nil
}

// Export returns positions [start, start+n) of one layer (held ones only).
func (c *ringCache) Export(layer, start, n int) ([]byte, []byte, error) {
	if err := c.checkRange("Export", layer, start, n); err != nil {
		return nil, nil, err
	}
	l := &c.layers[layer]
	held := max(c.n, l.extent)
	if start+n > held {
		return nil, nil, fmt.Errorf("cpu: KV Export: range [%d, %d) past %d cached", start, start+n, held)
	}
	if n > 0 && start < l.lo {
		return nil, nil, fmt.Errorf("cpu: KV Export: layer %d (window %d) no longer holds position %d (holds from %d)", layer, l.w, start, l.lo)
	}
	kb, vb := l.s.export(c.dt, c.g.KVHeads, c.g.HeadDim, l.s.cap, start-l.s.base, n)
	return kb, vb, nil
}

// read copies Export-layout bytes into positions [start, start+n) of s.
func (c *ringCache) read(s *slab, start, n int, k, v []byte) {
	s.load(c.dt, c.g.KVHeads, c.g.HeadDim, s.cap, start-s.base, n, k, v)
}

// Import writes positions [start, start+n) of one layer. A full layer may
// not leave a gap; a sliding layer may: the import is staged and replaces
// the layer's content on Commit.
func (c *ringCache) Import(layer, start, n int, k, v []byte) error {
	if err := c.checkRange("Import", layer, start, n); err != nil {
		return err
	}
	l := &c.layers[layer]
	want := c.g.KVHeads * n * c.g.HeadDim * c.dt.Size()
	if len(k) != want || len(v) != want {
		return fmt.Errorf("cpu: KV Import: %d/%d bytes for %d tokens (want %d each)", len(k), len(v), n, want)
	}
	have := max(c.n, l.extent)
	if n == 0 {
		return nil
	}
	if l.stage != nil {
		if start != l.stageEnd {
			return fmt.Errorf("cpu: KV Import: layer %d start %d, staged import ends at %d", layer, start, l.stageEnd)
		}
		if start+n > l.stage.base+l.stage.cap {
			ns := c.alloc(max(2*l.stage.cap, start+n-l.stage.base))
			ns.base = l.stage.base
			c.move(&ns, l.stage, l.stageLo, l.stageEnd)
			l.stage = &ns
		}
		c.read(l.stage, start, n, k, v)
		l.stageEnd += n
		return nil
	}
	if start > have {
		if l.w == 0 {
			return fmt.Errorf("cpu: KV Import: layer %d start %d leaves a gap after %d held", layer, start, have)
		}
		s := c.alloc(max(n, 2*(l.w+ringSlack)))
		s.base = start
		c.read(&s, start, n, k, v)
		l.stage, l.stageLo, l.stageEnd = &s, start, start+n
		return nil
	}
	if start < l.lo {
		return fmt.Errorf("cpu: KV Import: layer %d start %d before the held window from %d", layer, start, l.lo)
	}
	c.room(l, min(c.keepFrom(l, c.n), start), start+n)
	c.read(&l.s, start, n, k, v)
	l.extent = max(have, start+n)
	return nil
}

// Commit makes positions [0, n) visible; every layer must hold what n needs.
func (c *ringCache) Commit(n int) error {
	if n < 0 {
		return fmt.Errorf("cpu: KV Commit(%d)", n)
	}
	for i := range c.layers {
		l := &c.layers[i]
		ws := engine.WindowStart(l.w, n)
		if l.stage != nil {
			if l.stageEnd < n || l.stageLo > ws {
				return fmt.Errorf("cpu: KV Commit(%d): layer %d imported [%d, %d), needs [%d, %d)", n, i, l.stageLo, l.stageEnd, ws, n)
			}
			continue
		}
		if have := max(c.n, l.extent); n > have || (n > 0 && l.lo > ws) {
			return fmt.Errorf("cpu: KV Commit(%d): layer %d holds [%d, %d), needs [%d, %d)", n, i, l.lo, have, ws, n)
		}
	}
	c.n = n
	for i := range c.layers {
		l := &c.layers[i]
		if l.stage != nil {
			l.s, l.lo = *l.stage, l.stageLo
			l.stage = nil
		}
		l.extent = n
		if n == 0 {
			l.lo = 0
		}
	}
	return nil
}
