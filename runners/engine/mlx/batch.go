//go:build cgo && (linux || darwin)

package mlx

// #include "capi.h"
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// A batched decode step (B sequences, one row each) runs RoPE and
// attention as one op each, as mlx-lm's BatchKVCache does: the B full-
// attention caches keep their K and V in one padded slab per layer
// [B, Hkv, cap, Dh] for as long as the same caches decode together; each
// step writes the B new rows with one put_along_axis (row b at its own
// position) and runs one scaled_dot_product_attention over the slab's
// first T = max position + 1 keys with an additive mask that hides each
// row's keys past its own position. The graph of a layer is then the same
// size whatever B is. When the batch changes the caches move to a new slab
// (one copy of their K/V); a cache used on its own again (a single
// sequence's step, several rows, Export, Import) first copies its row out.
// Ring caches (sliding-window models) and hybrid caches keep the row loop:
// their views are not positions 0…T-1 of one buffer. So does a batch whose
// lengths differ so much that the padding would more than double its KV
// memory (slabPays).

// RoPERows rotates x [N, H, Dh] with row n at positions[n]. On the CPU
// device (compiled rotation) and up to maxRopeTabs rows, the tables of the
// rows' positions are the ones RoPE uses for each position alone, stacked
// [N, 1, dims/2], so every row is RoPE's bit for bit. Elsewhere (a GPU, or
// more rows than the table cache holds) it is MLX's rope with one offset
// per row (mlx_fast_rope_dynamic, as mlx-lm's batched caches rotate):
// equal to RoPE within float rounding, not bit for bit. Row by row where
// mlx-c lacks it.
func (b *backend) RoPERows(x engine.Array, positions []int, r *engine.RoPE) engine.Array {
	pos, rp := slices.Clone(positions), *r
	return b.op(func() *array {
		xa := b.arr(x)
		if len(xa.shape) != 3 || xa.shape[0] != len(pos) {
			panic(fmt.Sprintf("mlx: RoPERows: x %v for %d positions, want [N, H, Dh]", xa.shape, len(pos)))
		}
		compiled := b.fallbackErr == nil
		// ropeTable keeps maxRopeTabs tables: more rows would evict the
		// first ones' before they are stacked.
		if compiled && xa.shape[1] > 0 && len(pos) <= maxRopeTabs {
			xs, ra := b.ropeSetup(xa, &rp)
			if ra.dims%2 == 0 {
				c, s := b.ropeRowTables(&ra, pos, xs.mdt)
				return b.ropeApply(xs, c, s, ra.dims)
			}
		}
		if C.xmx_has_rope_dynamic() {
			// MLX's rope with one offset per row: x as [N, H, 1, Dh].
			xs, ra := b.ropeSetup(xa, &rp)
			off := make([]byte, 4*len(pos))
			for n, p := range pos {
				binary.LittleEndian.PutUint32(off[4*n:], uint32(p))
			}
			oa := b.fromBytes(off, []int{len(pos)}, engine.I32)
			x4 := b.expandDims(xs, 2)
			r := b.mk("rope", func(r *C.xmx_array) C.int {
				return C.xmx_rope_dynamic(r, x4.h, C.int(ra.dims), C.bool(ra.hasBase), C.float(ra.base), 1, oa.h, ra.freqs, b.stream)
			})
			return b.reshape(r, xa.shape[0], xa.shape[1], xa.shape[2])
		}
		outs := make([]*array, len(pos))
		for n, p := range pos {
			row := b.transpose(b.slice(xa, 0, n, n+1), 1, 0, 2) // [H, 1, Dh]
			outs[n] = b.transpose(b.rope(row, p, &rp, compiled), 1, 0, 2)
		}
		if len(outs) == 1 {
			return outs[0]
		}
		return b.concat(0, outs...)
	})
}

// ropeRowTables returns the cosines and sines [N, 1, dims/2] of the
// positions pos: each position's one-row table (ropeTable, shared with
// RoPE), stacked; kept for the step's other calls (every layer's q and k).
func (b *backend) ropeRowTables(ra *ropeArgs, pos []int, mdt C.int) (c, s *array) {
	k0 := ra.key(0, 1, mdt)
	if t := &b.rowTab; t.c != nil && !t.c.freed && t.key == k0 && slices.Equal(t.pos, pos) {
		return t.c, t.s
	}
	cs, ss := make([]*array, len(pos)), make([]*array, len(pos))
	for n, p := range pos {
		cs[n], ss[n] = b.ropeTable(ra.key(p, 1, mdt), ra.freqs)
	}
	if len(pos) == 1 {
		return cs[0], ss[0]
	}
	c, s = b.concat(0, cs...), b.concat(0, ss...)
	t := &b.rowTab
	b.release(t.c)
	b.release(t.s)
	b.keep(c)
	b.keep(s)
	*t = rowTab{key: k0, pos: append(t.pos[:0], pos...), c: c, s: s}
	return c, s
}

