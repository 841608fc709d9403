package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The routing ops of a mixture of experts: top-k selection, gathers, a
// sort, and the gathered matmul over stacked expert weights. They keep a
// row's result independent of the other rows (and of how rows are grouped
// by expert), so a MoE model's KV stays bit-identical across chunkings.

// TopK returns, per row of the last axis, the indices of the k largest
// values in descending order, ties to the lower index (the order the
// engine's host-side routing used).
func (b *Backend) TopK(x engine.Array, k int) engine.Array {
	a := arr(x)
	rows, d := lastDim("TopK", a)
	if k < 1 || k > d {
		panic(fmt.Sprintf("cpu: TopK: k = %d over %d entries", k, d))
	}
	v := floats(a)
	res := b.header(a.shape)
	res.shape[len(res.shape)-1] = k
	res.dt = engine.I32
	res.i32 = b.int32s(rows * k)
	out := res.i32
	for r := range rows {
		row := v[r*d : (r+1)*d]
		top := out[r*k : (r+1)*k]
		n := 0 // top[:n] holds the best so far, best first
		for j, e := range row {
			if n == k && !(e > row[top[k-1]]) {
				continue
			}
			// Insert j after every entry ≥ e (earlier indices win ties).
			p := min(n, k-1)
			for p > 0 && e > row[top[p-1]] {
				top[p] = top[p-1]
				p--
			}
			top[p] = int32(j)
			n = min(n+1, k)
		}
	}
	return res
}

// elems copies elements of a (any storage) into a step temporary of shape
// shape: element i of the result is element src[i] of a.
func (b *Backend) elems(a *Array, shape []int, src []int) *Array {
	a = materialize(a)
	n := len(src)
	out := b.header(shape)
	out.dt = a.dt
	switch a.dt {
	case engine.F32:
		out.f32 = b.floats(n)
		for i, s := range src {
			out.f32[i] = a.f32[s]
		}
	case engine.F16, engine.BF16:
		out.u16 = b.uint16s(n)
		for i, s := range src {
			out.u16[i] = a.u16[s]
		}
	case engine.I32:
		out.i32 = b.int32s(n)
		for i, s := range src {
			out.i32[i] = a.i32[s]
		}
	case engine.U32:
		out.u32 = make([]uint32, n)
		for i, s := range src {
			out.u32[i] = a.u32[s]
		}
	default:
		out.u8 = make([]byte, n)
		for i, s := range src {
			out.u8[i] = a.u8[s]
		}
	}
	return out
}

// srcIndex is a scratch index list of n entries, reused op after op (the
// Backend runs one op at a time).
func (b *Backend) srcIndex(n int) []int {
	if cap(b.srcIdx) < n {
		b.srcIdx = make([]int, n)
	}
	return b.srcIdx[:n]
}

func indices(op string, x engine.Array) *Array {
	a := arr(x)
	if a.dt != engine.I32 {
		panic(fmt.Sprintf("cpu: %s: indices are %v, want int32", op, a.dt))
	}
	return a
}

// TakeAlongAxis gathers along the last axis (dtype kept).
func (b *Backend) TakeAlongAxis(x, idx engine.Array) engine.Array {
	a, ix := arr(x), indices("TakeAlongAxis", idx)
	rows, d := lastDim("TakeAlongAxis", a)
	irows, k := lastDim("TakeAlongAxis", ix)
	if len(a.shape) != len(ix.shape) || !slices.Equal(a.shape[:len(a.shape)-1], ix.shape[:len(ix.shape)-1]) || rows != irows {
		panic(fmt.Sprintf("cpu: TakeAlongAxis: x %v with indices %v", a.shape, ix.shape))
	}
	src := b.srcIndex(rows * k)
	for r := range rows {
		for j, i := range ix.i32[r*k : (r+1)*k] {
			if i < 0 || int(i) >= d {
				panic(fmt.Sprintf("cpu: TakeAlongAxis: index %d outside %d", i, d))
			}
			src[r*k+j] = r*d + int(i)
		}
	}
	return b.elems(a, ix.shape, src)
}

// Take gathers rows along axis 0 (dtype kept).
func (b *Backend) Take(x, idx engine.Array) engine.Array {
	a, ix := arr(x), indices("Take", idx)
	if len(a.shape) == 0 || len(ix.shape) != 1 {
		panic(fmt.Sprintf("cpu: Take: x %v with indices %v", a.shape, ix.shape))
	}
	R := a.shape[0]
	row := 1
	if R > 0 {
		row = numel(a.shape) / R
	}
	src := b.srcIndex(len(ix.i32) * row)[:0]
	for _, i := range ix.i32 {
		if i < 0 || int(i) >= R {
			panic(fmt.Sprintf("cpu: Take: row %d outside %d", i, R))
		}
		for c := range row {
			src = append(src, int(i)*row+c)
		}
	}
	var shb [maxFastDims]int
	shape := append(append(shb[:0], len(ix.i32)), a.shape[1:]...)
	return b.elems(a, shape, src)
}

