package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// broadcastSuffix checks that small's shape, without leading size-1 axes,
// equals the trailing axes of big's shape (broadcasting over leading axes).
func broadcastSuffix(op string, big, small []int) {
	s := small
	for len(s) > 0 && s[0] == 1 {
		s = s[1:]
	}
	if len(s) > len(big) || !slices.Equal(big[len(big)-len(s):], s) {
		panic(fmt.Sprintf("cpu: %s: cannot broadcast %v to %v", op, small, big))
	}
}

func (b *Backend) binary(op string, x, y engine.Array, f func(p, q float32) float32) engine.Array {
	a, c := arr(x), arr(y)
	if numel(a.shape) < numel(c.shape) {
		a, c = c, a
	}
	broadcastSuffix(op, a.shape, c.shape)
	av, cv := b.vals(a), b.vals(c)
	res := b.newF32(a.shape...)
	out := res.f32
	m := len(cv)
	if m == 0 {
		return res
	}
	// Strip leading size-1 axes of the smaller operand: it repeats every m.
	for i := 0; i < len(av); i += m {
		o := out[i : i+m]
		s := av[i : i+m]
		for j := range o {
			o[j] = f(s[j], cv[j])
		}
	}
	return res
}

// Add adds with broadcasting over leading axes.
func (b *Backend) Add(x, y engine.Array) engine.Array {
	return b.binary("Add", x, y, func(p, q float32) float32 { return p + q })
}

// Mul multiplies with broadcasting over leading axes.
func (b *Backend) Mul(x, y engine.Array) engine.Array {
	return b.binary("Mul", x, y, func(p, q float32) float32 { return p * q })
}

// SwiGLU is silu(gate) * up in one pass: with e = exp32(−|g|) (exp.go),
// s = g / (1 + e) for g ≥ 0 and g·e / (1 + e) below, then s · u, each
// operation rounded to float32 (the AVX2 and Go code give the same bits).
func (b *Backend) SwiGLU(gate, up engine.Array) engine.Array {
	g, u := arr(gate), arr(up)
	if !slices.Equal(g.shape, u.shape) {
		panic(fmt.Sprintf("cpu: SwiGLU of %v and %v", g.shape, u.shape))
	}
	gv, uv := floats(g), floats(u)
	res := b.newF32(g.shape...)
	out := res.f32
	if len(gv) < 2*swigluChunk {
		swiglu(out, gv, uv, b.simd)
		return res
	}
	b.parallel(len(gv), swigluChunk, func(lo, hi int) {
		swiglu(out[lo:hi], gv[lo:hi], uv[lo:hi], b.simd)
	})
	return res
}

// swigluChunk is the least work SwiGLU gives a thread.
const swigluChunk = 16384

func swiglu(out, gv, uv []float32, simd bool) {
	uv = uv[:len(gv)]
	out = out[:len(gv)]
	i := 0
	if simd && len(gv) >= 8 {
		i = len(gv) &^ 7
		swigluAVX(&out[0], &gv[0], &uv[0], i)
	}
	for ; i < len(gv); i++ {
		out[i] = silu32(gv[i]) * uv[i]
	}
}

// silu32 is g·sigmoid(g) as SwiGLU computes it.
func silu32(g float32) float32 {
	e := exp32(-float32(math.Abs(float64(g))))
	num := g
	if math.Signbit(float64(g)) {
		num = g * e
	}
	return num / float32(1+e)
}

func lastDim(op string, a *Array) (rows, d int) {
	if len(a.shape) == 0 {
		panic(fmt.Sprintf("cpu: %s of a scalar", op))
	}
	d = a.shape[len(a.shape)-1]
	if d == 0 {
		return 0, 0
	}
	return numel(a.shape) / d, d
}

// RMSNorm normalizes over the last axis: x / sqrt(mean(x²) + eps) * w.
func (b *Backend) RMSNorm(x, w engine.Array, eps float32) engine.Array {
	a := arr(x)
	rows, d := lastDim("RMSNorm", a)
	wv := halfFloats(arr(w)) // a weight: widened once
	if len(wv) != d {
		panic(fmt.Sprintf("cpu: RMSNorm: weight %v for x %v", arr(w).shape, a.shape))
	}
	v := b.vals(a)
	res := b.newF32(a.shape...)
	out := res.f32
	if rows < 2*rmsNormRows {
		rmsNorm(out, v, wv, 0, rows, d, eps)
		return res
	}
	b.parallel(rows, rmsNormRows, func(lo, hi int) {
		rmsNorm(out, v, wv, lo, hi, d, eps)
	})
	return res
}

