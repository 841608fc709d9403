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
	res := b.newF32(g.shape...)
	out := res.f32
	if len(gv) < 2*16384 { // a decode step's rows: no threads, no closure
		geglu(out, gv, uv)
		return res
	}
	b.parallel(len(gv), 16384, func(lo, hi int) { geglu(out[lo:hi], gv[lo:hi], uv[lo:hi]) })
	return res
}

func geglu(out, gv, uv []float32) {
	c := float32(math.Sqrt(2 / math.Pi))
	uv, out = uv[:len(gv)], out[:len(gv)]
	for i, x := range gv {
		t := float32(math.Tanh(float64(c * (x + 0.044715*x*x*x))))
		out[i] = 0.5 * x * (1 + t) * uv[i]
	}
}

// ClampedSwiGLU is gpt-oss's activation (see engine.Backend).
func (b *Backend) ClampedSwiGLU(gate, up engine.Array, alpha, limit float32) engine.Array {
	g, u := arr(gate), arr(up)
	if !slices.Equal(g.shape, u.shape) {
		panic(fmt.Sprintf("cpu: ClampedSwiGLU of %v and %v", g.shape, u.shape))
	}
	gv, uv := floats(g), floats(u)
	res := b.newF32(g.shape...)
	out := res.f32
	if len(gv) < 2*16384 {
		clampedSwiGLU(out, gv, uv, alpha, limit)
		return res
	}
	b.parallel(len(gv), 16384, func(lo, hi int) { clampedSwiGLU(out[lo:hi], gv[lo:hi], uv[lo:hi], alpha, limit) })
	return res
}

func clampedSwiGLU(out, gv, uv []float32, alpha, limit float32) {
	uv, out = uv[:len(gv)], out[:len(gv)]
	for i, g := range gv {
		x := min(g, limit)
		y := max(min(uv[i], limit), -limit)
		s := x / (1 + float32(math.Exp(float64(-alpha*x))))
		out[i] = (y + 1) * s
	}
}