// Argsort sorts each row of the last axis ascending; equal values keep
// their order (a stable sort), so the result is deterministic.
func (b *Backend) Argsort(x engine.Array) engine.Array {
	a := materialize(arr(x))
	rows, d := lastDim("Argsort", a)
	out := make([]int32, rows*d)
	var key func(i int) float64
	if a.dt == engine.I32 {
		key = func(i int) float64 { return float64(a.i32[i]) }
	} else {
		v := floats(a)
		key = func(i int) float64 { return float64(v[i]) }
	}
	for r := range rows {
		p := out[r*d : (r+1)*d]
		for j := range p {
			p[j] = int32(j)
		}
		slices.SortStableFunc(p, func(i, j int32) int { return cmp.Compare(key(r*d+int(i)), key(r*d+int(j))) })
	}
	return &Array{shape: slices.Clone(a.shape), dt: engine.I32, i32: out}
}

// stacked is a Linear of E stacked matrices, split into per-expert
// weights on demand (views of the stacked storage, nothing copied).
type stacked struct {
	E, out, in int
	l          *engine.Linear
	w          *Array
	scales     []float32
	biases     []float32
	bias       []float32 // [E, out] or nil
	mx         *weight   // MXFP4 experts as 8-bit affine rows [E·out, in]
	// scales16, biases16 are the float16 originals when both are F16.
	scales16, biases16 []uint16
	// iq holds each expert's regrouped scales once it has run when the
	// experts take the integer path (iq.go); nil when they do not.
	iq   []*iqLayout
	simd bool
	lv   engine.Linear // the Linear it was made from (l points here)
	ew   weight        // expert's view, rebuilt by each expert call
}

func (b *Backend) newStacked(l *engine.Linear) *stacked {
	if l == nil || l.W == nil {
		panic("cpu: GatherLinear without a weight")
	}
	w := arr(l.W)
	// Prepared once per weight and kept with it (the expert views below
	// are made in its scratch): a decode step allocates nothing here.
	if s := w.stk; s != nil && s.l.Scales == l.Scales && s.l.Biases == l.Biases && s.l.Bias == l.Bias && s.l.Mode == l.Mode {
		return s
	}
	if len(w.shape) != 3 {
		panic(fmt.Sprintf("cpu: GatherLinear weight of shape %v, want [E, out, in]", w.shape))
	}
	s := &stacked{E: w.shape[0], out: w.shape[1], in: w.shape[2], lv: *l, w: w, simd: b.simd}
	s.l = &s.lv
	w.stk = s
	if l.Mode == "mxfp4" {
		// Exact, on the 8-bit kernels (mxfp4.go); made once per weight.
		s.mx = mxfp4Weight(l)
		s.in = s.mx.in
	} else if l.Bits > 0 {
		if w.dt != engine.U32 {
			panic(fmt.Sprintf("cpu: quantized GatherLinear weight of dtype %v, want uint32", w.dt))
		}
		switch l.Bits {
		case 2, 4, 8:
		default:
			panic(fmt.Sprintf("cpu: quantized GatherLinear with %d bits (want 2, 4 or 8)", l.Bits))
		}
		s.in = w.shape[2] * 32 / l.Bits
		if l.GroupSize <= 0 || s.in%l.GroupSize != 0 || l.GroupSize%(32/l.Bits) != 0 {
			panic(fmt.Sprintf("cpu: quantized GatherLinear: group size %d for %d inputs", l.GroupSize, s.in))
		}
		if l.Scales == nil || l.Biases == nil {
			panic("cpu: quantized GatherLinear without scales and biases")
		}
		sc, bz := arr(l.Scales), arr(l.Biases)
		ng := s.E * s.out * (s.in / l.GroupSize)
		if numel(sc.shape) != ng || numel(bz.shape) != ng {
			panic(fmt.Sprintf("cpu: quantized GatherLinear: scales %v / biases %v for weight %v with group %d", sc.shape, bz.shape, w.shape, l.GroupSize))
		}
		s.scales, s.biases = halfFloats(sc), halfFloats(bz)
		if sc.dt == engine.F16 && bz.dt == engine.F16 && sc.kv == nil && bz.kv == nil {
			s.scales16, s.biases16 = sc.u16, bz.u16
		}
	} else if w.dt != engine.F32 && w.dt != engine.F16 && w.dt != engine.BF16 {
		panic(fmt.Sprintf("cpu: dense GatherLinear weight of dtype %v", w.dt))
	}
	if b.iqEligible(s.expert(0)) {
		s.iq = make([]*iqLayout, s.E)
	}
	if l.Bias != nil {
		ba := arr(l.Bias)
		if numel(ba.shape) != s.E*s.out {
			panic(fmt.Sprintf("cpu: GatherLinear: bias %v for %d experts of %d outputs", ba.shape, s.E, s.out))
		}
		s.bias = halfFloats(ba)
	}
	return s
}

