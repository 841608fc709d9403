//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestRoutingOpsMatchCPU: the MoE routing ops give the cpu backend's
// results (TopK as a set: MLX's argpartition leaves the k in its own
// order), GatherLinear for dense f32/bf16 and 4/8-bit stacked weights,
// sorted and unsorted experts, a shared input row, and a bias.
func TestRoutingOpsMatchCPU(t *testing.T) {
	p := newPair(t)
	m, c := p.m, p.c
	ints := func(b engine.Backend, a engine.Array) []int32 {
		t.Helper()
		raw, err := b.Bytes(a)
		if err != nil {
			t.Fatal(err)
		}
		if a.DType() != engine.I32 {
			t.Fatalf("dtype %v, want int32", a.DType())
		}
		out := make([]int32, len(raw)/4)
		for i := range out {
			out[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return out
	}
	t.Run("TopK", func(t *testing.T) {
		const rows, n, k = 9, 16, 4
		xm, xc := p.in(p.randn(rows*n, 1), engine.F32, rows, n)
		gm, gc := ints(m, m.TopK(xm, k)), ints(c, c.TopK(xc, k))
		if !slices.Equal(m.TopK(xm, k).Shape(), []int{rows, k}) {
			t.Fatalf("shape %v", m.TopK(xm, k).Shape())
		}
		for r := range rows {
			a, b := slices.Clone(gm[r*k:(r+1)*k]), slices.Clone(gc[r*k:(r+1)*k])
			slices.Sort(a)
			slices.Sort(b)
			if !slices.Equal(a, b) {
				t.Fatalf("row %d: mlx %v, cpu %v", r, gm[r*k:(r+1)*k], gc[r*k:(r+1)*k])
			}
		}
		// The scores of the chosen experts, whichever order.
		p.same("take_along_axis", m.TakeAlongAxis(xm, m.FromInt32(gc, rows, k)), c.TakeAlongAxis(xc, c.FromInt32(gc, rows, k)), 0)
	})
	t.Run("TakeArgsort", func(t *testing.T) {
		xm, xc := p.in(p.randn(6*5, 1), engine.BF16, 6, 5)
		idx := []int32{5, 0, 0, 3}
		p.same("take", m.Take(xm, m.FromInt32(idx, 4)), c.Take(xc, c.FromInt32(idx, 4)), 0)
		keys := []int32{3, 1, 4, 1, 5, 9, 2, 6, 5, 3}
		order := ints(m, m.Argsort(m.FromInt32(keys, len(keys))))
		if !slices.IsSortedFunc(order, func(a, b int32) int { return int(keys[a] - keys[b]) }) || len(order) != len(keys) {
			t.Fatalf("argsort %v of %v", order, keys)
		}
		seen := map[int32]bool{}
		for _, o := range order {
			seen[o] = true
		}
		if len(seen) != len(keys) {
			t.Fatalf("argsort %v is not a permutation", order)
		}
	})
	const E, out, in = 6, 24, 128
	for _, q := range []struct {
		dt          engine.DType
		bits, group int
		tol         float64
	}{{engine.F32, 0, 0, 1e-5}, {engine.BF16, 0, 0, 2e-2}, {engine.F32, 4, 64, 1e-4}, {engine.F32, 8, 32, 1e-4}} {
		t.Run(fmt.Sprintf("GatherLinear-%v-q%d", q.dt, q.bits), func(t *testing.T) {
			var lm, lc engine.Linear
			if q.bits == 0 {
				wm, wc := p.in(p.randn(E*out*in, 0.1), q.dt, E, out, in)
				lm, lc = engine.Linear{W: wm}, engine.Linear{W: wc}
			} else {
				w, s, bi := p.quantized(E*out, in, q.bits, q.group)
				wm, wc := p.raw(w, engine.U32, E, out, in*q.bits/32)
				sm, sc := p.raw(s, engine.F32, E, out, in/q.group)
				bm, bc := p.raw(bi, engine.F32, E, out, in/q.group)
				lm = engine.Linear{W: wm, Scales: sm, Biases: bm, Bits: q.bits, GroupSize: q.group}
				lc = engine.Linear{W: wc, Scales: sc, Biases: bc, Bits: q.bits, GroupSize: q.group}
			}
			for _, experts := range [][]int32{{0, 0, 1, 3, 3, 3, 5}, {5, 2, 0, 2, 4, 1, 1}} {
				N := len(experts)
				sorted := slices.IsSorted(experts)
				xm, xc := p.in(p.randn(N*in, 1), q.dt, N, in)
				em, ec := m.FromInt32(experts, N), c.FromInt32(experts, N)
				p.same(fmt.Sprintf("rows %v", experts), m.GatherLinear(xm, &lm, em, sorted), c.GatherLinear(xc, &lc, ec, sorted), q.tol)
				x1m, x1c := p.in(p.randn(in, 1), q.dt, 1, in)
				p.same(fmt.Sprintf("shared row %v", experts), m.GatherLinear(x1m, &lm, em, false), c.GatherLinear(x1c, &lc, ec, false), q.tol)
			}
			bm, bc := p.in(p.randn(E*out, 1), engine.F32, E, out)
			lm.Bias, lc.Bias = bm, bc
			xm, xc := p.in(p.randn(3*in, 1), q.dt, 3, in)
			p.same("bias", m.GatherLinear(xm, &lm, m.FromInt32([]int32{4, 0, 4}, 3), false), c.GatherLinear(xc, &lc, c.FromInt32([]int32{4, 0, 4}, 3), false), q.tol)
		})
	}
}

// syncCounter counts the engine-level synchronizations a model makes.
type syncCounter struct {
	engine.Backend
	evals, reads int
}

func (c *syncCounter) Eval(a ...engine.Array) error { c.evals++; return c.Backend.Eval(a...) }
func (c *syncCounter) Float32(a engine.Array) ([]float32, error) {
	c.reads++
	return c.Backend.Float32(a)
}
func (c *syncCounter) Bytes(a engine.Array) ([]byte, error) { c.reads++; return c.Backend.Bytes(a) }

// TestMoEDecodeStepOneEvalMLX: on MLX a MoE decode step is one Eval of
// the step's graph and one read of its logits, and MLX itself evaluates
// twice (the graph, then the contiguous copy the read makes of the already
// computed logits), however many sparse layers: Qwen3-MoE (every layer
// sparse) and gpt-oss (biased, clamped experts; f32, and MXFP4 through
// gather_qmm's mxfp4 mode). The host-routing baseline pays one more of
// each per sparse layer.
func TestMoEDecodeStepOneEvalMLX(t *testing.T) {
	mb := newTestBackend(t)
	for _, spec := range []testmodel.Spec{
		{Arch: "qwen3moe", DType: engine.F32, Seed: 2, Layers: 4, AllSparse: true},
		{Arch: "gptoss", DType: engine.F32, Seed: 2, Layers: 4},
		{Arch: "gptoss", DType: engine.BF16, Seed: 2, Layers: 4, MXFP4: true},
	} {
		t.Run(fmt.Sprintf("%s-%v-mxfp4=%v", spec.Arch, spec.DType, spec.MXFP4), func(t *testing.T) {
			oneEvalMLX(t, mb, spec)
		})
	}
}

func oneEvalMLX(t *testing.T, mb *backend, spec testmodel.Spec) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	mlxEvals := func() (n int) {
		mb.do(func() { n = mb.evals })
		return n
	}
	for _, host := range []bool{false, true} {
		b := &syncCounter{Backend: mb}
		mod, err := engine.Load(ctx, dir, b, engine.LoadOptions{HostMoERouting: host})
		if err != nil {
			t.Fatal(err)
		}
		sparse := mod.Info().Layers
		want := 1
		if host {
			want += sparse
		}
		c := mod.NewCache()
		lg := forward(t, mod, c, testmodel.ReferencePrompts()[2]...)
		for step := range 3 {
			b.evals, b.reads = 0, 0
			before := mlxEvals()
			lg = forward(t, mod, c, argmax(lg))
			got := mlxEvals() - before
			t.Logf("host=%v step %d: %d Eval, %d reads, %d mlx_eval", host, step, b.evals, b.reads, got)
			if b.evals != want || b.reads != want || got != 2*want {
				t.Fatalf("host=%v step %d: %d Evals, %d reads, %d mlx_eval calls; want %d, %d, %d", host, step, b.evals, b.reads, got, want, want, 2*want)
			}
		}
		c.Free()
		mod.Close()
	}
}