// rmsNormRows is the least work RMSNorm gives a thread.
const rmsNormRows = 64

func rmsNorm(out, v, wv []float32, lo, hi, d int, eps float32) {
	for r := lo; r < hi; r++ {
		row := v[r*d : (r+1)*d]
		var ss float64
		for _, e := range row {
			ss += float64(e) * float64(e)
		}
		inv := float32(1 / math.Sqrt(ss/float64(d)+float64(eps)))
		o := out[r*d : (r+1)*d]
		for j, e := range row {
			o[j] = e * inv * wv[j]
		}
	}
}

// Softmax over the last axis.
func (b *Backend) Softmax(x engine.Array) engine.Array {
	a := arr(x)
	rows, d := lastDim("Softmax", a)
	v := floats(a)
	res := b.newF32(a.shape...)
	out := res.f32
	for r := 0; r < rows; r++ {
		softmaxInto(out[r*d:(r+1)*d], v[r*d:(r+1)*d])
	}
	return res
}

func softmaxInto(dst, src []float32) {
	m := float32(math.Inf(-1))
	for _, e := range src {
		m = max(m, e)
	}
	var sum float64
	for i, e := range src {
		p := float32(math.Exp(float64(e - m)))
		dst[i] = p
		sum += float64(p)
	}
	inv := float32(1 / sum)
	for i := range dst {
		dst[i] *= inv
	}
}

// Argmax over the last axis → I32 (first index on ties).
func (b *Backend) Argmax(x engine.Array) engine.Array {
	a := arr(x)
	rows, d := lastDim("Argmax", a)
	v := floats(a)
	res := b.header(a.shape[:len(a.shape)-1])
	res.dt = engine.I32
	res.i32 = b.int32s(rows)
	out := res.i32
	for r := 0; r < rows; r++ {
		row := v[r*d : (r+1)*d]
		best := 0
		for j, e := range row {
			if e > row[best] {
				best = j
			}
		}
		out[r] = int32(best)
	}
	return res
}

// Reshape returns a with a new shape of the same size; one dimension may be
// -1 (inferred).
func (b *Backend) Reshape(x engine.Array, shape ...int) engine.Array {
	a := materialize(arr(x))
	n := numel(a.shape)
	out := b.header(shape)
	shape = out.shape
	infer := -1
	known := 1
	for i, d := range shape {
		if d == -1 {
			if infer >= 0 {
				panic(fmt.Sprintf("cpu: Reshape: two -1 in %v", shape))
			}
			infer = i
			continue
		}
		known *= d
	}
	if infer >= 0 {
		if known == 0 || n%known != 0 {
			panic(fmt.Sprintf("cpu: Reshape: %v to %v", a.shape, shape))
		}
		shape[infer] = n / known
	}
	if numel(shape) != n {
		panic(fmt.Sprintf("cpu: Reshape: %v (%d elements) to %v", a.shape, n, shape))
	}
	out.dt, out.f32, out.u16, out.i32, out.u32, out.u8 = a.dt, a.f32, a.u16, a.i32, a.u32, a.u8
	return out
}

// maxFastDims is the rank up to which the shape ops keep their index
// arithmetic on the stack.
const maxFastDims = 8

