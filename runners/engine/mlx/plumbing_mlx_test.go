//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// The queued ops copy their arguments: a caller that reuses its shape,
// permutation or RoPE parameters once the call has returned (before the
// MLX thread ran the op) does not change the op. Shapes and permutations
// of more dimensions than an array holds inline take the other path.
func TestQueuedOpsCopyArguments(t *testing.T) {
	p := newPair(t)
	for _, dims := range [][]int{{2, 3, 4}, {2, 3, 2, 2}, {1, 2, 3, 2, 2}, {2, 1, 3, 1, 2, 2}} {
		n := 1
		for _, d := range dims {
			n *= d
		}
		data := p.randn(n, 1)
		mx, cx := p.in(data, engine.F32, n)
		shape := slices.Clone(dims)
		my := p.m.Reshape(mx, shape...)
		for i := range shape {
			shape[i] = -7 // after the call returned: must not reach the op
		}
		cy := p.c.Reshape(cx, dims...)
		p.same("reshape", my, cy, 0)

		perm := make([]int, len(dims))
		for i := range perm {
			perm[i] = len(dims) - 1 - i
		}
		want := slices.Clone(perm)
		mt := p.m.Transpose(my, perm...)
		for i := range perm {
			perm[i] = i
		}
		ct := p.c.Transpose(cy, want...)
		p.same("transpose", mt, ct, 0)
		if got := mt.Shape(); len(got) != len(dims) {
			t.Fatalf("transpose of %v: shape %v", dims, got)
		}
	}

	// Slice's bounds, and a view of a view.
	data := p.randn(4*6, 1)
	mx, cx := p.in(data, engine.F32, 4, 6)
	p.same("slice", p.m.Slice(p.m.Slice(mx, 1, 1, 5), 0, 1, 3), p.c.Slice(p.c.Slice(cx, 1, 1, 5), 0, 1, 3), 0)

	// RoPE: the parameters are copied when RoPE returns.
	q := p.randn(2*3*8, 1)
	mq, cq := p.in(q, engine.F32, 2, 3, 8)
	r := &engine.RoPE{Dims: 8, Base: 10000}
	mr := p.m.RoPE(mq, 5, r)
	r.Base, r.Dims = 7, 4
	cr := p.c.RoPE(cq, 5, &engine.RoPE{Dims: 8, Base: 10000})
	p.same("rope", mr, cr, 1e-5)
}

// Op results are recycled once their placeholder took the handle: many
// ops in a row, their placeholders all alive, each keep their own shape
// and values, and the temporaries are those of the placeholders only.
func TestRecycledResultsStayDistinct(t *testing.T) {
	p := newPair(t)
	data := p.randn(2*3*4, 1)
	mx, cx := p.in(data, engine.F32, 2, 3, 4)
	var ms, cs []engine.Array
	for i := range 40 {
		switch i % 4 {
		case 0:
			ms, cs = append(ms, p.m.Add(mx, mx)), append(cs, p.c.Add(cx, cx))
		case 1:
			ms, cs = append(ms, p.m.Reshape(mx, 6, 4)), append(cs, p.c.Reshape(cx, 6, 4))
		case 2:
			ms, cs = append(ms, p.m.Transpose(mx, 2, 0, 1)), append(cs, p.c.Transpose(cx, 2, 0, 1))
		case 3:
			ms, cs = append(ms, p.m.Mul(mx, p.m.Slice(mx, 2, 0, 4))), append(cs, p.c.Mul(cx, p.c.Slice(cx, 2, 0, 4)))
		}
	}
	for i := range ms {
		p.same("op", ms[i], cs[i], 0)
	}
	p.m.do(func() {
		seen := map[*array]bool{}
		for _, a := range p.m.temps {
			if seen[a] {
				t.Errorf("array %v tracked twice", a)
			}
			seen[a] = true
		}
		for _, a := range p.m.spare {
			if seen[a] {
				t.Errorf("a spare array is tracked as a temporary: %v", a)
			}
			if a.h.ctx != nil {
				t.Errorf("a spare array holds a handle")
			}
		}
	})
}

// Scalars and rope rows are made once and kept: a second use adds no
// array, Free() sweeps leave them, and Close releases them.
func TestConstantsKept(t *testing.T) {
	b := newTestBackend(t)
	var s1, s2 *array
	b.do(func() {
		s1 = b.scalar(0.5, toMLX(engine.BF16))
		s2 = b.scalar(0.5, toMLX(engine.BF16))
	})
	if s1 != s2 || !s1.kept {
		t.Fatalf("scalar 0.5 made twice (%p, %p) or not kept (%v)", s1, s2, s1.kept)
	}
	b.Free()
	b.do(func() {
		if s1.freed {
			t.Fatal("a Free() sweep released a kept constant")
		}
		if s3 := b.scalar(0.5, toMLX(engine.F32)); s3 == s1 {
			t.Fatal("scalars of two dtypes share an array")
		}
	})
	v, err := b.Float32(b.op(func() *array { return b.astype(s1, toMLX(engine.F32)) }))
	if err != nil || len(v) != 1 || v[0] != 0.5 {
		t.Fatalf("scalar 0.5 reads back %v, %v", v, err)
	}
}

