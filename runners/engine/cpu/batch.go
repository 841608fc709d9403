package cpu

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// RoPERows rotates x [N, H, Dh] with row n at position positions[n] (see
// engine.Backend): the same products as RoPE's, so row n is RoPE's result
// for that position bit for bit.
func (b *Backend) RoPERows(xa engine.Array, positions []int, r *engine.RoPE) engine.Array {
	x := arr(xa)
	if len(x.shape) != 3 || x.shape[0] != len(positions) {
		panic(fmt.Sprintf("cpu: RoPERows: x of shape %v for %d positions, want [N, H, Dh]", x.shape, len(positions)))
	}
	H, Dh := x.shape[1], x.shape[2]
	dims := r.Dims
	if dims == 0 {
		dims = Dh
	}
	if dims > Dh || dims%2 != 0 {
		panic(fmt.Sprintf("cpu: RoPERows: %d rotated dims for head dim %d", dims, Dh))
	}
	invFreq, attnFactor := b.rope.frequencies(r, dims)
	half := dims / 2
	cos, sin := b.floats(half), b.floats(half)
	res := b.newF32(x.shape...)
	out := res.f32
	copy(out, floats(x))
	for n, p := range positions {
		pos := float32(p)
		for j := range half {
			ang := float64(pos * invFreq[j]) // as RoPE: the angle in float32
			cos[j] = float32(math.Cos(ang)) * attnFactor
			sin[j] = float32(math.Sin(ang)) * attnFactor
		}
		for h := range H {
			row := out[(n*H+h)*Dh : (n*H+h)*Dh+dims]
			for j := range half {
				x1, x2 := row[j], row[j+half]
				row[j] = x1*cos[j] - x2*sin[j]
				row[j+half] = x2*cos[j] + x1*sin[j]
			}
		}
	}
	return res
}

// BatchAttention appends each row's K/V to its cache and attends row by
// row (see engine.Backend): on this eager backend one sequence at a time
// is what a batch costs anyway, and each row's result is then exactly
// that of its sequence's own Append and WindowedAttention.
func (b *Backend) BatchAttention(caches []engine.KVCache, layer int, qa, ka, va engine.Array, scale float32, window int, sinks engine.Array) engine.Array {
	q, k, v := arr(qa), arr(ka), arr(va)
	B := len(caches)
	if len(q.shape) != 3 || len(k.shape) != 3 || len(v.shape) != 3 || q.shape[0] != B || k.shape[0] != B || v.shape[0] != B {
		panic(fmt.Sprintf("cpu: BatchAttention: q %v k %v v %v for %d caches, want [B, H, Dh], [B, Hkv, Dh]", q.shape, k.shape, v.shape, B))
	}
	H, Hkv, Dh := q.shape[1], k.shape[1], q.shape[2]
	if cap(b.batchOuts) < B {
		b.batchOuts = make([]engine.Array, B)
	}
	outs := b.batchOuts[:B]
	defer clear(outs)
	for i, c := range caches {
		ki := b.Reshape(b.Slice(k, 0, i, i+1), b.dims3(Hkv, 1, Dh)...)
		vi := b.Reshape(b.Slice(v, 0, i, i+1), b.dims3(Hkv, 1, v.shape[2])...)
		kAll, vAll := c.Append(layer, ki, vi)
		qi := b.Reshape(b.Slice(q, 0, i, i+1), b.dims3(H, 1, Dh)...)
		outs[i] = b.Reshape(b.WindowedAttention(qi, kAll, vAll, scale, window, sinks), b.dims3(1, H, Dh)...)
	}
	if B == 1 {
		return outs[0]
	}
	return b.Concat(0, outs...)
}

// dims3 is a shape in the backend's scratch (a variadic argument would be
// heap-allocated at every call; Reshape copies it).
func (b *Backend) dims3(x, y, z int) []int {
	b.dimBuf = [3]int{x, y, z}
	return b.dimBuf[:]
}