// strides writes row-major strides for shape into s (len(shape)).
func strides(s, shape []int) []int {
	s = s[:len(shape)]
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// intBuf returns n ints in buf when they fit, else new ones.
func intBuf(buf *[maxFastDims]int, n int) []int {
	if n <= len(buf) {
		return buf[:n:n]
	}
	return make([]int, n)
}

// forEachIndex calls fn(dst, src) for every element of a permuted/sliced
// view, with src offsets computed from srcStrides over the output shape.
func forEachIndex(shape, srcStrides []int, base int, fn func(dst, src int)) {
	n := numel(shape)
	if n == 0 {
		return
	}
	nd := len(shape)
	var ib [maxFastDims]int
	idx := intBuf(&ib, nd)
	src := base
	for dst := 0; dst < n; dst++ {
		fn(dst, src)
		for k := nd - 1; k >= 0; k-- {
			idx[k]++
			src += srcStrides[k]
			if idx[k] < shape[k] {
				break
			}
			src -= srcStrides[k] * shape[k]
			idx[k] = 0
		}
	}
}

// copyStrided builds a new array of a's dtype whose element dst is a's
// element at src offset, as forEachIndex enumerates. Runs of contiguous
// float32 along the last axis are copied whole.
func (b *Backend) copyStrided(a *Array, shape, srcStrides []int, base int) *Array {
	n := numel(shape)
	out := b.header(shape)
	out.dt = a.dt
	switch {
	case a.f32 != nil || a.dt == engine.F32:
		out.f32 = b.floats(n)
		nd := len(shape)
		if nd > 0 && srcStrides[nd-1] == 1 && shape[nd-1] > 1 {
			// Copy rows: enumerate all but the last axis.
			run := shape[nd-1]
			forEachIndex(shape[:nd-1], srcStrides[:nd-1], base, func(d, s int) {
				copy(out.f32[d*run:(d+1)*run], a.f32[s:s+run])
			})
			break
		}
		forEachIndex(shape, srcStrides, base, func(d, s int) { out.f32[d] = a.f32[s] })
	case a.dt == engine.F16 || a.dt == engine.BF16:
		out.u16 = make([]uint16, n)
		forEachIndex(shape, srcStrides, base, func(d, s int) { out.u16[d] = a.u16[s] })
	case a.dt == engine.I32:
		out.i32 = b.int32s(n)
		forEachIndex(shape, srcStrides, base, func(d, s int) { out.i32[d] = a.i32[s] })
	case a.dt == engine.U32:
		out.u32 = make([]uint32, n)
		forEachIndex(shape, srcStrides, base, func(d, s int) { out.u32[d] = a.u32[s] })
	case a.dt == engine.U8:
		out.u8 = make([]byte, n)
		forEachIndex(shape, srcStrides, base, func(d, s int) { out.u8[d] = a.u8[s] })
	default:
		panic(fmt.Sprintf("cpu: cannot copy %v", a.dt))
	}
	return out
}

// Transpose permutes axes; no perm reverses them.
func (b *Backend) Transpose(x engine.Array, perm ...int) engine.Array {
	a := materialize(arr(x))
	nd := len(a.shape)
	var pb, sb, shb, srb [maxFastDims]int
	if len(perm) == 0 {
		perm = intBuf(&pb, nd)
		for i := range perm {
			perm[i] = nd - 1 - i
		}
	}
	if len(perm) != nd {
		panic(fmt.Sprintf("cpu: Transpose: perm %v for shape %v", slices.Clone(perm), a.shape))
	}
	st := strides(intBuf(&sb, nd), a.shape)
	shape := intBuf(&shb, nd)
	src := intBuf(&srb, nd)
	var seen uint64
	for i, p := range perm {
		if p < 0 || p >= nd || p >= 64 || seen&(1<<p) != 0 {
			panic(fmt.Sprintf("cpu: Transpose: bad perm %v", slices.Clone(perm)))
		}
		seen |= 1 << p
		shape[i] = a.shape[p]
		src[i] = st[p]
	}
	return b.copyStrided(a, shape, src, 0)
}

// Slice takes [start, end) along axis.
func (b *Backend) Slice(x engine.Array, axis, start, end int) engine.Array {
	a := materialize(arr(x))
	if axis < 0 {
		axis += len(a.shape)
	}
	if axis < 0 || axis >= len(a.shape) || start < 0 || end < start || end > a.shape[axis] {
		panic(fmt.Sprintf("cpu: Slice: axis %d [%d,%d) of %v", axis, start, end, a.shape))
	}
	var shb, sb [maxFastDims]int
	shape := intBuf(&shb, len(a.shape))
	copy(shape, a.shape)
	shape[axis] = end - start
	st := strides(intBuf(&sb, len(a.shape)), a.shape)
	return b.copyStrided(a, shape, st, start*st[axis])
}

// Concat joins arrays along axis; all other dimensions must agree.
func (b *Backend) Concat(axis int, arrays ...engine.Array) engine.Array {
	if len(arrays) == 0 {
		panic("cpu: Concat of nothing")
	}
	first := materialize(arr(arrays[0]))
	nd := len(first.shape)
	if axis < 0 {
		axis += nd
	}
	if axis < 0 || axis >= nd {
		panic(fmt.Sprintf("cpu: Concat: axis %d for %v", axis, first.shape))
	}
	var shb [maxFastDims]int
	shape := intBuf(&shb, nd)
	copy(shape, first.shape)
	shape[axis] = 0
	for _, x := range arrays {
		p := materialize(arr(x))
		if len(p.shape) != nd || p.dt != first.dt {
			panic(fmt.Sprintf("cpu: Concat: %v %v with %v %v", p.dt, p.shape, first.dt, first.shape))
		}
		for k := range nd {
			if k != axis && p.shape[k] != first.shape[k] {
				panic(fmt.Sprintf("cpu: Concat: %v with %v on axis %d", p.shape, first.shape, axis))
			}
		}
		shape[axis] += p.shape[axis]
	}
	outer := numel(shape[:axis])
	inner := numel(shape[axis+1:])
	out := b.header(shape)
	out.dt = first.dt
	n := numel(shape)
	if first.dt == engine.F32 {
		out.f32 = b.floats(n)
		at := 0
		for o := 0; o < outer; o++ {
			for _, x := range arrays {
				p := materialize(arr(x))
				w := p.shape[axis] * inner
				at += copy(out.f32[at:], p.f32[o*w:(o+1)*w])
			}
		}
		return out
	}
	parts := make([]*Array, len(arrays))
	for i, x := range arrays {
		parts[i] = materialize(arr(x))
	}
	switch first.dt {
	case engine.F16, engine.BF16:
		out.u16 = make([]uint16, 0, n)
	case engine.I32:
		out.i32 = make([]int32, 0, n)
	case engine.U32:
		out.u32 = make([]uint32, 0, n)
	case engine.U8:
		out.u8 = make([]byte, 0, n)
	}
	for o := 0; o < outer; o++ {
		for _, p := range parts {
			w := p.shape[axis] * inner
			switch first.dt {
			case engine.F16, engine.BF16:
				out.u16 = append(out.u16, p.u16[o*w:(o+1)*w]...)
			case engine.I32:
				out.i32 = append(out.i32, p.i32[o*w:(o+1)*w]...)
			case engine.U32:
				out.u32 = append(out.u32, p.u32[o*w:(o+1)*w]...)
			case engine.U8:
				out.u8 = append(out.u8, p.u8[o*w:(o+1)*w]...)
			}
		}
	}
	return out
}

// AsType converts between F32, F16, BF16 and I32 (float→int truncates).
func (b *Backend) AsType(x engine.Array, dt engine.DType) engine.Array {
	a := materialize(arr(x))
	if a.dt == dt {
		return a
	}
	shape := slices.Clone(a.shape)
	switch dt {
	case engine.F32:
		res := b.newF32(a.shape...)
		copy(res.f32, b.vals(a))
		return res
	case engine.F16, engine.BF16:
		if a.dt == engine.F16 || a.dt == engine.BF16 {
			a = heapF32(shape, floats(a))
		}
		v := floats(a)
		out := make([]uint16, len(v))
		toHalf(out, v, dt)
		return &Array{shape: shape, dt: dt, u16: out}
	case engine.I32:
		v := floats(a)
		out := make([]int32, len(v))
		for i, e := range v {
			out[i] = int32(e)
		}
		return &Array{shape: shape, dt: dt, i32: out}
	}
	panic(fmt.Sprintf("cpu: AsType: %v to %v not supported", a.dt, dt))
}

// Embedding gathers rows of a dense or quantized table [V, D] → [L, D].
func (b *Backend) Embedding(table *engine.Linear, ids engine.Array) engine.Array {
	var w weight
	b.setWeight(&w, table)
	idx := arr(ids)
	if idx.dt != engine.I32 {
		panic(fmt.Sprintf("cpu: Embedding: ids are %v, want int32", idx.dt))
	}
	tokens := idx.i32
	res := b.newF32(len(tokens), w.in)
	out := res.f32
	for i, t := range tokens {
		if t < 0 || int(t) >= w.out {
			panic(fmt.Sprintf("cpu: Embedding: token id %d outside vocabulary of %d", t, w.out))
		}
		w.row(out[i*w.in:(i+1)*w.in], int(t))
	}
	return res
}
