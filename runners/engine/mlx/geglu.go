//go:build cgo && (linux || darwin)

package mlx

// #include "capi.h"
import "C"

import (
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// GeGLU is mlx-lm's nn.gelu_approx(gate) * up as MLX ops, in gate's dtype:
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) · up.
func (b *backend) GeGLU(gate, up engine.Array) engine.Array {
	return b.op(func() *array {
		g, u := b.arr(gate), b.arr(up)
		if !slices.Equal(g.shape, u.shape) {
			panic(fmt.Sprintf("mlx: GeGLU of %v and %v", g.shape, u.shape))
		}
		x3 := b.mul(b.mul(g, g), g)
		inner := b.mul(b.scalar(float32(math.Sqrt(2/math.Pi)), g.mdt), b.add(g, b.mul(b.scalar(0.044715, g.mdt), x3)))
		t := b.mk("tanh", func(r *C.xmx_array) C.int { return C.xmx_tanh(r, inner.h, b.stream) })
		gelu := b.mul(b.mul(b.scalar(0.5, g.mdt), g), b.add(b.scalar(1, g.mdt), t))
		return b.mul(gelu, u)
	})
}

// ClampedSwiGLU is mlx-lm's swiglu_oai as MLX ops, in gate's dtype.
func (b *backend) ClampedSwiGLU(gate, up engine.Array, alpha, limit float32) engine.Array {
	return b.op(func() *array {
		g, u := b.arr(gate), b.arr(up)
		if !slices.Equal(g.shape, u.shape) {
			panic(fmt.Sprintf("mlx: ClampedSwiGLU of %v and %v", g.shape, u.shape))
		}
		hi, lo := b.scalar(limit, g.mdt), b.scalar(-limit, g.mdt)
		gc := b.mk("minimum", func(r *C.xmx_array) C.int { return C.xmx_minimum(r, g.h, hi.h, b.stream) })
		um := b.mk("minimum", func(r *C.xmx_array) C.int { return C.xmx_minimum(r, u.h, hi.h, b.stream) })
		uc := b.mk("maximum", func(r *C.xmx_array) C.int { return C.xmx_maximum(r, um.h, lo.h, b.stream) })
		ag := b.mul(b.scalar(alpha, g.mdt), gc)
		sg := b.mk("sigmoid", func(r *C.xmx_array) C.int { return C.xmx_sigmoid(r, ag.h, b.stream) })
		return b.mul(b.add(uc, b.scalar(1, g.mdt)), b.mul(gc, sg))
	})
}

var (
	modeAffine = C.CString("affine")
	modeMXFP4  = C.CString("mxfp4")
)

// quantMode is MLX's name for a Linear's quantization mode (the engine's
// "" is MLX's affine).
func quantMode(m string) *C.char {
	switch m {
	case "":
		return modeAffine
	case "mxfp4":
		return modeMXFP4
	}
	panic(fmt.Sprintf("mlx: quantization mode %q", m))
}