// A decode step's Go allocations: a few per op (the placeholder the
// engine holds), not one per argument, closure and shape as before (164
// a layer measured at 52fde86). The bound leaves room for the engine's own
// bookkeeping; it is a count, not a time.
func TestDecodeStepAllocations(t *testing.T) {
	mb := newTestBackend(t)
	dir := filepath.Join(t.TempDir(), "m")
	const layers = 4
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", DType: engine.F32, Seed: 1, Layers: layers, Hidden: 64,
		Heads: 4, KVHeads: 2, Intermediate: 128, Vocab: 512, MaxPositions: 512}); err != nil {
		t.Fatal(err)
	}
	m := load(t, dir, mb)
	c := m.NewCache()
	defer c.Free()
	ctx := context.Background()
	if err := m.Prefill(ctx, c, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 0, nil); err != nil {
		t.Fatal(err)
	}
	tok := int32(9)
	step := func() {
		logits, err := m.Forward(ctx, c, []int32{tok})
		if err != nil {
			t.Fatal(err)
		}
		tok = argmax(logits)
	}
	step() // first use: compiled closures, tables
	got := testing.AllocsPerRun(20, step)
	if perLayer := got / layers; perLayer > 60 {
		t.Errorf("a decode step allocates %.0f times (%.0f a layer), want at most 60 a layer", got, perLayer)
	}
	t.Logf("%.0f allocations a step, %.1f a layer", got, got/layers)

	// And the answers are the cpu backend's.
	cm := load(t, dir, cpu.New(0))
	cc, mc := cm.NewCache(), m.NewCache()
	defer cc.Free()
	defer mc.Free()
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	ml, cl := forward(t, m, mc, prompt...), forward(t, cm, cc, prompt...)
	for i := range 6 {
		if argmax(ml) != argmax(cl) {
			t.Fatalf("step %d: mlx picks %d, cpu %d", i, argmax(ml), argmax(cl))
		}
		next := argmax(cl)
		ml, cl = forward(t, m, mc, next), forward(t, cm, cc, next)
	}
}

// BenchmarkHostLayerOps measures the host's cost of building a graph, with
// no evaluation at all: the ops of one SmolLM2-shaped decoder layer's
// decode step (width 576, 9 query / 3 KV heads of 64, MLP 1536, 128
// cached positions) posted through engine.Backend, then the temporaries
// swept. Every CPU second it reports (cpu-us/op: all threads, user +
// system) is host work: the Go side, the cgo crossings and MLX's graph
// building, less disturbed by other load than wall time.
func BenchmarkHostLayerOps(b *testing.B) {
	be := newTestBackend(b)
	const hidden, heads, kvHeads, dh, inter, ctx = 576, 9, 3, 64, 1536, 128
	w := func(shape ...int) engine.Array {
		n := 1
		for _, d := range shape {
			n *= d
		}
		a := be.FromFloat32(make([]float32, n), shape...)
		be.Keep(a)
		return a
	}
	lin := func(out, in int) *engine.Linear { return &engine.Linear{W: w(out, in)} }
	q, k, v, o := lin(heads*dh, hidden), lin(kvHeads*dh, hidden), lin(kvHeads*dh, hidden), lin(hidden, heads*dh)
	gate, up, down := lin(inter, hidden), lin(inter, hidden), lin(hidden, inter)
	n1, n2 := w(hidden), w(hidden)
	kc, vc := w(kvHeads, ctx, dh), w(kvHeads, ctx, dh)
	x := w(1, hidden)
	rope := &engine.RoPE{Dims: dh, Base: 10000}
	if err := be.Eval(x); err != nil {
		b.Fatal(err)
	}
	ops := 0
	layer := func(pos int) {
		h := be.RMSNorm(x, n1, 1e-5)
		qs := be.Transpose(be.Reshape(be.Linear(h, q), 1, heads, dh), 1, 0, 2)
		ks := be.Transpose(be.Reshape(be.Linear(h, k), 1, kvHeads, dh), 1, 0, 2)
		vs := be.Transpose(be.Reshape(be.Linear(h, v), 1, kvHeads, dh), 1, 0, 2)
		qs, ks = be.RoPE(qs, pos, rope), be.RoPE(ks, pos, rope)
		kAll, vAll := be.Concat(1, kc, ks), be.Concat(1, vc, vs)
		att := be.Reshape(be.Transpose(be.Attention(qs, kAll, vAll, 0.125), 1, 0, 2), 1, heads*dh)
		r := be.Add(x, be.Linear(att, o))
		h2 := be.RMSNorm(r, n2, 1e-5)
		_ = be.Add(r, be.Linear(be.SwiGLU(be.Linear(h2, gate), be.Linear(h2, up)), down))
		ops += 26
	}
	layer(ctx) // first use: compiled closures
	be.Free()
	be.do(func() {})
	b.ReportAllocs()
	cpu0 := cpuTime()
	ops = 0
	for i := 0; b.Loop(); i++ {
		layer(ctx + i%64)
		be.Free()
		be.do(func() {}) // the MLX thread has built every op
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(ops), "wall-us/op")
	if d := cpuTime() - cpu0; d > 0 {
		b.ReportMetric(float64(d.Nanoseconds())/1e3/float64(ops), "cpu-us/op")
	}
}
