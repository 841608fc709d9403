//go:build cgo && (linux || darwin)

package mlx

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The gated delta rule of Gated DeltaNet layers, as mlx-lm's
// gated_delta_update runs it off Metal (gated_delta_ops): the gates in
// float32, then the recurrence token by token from MLX ops, built in one
// mlx-c shim (capi.go) so a step costs one call from Go, not a dozen per
// token.

// op2 is op for an op with two results.
func (b *backend) op2(f func() (*array, *array)) (engine.Array, engine.Array) {
	a1, a2 := &array{owner: b}, &array{owner: b}
	b.post(func() {
		r1, r2 := f()
		b.adopt(a1, r1)
		b.adopt(a2, r2)
	})
	return a1, a2
}

// mk2 is mk for an mlx-c call writing two results.
func (b *backend) mk2(op string, f func(r1, r2 *C.xmx_array) C.int) (*array, *array) {
	var r1, r2 C.xmx_array
	if f(&r1, &r2) != 0 {
		for _, r := range []C.xmx_array{r1, r2} {
			if r.ctx != nil {
				C.xmx_array_free(r)
			}
		}
		panic(mlxErr(op))
	}
	return b.track(r1), b.track(r2)
}

func (b *backend) DeltaGates(a, bb, aLog, dtBias engine.Array) (engine.Array, engine.Array) {
	return b.op2(func() (*array, *array) {
		aa, ba, la, da := b.arr(a), b.arr(bb), b.arr(aLog), b.arr(dtBias)
		if len(aa.shape) == 0 || !slices.Equal(aa.shape, ba.shape) || numel(la.shape) != aa.shape[len(aa.shape)-1] || numel(da.shape) != numel(la.shape) {
			panic(fmt.Sprintf("mlx: DeltaGates: a %v, b %v, aLog %v, dtBias %v", aa.shape, ba.shape, la.shape, da.shape))
		}
		return b.mk2("delta gates", func(g, beta *C.xmx_array) C.int {
			return C.xmx_delta_gates(g, beta, aa.h, ba.h, la.h, da.h, b.stream)
		})
	})
}

// deltaChunkGPU and deltaChunkCPU are the chunk of the chunked form of
// the gated delta rule, which GatedDelta uses from 2 chunks on (prefill):
// a few dozen matrix ops per chunk instead of a dozen small ops per token.
// It agrees with the per-token form within float32 rounding (tests: 2e-5
// of the largest value over hundreds of tokens). Its arithmetic grows as
// L·chunk·log₂ chunk (the chunk's triangular solve is log₂ chunk matrix
// squares) and its op count as L/chunk: on a GPU, where a 64×64 product is
// as cheap as an elementwise op, 64 (not measured: no GPU here); on MLX's
// CPU backend, whose PyPI builds multiply with a reference BLAS, 16 (on
// the tiny Qwen3-Next, 256 tokens: the whole prefill took 1.5–2× the CPU
// time with 64 as with 16; the 64×64 squares were two thirds of its
// flops; docs/BENCHMARKS.md).
const (
	deltaChunkGPU = 64
	deltaChunkCPU = 16
)

func (b *backend) GatedDelta(q, k, v, g, beta, state engine.Array) (engine.Array, engine.Array) {
	chunk := deltaChunkCPU
	if b.name == "mlx-gpu" {
		chunk = deltaChunkGPU
	}
	return b.gatedDelta(q, k, v, g, beta, state, chunk)
}

// gatedDelta runs the chunked form with chunks of chunk tokens when L ≥
// 2·chunk, else the per-token form (chunk 0: always per token).
func (b *backend) gatedDelta(q, k, v, g, beta, state engine.Array, chunk int) (engine.Array, engine.Array) {
	return b.op2(func() (*array, *array) {
		qa, ka, va, ga, ba, sa := b.arr(q), b.arr(k), b.arr(v), b.arr(g), b.arr(beta), b.arr(state)
		if len(qa.shape) != 3 || !slices.Equal(qa.shape, ka.shape) || len(va.shape) != 3 {
			panic(fmt.Sprintf("mlx: GatedDelta: q %v, k %v, v %v", qa.shape, ka.shape, va.shape))
		}
		L, Hk, Dk, Hv, Dv := qa.shape[0], qa.shape[1], qa.shape[2], va.shape[1], va.shape[2]
		if va.shape[0] != L || Hk == 0 || Hv%Hk != 0 || !slices.Equal(sa.shape, []int{Hv, Dv, Dk}) ||
			!slices.Equal(ga.shape, []int{L, Hv}) || !slices.Equal(ba.shape, []int{L, Hv}) {
			panic(fmt.Sprintf("mlx: GatedDelta: q %v, v %v, g %v, beta %v, state %v", qa.shape, va.shape, ga.shape, ba.shape, sa.shape))
		}
		if ga.dt != engine.F32 || ba.dt != engine.F32 || sa.dt != engine.F32 {
			panic(fmt.Sprintf("mlx: GatedDelta: g %v, beta %v, state %v (want float32)", ga.dt, ba.dt, sa.dt))
		}
		if chunk > 0 && L >= 2*chunk {
			return b.mk2("gated delta (chunked)", func(y, st *C.xmx_array) C.int {
				return C.xmx_gated_delta_chunked(y, st, qa.h, ka.h, va.h, ga.h, ba.h, sa.h, C.int(L), C.int(Hv), C.int(Dv), C.int(Dk), C.int(Hv/Hk), C.int(chunk), b.stream)
			})
		}
		return b.mk2("gated delta", func(y, st *C.xmx_array) C.int {
			return C.xmx_gated_delta(y, st, qa.h, ka.h, va.h, ga.h, ba.h, sa.h, C.int(L), C.int(Hv), C.int(Dv), C.int(Dk), C.int(Hv/Hk), b.stream)
		})
	})
}