// expert returns expert e's matrix [out, in] as a weight for the matmul
// kernels.
func (s *stacked) expert(e int) *weight {
	if e < 0 || e >= s.E {
		panic(fmt.Sprintf("cpu: GatherLinear: expert %d outside %d", e, s.E))
	}
	w := &s.ew
	*w = weight{out: s.out, in: s.in, dt: s.w.dt, simd: s.simd}
	if s.mx != nil {
		m := s.mx
		ng := s.out * (s.in / m.gs)
		w.bits, w.gs, w.wpr = m.bits, m.gs, m.wpr
		w.q = m.q[e*s.out*m.wpr : (e+1)*s.out*m.wpr]
		w.scales, w.biases = m.scales[e*ng:(e+1)*ng], m.biases[e*ng:(e+1)*ng]
		return s.withIQ(w, e)
	}
	if s.l.Bits == 0 {
		n := s.out * s.in
		switch s.w.dt {
		case engine.F32:
			w.f32 = s.w.f32[e*n : (e+1)*n]
		default:
			w.u16 = s.w.u16[e*n : (e+1)*n]
		}
		return w
	}
	w.bits, w.gs, w.wpr = s.l.Bits, s.l.GroupSize, s.w.shape[2]
	n := s.out * w.wpr
	w.q = s.w.u32[e*n : (e+1)*n]
	ng := s.out * (s.in / w.gs)
	w.scales = s.scales[e*ng : (e+1)*ng]
	w.biases = s.biases[e*ng : (e+1)*ng]
	if s.scales16 != nil {
		w.scales16, w.biases16 = s.scales16[e*ng:(e+1)*ng], s.biases16[e*ng:(e+1)*ng]
	}
	return s.withIQ(w, e)
}

// withIQ gives expert e's weight its integer-path layout, made on its
// first use.
func (s *stacked) withIQ(w *weight, e int) *weight {
	if s.iq != nil {
		if s.iq[e] == nil {
			s.iq[e] = newIQLayout(w)
		}
		w.iq = s.iq[e]
	}
	return w
}

// GatherLinear multiplies each row by its expert's matrix. Consecutive
// rows with the same expert (all of them when the caller sorted by
// expert) run as one matmul, so that expert's weights are read once per
// run; the kernels give a row the same bits whatever the run's length, so
// grouping changes no result.
func (b *Backend) GatherLinear(x engine.Array, l *engine.Linear, experts engine.Array, sorted bool) engine.Array {
	s := b.newStacked(l)
	a, ix := arr(x), indices("GatherLinear", experts)
	if len(ix.shape) != 1 {
		panic(fmt.Sprintf("cpu: GatherLinear: experts %v, want [N]", ix.shape))
	}
	N := ix.shape[0]
	if len(a.shape) != 2 || a.shape[1] != s.in || (a.shape[0] != N && a.shape[0] != 1) {
		panic(fmt.Sprintf("cpu: GatherLinear: x %v for %d rows of weight [%d, %d, %d]", a.shape, N, s.E, s.out, s.in))
	}
	shared := a.shape[0] == 1
	xv := floats(a)
	res := b.newF32(N, s.out)
	out := res.f32
	ids := ix.i32
	for i := 0; i < N; {
		e := ids[i]
		j := i + 1
		for j < N && ids[j] == e {
			j++
		}
		n := j - i
		var xs []float32
		switch {
		case !shared:
			xs = xv[i*s.in : j*s.in]
		case n == 1:
			xs = xv
		default:
			xs = b.floats(n * s.in)[:0]
			for range n {
				xs = append(xs, xv...)
			}
		}
		o := out[i*s.out : j*s.out]
		b.matmulT(o, xs, n, s.expert(int(e)))
		if s.bias != nil {
			bias := s.bias[int(e)*s.out : (int(e)+1)*s.out]
			for r := range n {
				row := o[r*s.out : (r+1)*s.out]
				for c := range row {
					row[c] += bias[c]
				}
			}
		}
		i = j
	}
	return res
}

// Sigmoid is 1/(1+e^−x) in float32 (computed in float64, rounded once).
func (b *Backend) Sigmoid(x engine.Array) engine.Array {
	a := arr(x)
	v := floats(a)
	res := b.newF32(a.shape...)
	out := res.f32
	for i, e := range v {
		out[i] = float32(1 / (1 + math.Exp(-float64(e))))
	}
	return res
}
