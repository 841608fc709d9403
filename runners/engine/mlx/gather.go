//go:build cgo && (linux || darwin)

package mlx

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The MoE routing ops, mapped to MLX as mlx-lm's SwitchGLU uses them:
// argpartition for the top k, take_along_axis, argsort, take, and
// gather_mm / gather_qmm over stacked expert weights.

// int32 returns MLX's uint32 index results as our I32.
func (b *backend) int32(x *array) *array { return b.astype(x, C.XMX_INT32) }

func (b *backend) indices(op string, x engine.Array) *array {
	a := b.arr(x)
	if a.dt != engine.I32 {
		panic(fmt.Sprintf("mlx: %s: indices are %v, want int32", op, a.dt))
	}
	return a
}

func (b *backend) TopK(x engine.Array, k int) engine.Array {
	return b.op(func() *array {
		xa := b.arr(x)
		if len(xa.shape) == 0 {
			panic("mlx: TopK of a scalar")
		}
		n := xa.shape[len(xa.shape)-1]
		if k < 1 || k > n {
			panic(fmt.Sprintf("mlx: TopK: k = %d over %d entries", k, n))
		}
		p := b.mk("argpartition", func(r *C.xmx_array) C.int {
			return C.xmx_argpartition(r, xa.h, C.int(n-k), -1, b.stream)
		})
		return b.int32(b.slice(p, -1, n-k, n))
	})
}

func (b *backend) TakeAlongAxis(x, idx engine.Array) engine.Array {
	return b.op(func() *array {
		xa, ia := b.arr(x), b.indices("TakeAlongAxis", idx)
		if len(xa.shape) != len(ia.shape) || len(xa.shape) == 0 {
			panic(fmt.Sprintf("mlx: TakeAlongAxis: x %v with indices %v", xa.shape, ia.shape))
		}
		return b.mk("take_along_axis", func(r *C.xmx_array) C.int {
			return C.xmx_take_along_axis(r, xa.h, ia.h, -1, b.stream)
		})
	})
}

func (b *backend) Take(x, idx engine.Array) engine.Array {
	return b.op(func() *array {
		xa, ia := b.arr(x), b.indices("Take", idx)
		if len(xa.shape) == 0 || len(ia.shape) != 1 {
			panic(fmt.Sprintf("mlx: Take: x %v with indices %v", xa.shape, ia.shape))
		}
		return b.mk("take", func(r *C.xmx_array) C.int { return C.xmx_take(r, xa.h, ia.h, 0, b.stream) })
	})
}

func (b *backend) Argsort(x engine.Array) engine.Array {
	return b.op(func() *array {
		xa := b.arr(x)
		if len(xa.shape) == 0 {
			panic("mlx: Argsort of a scalar")
		}
		return b.int32(b.mk("argsort", func(r *C.xmx_array) C.int { return C.xmx_argsort(r, xa.h, -1, b.stream) }))
	})
}

func (b *backend) GatherLinear(x engine.Array, l *engine.Linear, experts engine.Array, sorted bool) engine.Array {
	return b.op(func() *array {
		xa, ia := b.arr(x), b.indices("GatherLinear", experts)
		w := b.arr(l.W)
		if len(w.shape) != 3 || len(ia.shape) != 1 {
			panic(fmt.Sprintf("mlx: GatherLinear: weight %v with experts %v", w.shape, ia.shape))
		}
		in := w.shape[2]
		if l.Bits > 0 {
			in = in * 32 / l.Bits
		}
		N := ia.shape[0]
		if len(xa.shape) != 2 || xa.shape[1] != in || (xa.shape[0] != N && xa.shape[0] != 1) {
			panic(fmt.Sprintf("mlx: GatherLinear: x %v for %d rows of weight %v", xa.shape, N, w.shape))
		}
		x3 := b.reshape(xa, xa.shape[0], 1, in) // [R, 1, in]: one matrix row per batch entry
		var y *array
		switch {
		case l.Bits == 0:
			y = b.gatherMM(x3, w, ia, sorted)
		case b.qmmErr == nil:
			s := b.arr(l.Scales)
			var bi C.xmx_array
			if l.Biases != nil {
				bi = b.arr(l.Biases).h
			}
			y = b.mk("gather_qmm", func(r *C.xmx_array) C.int {
				return C.xmx_gather_qmm(r, x3.h, w.h, s.h, bi, ia.h, C.int(l.GroupSize), C.int(l.Bits), quantMode(l.Mode), C.bool(sorted), b.stream)
			})
		default:
			y = b.gatherMM(x3, b.dequantized(w, l), ia, sorted)
		}
		y = b.reshape(y, N, y.shape[len(y.shape)-1]) // [N, out]
		if l.Bias != nil {
			bias := b.arr(l.Bias)
			y = b.add(y, b.mk("take", func(r *C.xmx_array) C.int { return C.xmx_take(r, bias.h, ia.h, 0, b.stream) }))
		}
		return y
	})
}

// gatherMM is gather_mm of x3 [R, 1, in] with the stacked dense weight
// w [E, out, in] (transposed to [E, in, out] as a view, as mlx-lm's
// SwitchLinear does) → [N, 1, out]. Where gather_mm takes only float32
// (MLX's CPU backend) a 16-bit weight is multiplied through a float32
// copy made once and kept with it, and the result is cast back to x's
// dtype.
func (b *backend) gatherMM(x3, w, idx *array, sorted bool) *array {
	out := x3.mdt
	if b.gmmHalfErr != nil && w.mdt != C.XMX_FLOAT32 {
		w = b.float32Copy(w)
	}
	if b.gmmHalfErr != nil {
		x3 = b.astype(x3, C.XMX_FLOAT32)
	}
	wt := b.transpose(w, 0, 2, 1)
	y := b.mk("gather_mm", func(r *C.xmx_array) C.int {
		return C.xmx_gather_mm(r, x3.h, wt.h, idx.h, C.bool(sorted), b.stream)
	})
	if b.gmmHalfErr != nil {
		y = b.astype(y, out)
	}
	return y
}

// float32Copy returns (making once, kept, released with w) w as float32.
func (b *backend) float32Copy(w *array) *array {
	if d, ok := b.deq[w]; ok {
		return d
	}
	if !w.kept {
		return b.astype(w, C.XMX_FLOAT32) // a temporary: convert per use
	}
	d := b.astype(w, C.XMX_FLOAT32)
	b.keep(d)
	if err := b.eval(d); err != nil {
		panic(err)
	}
	b.deq[w] = d
	return d
}

// probeGatherMMHalf runs a tiny bfloat16 gather_mm and reports why it
// failed, if it did (MLX's CPU backend supports float32 only).
func (b *backend) probeGatherMMHalf() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
		b.sweep()
	}()
	x := b.fromBytes(make([]byte, 2*8), []int{1, 1, 8}, engine.BF16)
	w := b.fromBytes(make([]byte, 2*2*8*4), []int{2, 8, 4}, engine.BF16)
	idx := b.fromBytes(make([]byte, 4), []int{1}, engine.I32)
	y := b.mk("gather_mm", func(r *C.xmx_array) C.int {
		return C.xmx_gather_mm(r, x.h, w.h, idx.h, false, b.stream)
	})
	return b.eval(y)
}

func (b *backend) Sigmoid(x engine.Array) engine.Array {
	return b.op(func() *array {
		xa := b.arr(x)
		return b.mk("sigmoid", func(r *C.xmx_array) C.int { return C.xmx_sigmoid(r, xa.h, b.stream) })
	})
}
