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
