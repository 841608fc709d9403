package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// GeGLU is gelu_tanh(gate) · up (see engine.Backend), in float32 with the
// tanh in float64.
func (b *Backend) GeGLU(gate, up engine.Array) engine.Array {
	g, u := arr(gate), arr(up)
	if !slices.Equal(g.shape, u.shape) {
		panic(fmt.Sprintf("cpu: GeGLU of %v and %v", g.shape, u.shape))
	}
	gv, uv := floats(g), floats(u)
	out := make([]float32, len(gv))
	c := float32(math.Sqrt(2 / math.Pi))
	b.parallel(len(gv), 16384, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := gv[i]
			t := float32(math.Tanh(float64(c * (x + 0.044715*x*x*x))))
			out[i] = 0.5 * x * (1 + t) * uv[i]
		}
	})
	return heapF32(g.shape, out)
}

// ClampedSwiGLU is gpt-oss's activation (see engine.Backend).
func (b *Backend) ClampedSwiGLU(gate, up engine.Array, alpha, limit float32) engine.Array {
	g, u := arr(gate), arr(up)
	if !slices.Equal(g.shape, u.shape) {
		panic(fmt.Sprintf("cpu: ClampedSwiGLU of %v and %v", g.shape, u.shape))
	}
	gv, uv := floats(g), floats(u)
	out := make([]float32, len(gv))
	b.parallel(len(gv), 16384, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := min(gv[i], limit)
			y := max(min(uv[i], limit), -limit)
			s := x / (1 + float32(math.Exp(float64(-alpha*x))))
			out[i] = (y + 1) * s
		}
	})
	return heapF32(g.shape, out)
}