// rowTab is the last stacked table ropeRowTables made (key has offset 0).
type rowTab struct {
	key  ropeTabKey
	pos  []int
	c, s *array
}

// BatchAttention appends row b of k, v to caches[b] and attends (see
// engine.Backend): one slab op when every cache is this backend's full-
// attention cache and the layer has no window, the row loop otherwise.
func (b *backend) BatchAttention(caches []engine.KVCache, layer int, q, k, v engine.Array, scale float32, window int, sinks engine.Array) engine.Array {
	cs := make([]*kvCache, len(caches))
	slab := window <= 0 && b.slabErr == nil
	longest, total := 0, 0
	for i, c := range caches {
		kc, ok := c.(*kvCache)
		if !ok || kc.b != b {
			slab = false
			break
		}
		cs[i] = kc
		n := kc.Len() + 1
		longest, total = max(longest, n), total+n
	}
	// The slab pads every row to the longest: where that would hold much
	// more than the caches themselves (one long sequence beside short
	// ones), the rows keep their own storage and the loop.
	if !slab || !slabPays(len(caches), longest, total) {
		return b.batchRows(caches, layer, q, k, v, scale, window, sinks)
	}
	return b.op(func() *array { return b.slabAttention(cs, layer, b.arr(q), b.arr(k), b.arr(v), scale, sinks) })
}

// slabPays reports whether a slab of B rows padded to longest positions
// holds at most about twice the total positions of the rows (a cache's
// own storage also rounds up to kvStep).
func slabPays(B, longest, total int) bool {
	return B*longest <= 2*total+B*kvStep
}

// batchRows is BatchAttention one row at a time: each sequence's own
// Append and attention, as the engine's loop runs prefill chunks.
func (b *backend) batchRows(caches []engine.KVCache, layer int, q, k, v engine.Array, scale float32, window int, sinks engine.Array) engine.Array {
	outs := make([]engine.Array, len(caches))
	for i, c := range caches {
		ki := b.Transpose(b.Slice(k, 0, i, i+1), 1, 0, 2) // [Hkv, 1, Dh]
		vi := b.Transpose(b.Slice(v, 0, i, i+1), 1, 0, 2)
		kAll, vAll := c.Append(layer, ki, vi)
		qi := b.Transpose(b.Slice(q, 0, i, i+1), 1, 0, 2)
		var o engine.Array
		if window <= 0 && sinks == nil {
			o = b.Attention(qi, kAll, vAll, scale)
		} else {
			o = b.WindowedAttention(qi, kAll, vAll, scale, window, sinks)
		}
		outs[i] = b.Transpose(o, 1, 0, 2) // [1, H, Dh]
	}
	if len(outs) == 1 {
		return outs[0]
	}
	return b.Concat(0, outs...)
}

// kvSlab holds the K and V of the caches of a batched decode, row r for
// rows[r] (nil once that cache left): per layer [B, Hkv, cap, Dh], kept.
type kvSlab struct {
	rows []*kvCache
	k, v []*array
	// The step being built: idx (I32 [B, Hkv, 1, Dh], each row's
	// position, where put_along_axis writes its K/V), mask (additive
	// [B, 1, 1, t] in the queries' dtype; nil when all rows are at the
	// same position), t (keys attended: the last position + 1) and the
	// last layer written (a lower one starts the next step).
	idx, mask *array
	t, layer  int
}

// holds reports whether sl's rows are cs, in order.
func (sl *kvSlab) holds(cs []*kvCache) bool {
	return sl != nil && slices.Equal(sl.rows, cs)
}

// slabAttention is BatchAttention's slab path, on the MLX thread.
func (b *backend) slabAttention(cs []*kvCache, layer int, qa, ka, va *array, scale float32, sinks engine.Array) *array {
	g := cs[0].g
	B := len(cs)
	if len(qa.shape) != 3 || len(ka.shape) != 3 || !slices.Equal(ka.shape, va.shape) || qa.shape[0] != B || ka.shape[0] != B ||
		ka.shape[1] != g.KVHeads || ka.shape[2] != g.HeadDim || qa.shape[2] != g.HeadDim || qa.shape[1]%g.KVHeads != 0 {
		panic(fmt.Sprintf("mlx: BatchAttention: q %v k %v v %v for %d caches of %d×%d, want [B, H, Dh], [B, Hkv, Dh]", qa.shape, ka.shape, va.shape, B, g.KVHeads, g.HeadDim))
	}
	for _, c := range cs {
		c.checkLayer("BatchAttention", layer)
	}
	sl := cs[0].slab
	if !sl.holds(cs) || layer <= sl.layer {
		sl = b.slabStep(cs, qa.mdt)
	}
	sl.layer = layer
	sl.grow(b, layer)
	mdt := toMLX(cs[0].dt)
	for _, p := range []struct {
		s []*array
		x *array
	}{{sl.k, ka}, {sl.v, va}} {
		upd := b.astype(b.expandDims(p.x, 2), mdt) // [B, Hkv, 1, Dh]
		old := p.s[layer]
		next := b.mk("put_along_axis", func(r *C.xmx_array) C.int {
			return C.xmx_put_along_axis(r, old.h, sl.idx.h, upd.h, 2, b.stream)
		})
		b.keep(next)
		b.release(old) // so that MLX may write in place
		p.s[layer] = next
	}
	kAll, vAll := b.slice(sl.k[layer], 2, 0, sl.t), b.slice(sl.v[layer], 2, 0, sl.t)
	q4 := b.expandDims(qa, 2) // [B, H, 1, Dh]
	var mask, sk C.xmx_array
	if sl.mask != nil {
		mask = sl.mask.h
	}
	if sinks != nil {
		sa := b.arr(sinks)
		if len(sa.shape) != 1 || sa.shape[0] != qa.shape[1] {
			panic(fmt.Sprintf("mlx: BatchAttention: sinks %v for %d heads", sa.shape, qa.shape[1]))
		}
		sk = b.astype(sa, qa.mdt).h
	}
	o := b.mk("scaled_dot_product_attention", func(r *C.xmx_array) C.int {
		return C.xmx_sdpa_ext(r, q4.h, kAll.h, vAll.h, C.float(scale), maskNone, mask, sk, b.stream)
	})
	if layer == g.Layers-1 {
		for _, c := range cs {
			c.n++
		}
	}
	return b.reshape(o, B, qa.shape[1], qa.shape[2])
}

// slabStep starts a step of cs: the slab that holds them (a new one when
// the batch changed), each row's write position and the mask.
func (b *backend) slabStep(cs []*kvCache, mdt C.int) *kvSlab {
	sl := cs[0].slab
	if !sl.holds(cs) {
		sl = b.newSlab(cs)
	}
	b.release(sl.idx)
	b.release(sl.mask)
	sl.idx, sl.mask, sl.layer = nil, nil, -1
	g := cs[0].g
	t, ragged := 0, false
	for _, c := range cs {
		t = max(t, c.n+1)
	}
	for _, c := range cs {
		ragged = ragged || c.n+1 != t
	}
	per := g.KVHeads * g.HeadDim
	idx := make([]byte, 4*len(cs)*per)
	for i, c := range cs {
		for j := range per {
			binary.LittleEndian.PutUint32(idx[4*(i*per+j):], uint32(c.n))
		}
	}
	sl.idx = b.fromBytes(idx, []int{len(cs), g.KVHeads, 1, g.HeadDim}, engine.I32)
	b.keep(sl.idx)
	if ragged {
		neg := math.Float32bits(float32(math.Inf(-1)))
		m := make([]byte, 4*len(cs)*t)
		for i, c := range cs {
			for j := c.n + 1; j < t; j++ {
				binary.LittleEndian.PutUint32(m[4*(i*t+j):], neg)
			}
		}
		f := b.fromBytes(m, []int{len(cs), 1, 1, t}, engine.F32)
		sl.mask = b.astype(f, mdt)
		b.keep(sl.mask)
	}
	sl.t = t
	return sl
}

// grow makes layer's storage hold sl.t positions (kvStep at a time).
func (sl *kvSlab) grow(b *backend, layer int) {
	have := sl.k[layer].shape[2]
	if sl.t <= have {
		return
	}
	g := sl.k[layer].shape
	more := (sl.t+kvStep-1)/kvStep*kvStep - have
	for _, s := range [][]*array{sl.k, sl.v} {
		old := s[layer]
		z := b.zeros([]int{g[0], g[1], more, g[3]}, old.dt)
		next := b.concat(2, old, z)
		b.keep(next)
		b.release(old)
		s[layer] = next
	}
}

// newSlab moves cs into a new slab: each cache's storage (its own, or its
// row of an earlier slab) padded to the layer's largest capacity. The
// caches of earlier slabs that are not in cs copy their rows out, and the
// earlier slabs go.
func (b *backend) newSlab(cs []*kvCache) *kvSlab {
	g, dt := cs[0].g, cs[0].dt
	sl := &kvSlab{rows: slices.Clone(cs), k: make([]*array, g.Layers), v: make([]*array, g.Layers), layer: -1}
	var olds []*kvSlab
	for _, c := range cs {
		if c.g.Layers != g.Layers || c.g.KVHeads != g.KVHeads || c.g.HeadDim != g.HeadDim || c.dt != dt {
			panic(fmt.Sprintf("mlx: BatchAttention: caches of %+v %v and %+v %v in one batch", g, dt, c.g, c.dt))
		}
		if c.slab != nil && !slices.Contains(olds, c.slab) {
			olds = append(olds, c.slab)
		}
	}
	parts := make([]*array, len(cs))
	for l := range g.Layers {
		capL := 0
		for _, c := range cs {
			capL = max(capL, c.layerCap(l))
		}
		capL = max(capL, kvStep)
		for kv, dst := range []*[]*array{&sl.k, &sl.v} {
			for i, c := range cs {
				a := c.storage(l, kv)
				switch {
				case a == nil:
					a = b.zeros([]int{g.KVHeads, capL, g.HeadDim}, dt)
				case a.shape[1] < capL:
					a = b.concat(1, a, b.zeros([]int{g.KVHeads, capL - a.shape[1], g.HeadDim}, dt))
				}
				parts[i] = b.expandDims(a, 0)
			}
			s := b.concat(0, parts...)
			b.keep(s)
			(*dst)[l] = s
		}
	}
	for i, c := range cs {
		for l := range g.Layers {
			b.release(c.k[l])
			b.release(c.v[l])
			c.k[l], c.v[l] = nil, nil
		}
		if c.slab != nil {
			c.slab.rows[c.row] = nil
		}
		c.slab, c.row = sl, i
	}
	for _, old := range olds {
		for _, m := range old.rows {
			if m != nil {
				m.detach()
			}
		}
		old.free(b)
	}
	return sl
}

// view is row r of layer's K (kv 0) or V (1) as [Hkv, cap, Dh] (a view).
func (sl *kvSlab) view(b *backend, layer, r, kv int) *array {
	s := sl.k[layer]
	if kv == 1 {
		s = sl.v[layer]
	}
	return b.reshape(b.slice(s, 0, r, r+1), s.shape[1], s.shape[2], s.shape[3])
}

// free releases sl's arrays (its rows have all left).
func (sl *kvSlab) free(b *backend) {
	for l := range sl.k {
		b.release(sl.k[l])
		b.release(sl.v[l])
		sl.k[l], sl.v[l] = nil, nil
	}
	b.release(sl.idx)
	b.release(sl.mask)
	sl.idx, sl.mask = nil, nil
}

// leave takes c's row out of sl (nothing is copied) and frees sl when it
// was the last.
func (sl *kvSlab) leave(b *backend, c *kvCache) {
	sl.rows[c.row] = nil
	c.slab = nil
	for _, m := range sl.rows {
		if m != nil {
			return
		}
	}
	sl.free(b)
}

// storage is layer's K (kv 0) or V (1) storage [Hkv, cap, Dh]: its own, a
// view of its slab row, or nil when never written.
func (c *kvCache) storage(layer, kv int) *array {
	if c.slab != nil {
		return c.slab.view(c.b, layer, c.row, kv)
	}
	if kv == 1 {
		return c.v[layer]
	}
	return c.k[layer]
}

// layerCap is the positions layer's storage holds.
func (c *kvCache) layerCap(layer int) int {
	if c.slab != nil {
		return c.slab.k[layer].shape[2]
	}
	return c.capacity(layer)
}

// detach copies c's row out of its slab into storage of its own (on the
// MLX thread), before c is used alone.
func (c *kvCache) detach() {
	sl := c.slab
	if sl == nil {
		return
	}
	b := c.b
	for l := range c.g.Layers {
		for kv, dst := range []*[]*array{&c.k, &c.v} {
			row := sl.view(b, l, c.row, kv)
			// A copy, not the view: the view would keep the whole slab.
			own := b.sliceUpdate(b.zeros(row.shape, c.dt), row, 1, 0)
			b.keep(own)
			(*dst)[l] = own
		}
	}
	sl.leave(b, c)
}
