package cpu

import (
	"fmt"
	"slices"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Matrix multiplication.
//
// Every product here is x [L, K] times a weight stored row-major as [N, K]
// (HF Linear layout): out[i, j] = dot(x_i, w_j). Work is split over the
// output columns j in blocks of four weight rows, one contiguous range of
// blocks per goroutine. Each block's four rows are fetched once as float32
// (a slice of an F32 weight, or expanded from F16/BF16 words or from MLX
// affine-quantized words into a per-goroutine scratch buffer) and then
// multiplied with every input row, so a weight element is expanded once per
// call however long the prompt is.
//
// Quantized weights are never expanded in memory as a whole. 4- and
// 8-bit affine weights whose group size is a multiple of 32 (every GGUF
// type, most MLX files, MXFP4 in its 8-bit form) take the integer path of
// iq.go for every L: int16 activations, exact integer dot products. The
// others (2-bit, groups of 16) stay on the float path: for decode
// (L ≤ quantFusedMaxRows) the fused kernel reads the packed words and
// widens them in registers; for prefill the block expansion above is
// cheaper. docs/BENCHMARKS.md records the numbers behind these choices.
//
// Every kernel computes a given output element with the same operations in
// the same order, whatever L is and whichever path runs (1×4 or 2×4 block,
// fused or expanded): row i of x·Wᵀ is bit-identical to (x_i)·Wᵀ. The
// model relies on it so that KV computed in chunks of any size (remote
// prefill, local prefill, decode) is the same bytes.

// quantFusedMaxRows is the largest L for which quantized products use the
// fused decode kernel.
const quantFusedMaxRows = 2

// weight is a Linear's matrix [out, in] prepared for the kernels.
type weight struct {
	out, in int
	dt      engine.DType // dense storage dtype
	f32     []float32
	u16     []uint16
	// Quantized (bits > 0): q is [out, in*bits/32] words, scales and
	// biases [out, in/gs] as float32.
	bits, gs       int
	q              []uint32
	scales, biases []float32
	// scales16, biases16 are the float16 originals when both are F16:
	// the fused decode kernels read them (exact widening, fewer bytes).
	scales16, biases16 []uint16
	wpr                int // words per row
	simd               bool
	// iq is set when the product takes the integer path (iq.go).
	iq *iqLayout
}

// halfFloats returns a 16-bit array's values as float32, memoized on the
// array (scales and biases are converted once, not once per step).
func halfFloats(a *Array) []float32 {
	if a.dt == engine.F32 && a.kv == nil {
		return a.f32
	}
	if a.memo == nil {
		a.memo = floats(a)
	}
	return a.memo
}

func (b *Backend) newWeight(l *engine.Linear) *weight {
	w := new(weight)
	b.setWeight(w, l)
	return w
}

// setWeight fills r from l for this backend's kernels (no allocation once
// l's scales and biases have been widened).
func (b *Backend) setWeight(r *weight, l *engine.Linear) {
	if l != nil && l.Mode == "mxfp4" {
		*r = *mxfp4Weight(l)
	} else {
		setWeight(r, l)
	}
	if b.iqEligible(r) {
		r.iq = iqLayoutFor(r, l)
	}
	r.simd = b.simd
}

func newWeight(l *engine.Linear) *weight {
	w := new(weight)
	setWeight(w, l)
	return w
}

func setWeight(r *weight, l *engine.Linear) {
	if l == nil || l.W == nil {
		panic("cpu: Linear without a weight")
	}
	w := arr(l.W)
	if len(w.shape) != 2 {
		panic(fmt.Sprintf("cpu: Linear weight of shape %v, want [out, in]", w.shape))
	}
	if l.Bits == 0 {
		*r = weight{out: w.shape[0], in: w.shape[1], dt: w.dt}
		switch w.dt {
		case engine.F32:
			r.f32 = w.f32
		case engine.F16, engine.BF16:
			r.u16 = w.u16
		default:
			panic(fmt.Sprintf("cpu: dense Linear weight of dtype %v", w.dt))
		}
		return
	}
	if w.dt != engine.U32 {
		panic(fmt.Sprintf("cpu: quantized Linear weight of dtype %v, want uint32", w.dt))
	}
	switch l.Bits {
	case 2, 4, 8:
	default:
		panic(fmt.Sprintf("cpu: quantized Linear with %d bits (want 2, 4 or 8)", l.Bits))
	}
	in := w.shape[1] * 32 / l.Bits
	if l.GroupSize <= 0 || in%l.GroupSize != 0 || l.GroupSize%(32/l.Bits) != 0 {
		panic(fmt.Sprintf("cpu: quantized Linear: group size %d for %d inputs", l.GroupSize, in))
	}
	if l.Scales == nil || l.Biases == nil {
		panic("cpu: quantized Linear without scales and biases")
	}
	s, bz := arr(l.Scales), arr(l.Biases)
	ng := in / l.GroupSize
	if numel(s.shape) != w.shape[0]*ng || numel(bz.shape) != w.shape[0]*ng {
		panic(fmt.Sprintf("cpu: quantized Linear: scales %v / biases %v for weight %v with group %d", s.shape, bz.shape, w.shape, l.GroupSize))
	}
	*r = weight{
		out: w.shape[0], in: in, bits: l.Bits, gs: l.GroupSize,
		q: w.u32, scales: halfFloats(s), biases: halfFloats(bz), wpr: w.shape[1],
	}
	if s.dt == engine.F16 && bz.dt == engine.F16 && s.kv == nil && bz.kv == nil {
		r.scales16, r.biases16 = s.u16, bz.u16
	}
}

// row writes weight row r as float32 into dst (len in).
func (w *weight) row(dst []float32, r int) {
	dst = dst[:w.in]
	if w.bits == 0 {
		switch w.dt {
		case engine.F32:
			copy(dst, w.f32[r*w.in:(r+1)*w.in])
		default:
			halfToF32(dst, w.u16[r*w.in:(r+1)*w.in], w.dt)
		}
		return
	}
	ng := w.in / w.gs
	words := w.q[r*w.wpr : (r+1)*w.wpr]
	sc := w.scales[r*ng : (r+1)*ng]
	bi := w.biases[r*ng : (r+1)*ng]
	if w.simd && w.gs%8 == 0 && (w.bits == 4 || w.bits == 8) {
		if w.bits == 4 {
			q4expandAVX(&words[0], &sc[0], &bi[0], ng, w.gs/8, &dst[0])
		} else {
			q8expandAVX(&words[0], &sc[0], &bi[0], ng, w.gs/8, &dst[0])
		}
		return
	}
	per := 32 / w.bits
	wpg := w.gs / per // words per group
	mask := uint32(1)<<w.bits - 1
	for g := range ng {
		s, b := sc[g], bi[g]
		gw := words[g*wpg : (g+1)*wpg]
		d := dst[g*w.gs : (g+1)*w.gs]
		switch w.bits {
		case 4:
			for k, u := range gw {
				o := d[k*8 : k*8+8 : k*8+8]
				o[0] = float32(s*float32(u&15)) + b
				o[1] = float32(s*float32(u>>4&15)) + b
				o[2] = float32(s*float32(u>>8&15)) + b
				o[3] = float32(s*float32(u>>12&15)) + b
				o[4] = float32(s*float32(u>>16&15)) + b
				o[5] = float32(s*float32(u>>20&15)) + b
				o[6] = float32(s*float32(u>>24&15)) + b
				o[7] = float32(s*float32(u>>28)) + b
			}
		case 8:
			for k, u := range gw {
				o := d[k*4 : k*4+4 : k*4+4]
				o[0] = float32(s*float32(u&255)) + b
				o[1] = float32(s*float32(u>>8&255)) + b
				o[2] = float32(s*float32(u>>16&255)) + b
				o[3] = float32(s*float32(u>>24)) + b
			}
		default:
			for k, u := range gw {
				for j := range per {
					d[k*per+j] = float32(s*float32(u>>(uint(j)*uint(w.bits))&mask)) + b
				}
			}
		}
	}
}

// rowF32 returns row r as float32: a slice of the weight when it is F32,
// else expanded into buf.
func (w *weight) rowF32(buf []float32, r int) []float32 {
	if w.bits == 0 && w.dt == engine.F32 {
		return w.f32[r*w.in : (r+1)*w.in : (r+1)*w.in]
	}
	w.row(buf, r)
	return buf[:w.in:w.in]
}

// Linear computes x @ Wᵀ (+ bias) for x [L, in] → [L, out].
func (b *Backend) Linear(x engine.Array, l *engine.Linear) engine.Array {
	w := &b.mm.wv
	b.setWeight(w, l)
	a := arr(x)
	if len(a.shape) != 2 || a.shape[1] != w.in {
		panic(fmt.Sprintf("cpu: Linear: x %v with weight [%d, %d]", a.shape, w.out, w.in))
	}
	xv := b.vals(a)
	res := b.newF32(a.shape[0], w.out)
	out := res.f32
	b.matmulT(out, xv, a.shape[0], w)
	if l.Bias != nil {
		bias := halfFloats(arr(l.Bias)) // a weight: widened once
		if len(bias) != w.out {
			panic(fmt.Sprintf("cpu: Linear: bias %v for %d outputs", arr(l.Bias).shape, w.out))
		}
		for i := 0; i < a.shape[0]; i++ {
			o := out[i*w.out : (i+1)*w.out]
			for j := range o {
				o[j] += bias[j]
			}
		}
	}
	*w = weight{} // drop the references to l's storage
	return res
}

// matmulT computes out [L, N] = x [L, K] · wᵀ on all threads.
func (b *Backend) matmulT(out, x []float32, L int, w *weight) {
	b.matmulTMode(out, x, L, w, b.canFuse(w) && L <= quantFusedMaxRows)
}

// canFuse reports whether a quantized weight has a fused kernel: 4 and
// 8 bits (AVX2 or Go).
func (b *Backend) canFuse(w *weight) bool {
	return w.gs%8 == 0 && (w.bits == 4 || w.bits == 8)
}

// matmulTExpand always expands weight rows (the benchmarks' comparison).
func (b *Backend) matmulTExpand(out, x []float32, L int, w *weight) {
	b.matmulTMode(out, x, L, w, false)
}

func (b *Backend) matmulTMode(out, x []float32, L int, w *weight, fused bool) {
	N, K := w.out, w.in
	t := &b.mm
	if w.iq != nil {
		t.acts.quantize(x[:L*K], L, K, w.bits == 4, b.simd)
		t.b, t.out, t.L, t.w, t.iq = b, out, L, w, true
		// Blocks of eight rows; at least ~64k multiply-adds per goroutine.
		b.run((N+7)/8, max(1, 65536/(8*K*max(L, 1))), t)
		t.out, t.w, t.iq = nil, nil, false
		return
	}
	blocks := (N + 3) / 4
	// Aim for at least ~64k multiply-adds per goroutine.
	minBlocks := max(1, 65536/(4*K*max(L, 1)))
	t.b, t.out, t.x, t.L, t.w, t.fused = b, out, x, L, w, fused
	b.run(blocks, minBlocks, t)
	t.out, t.x, t.w = nil, nil, nil
}

// matmulTask is matmulTMode's work over blocks of four weight rows; the
// Backend owns one, reused by every product.
type matmulTask struct {
	b      *Backend
	out, x []float32
	L      int
	w      *weight
	fused  bool
	iq     bool // w.iq != nil: acts holds x quantized (iq.go)
	acts   iqActs
	wv     weight // Linear's weight, prepared in place
	mw     weight // MatMul's right operand, transposed
	// bufs holds the expand path's per-range buffers of 4·K floats.
	mu   sync.Mutex
	bufs [][]float32
}

func (t *matmulTask) buf(n int) []float32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, s := range t.bufs {
		if cap(s) >= n {
			t.bufs = append(t.bufs[:i], t.bufs[i+1:]...)
			return s[:n]
		}
	}
	return make([]float32, n)
}

func (t *matmulTask) putBuf(s []float32) {
	t.mu.Lock()
	t.bufs = append(t.bufs, s)
	t.mu.Unlock()
}

func (t *matmulTask) run(lo, hi int) {
	b, out, x, L, w, fused := t.b, t.out, t.x, t.L, t.w, t.fused
	N, K := w.out, w.in
	if t.iq {
		var buf []float32
		if L >= iqGemmMinRows {
			buf = t.buf(iqUnpackFloats(w))
		}
		b.iqRows(out, &t.acts, L, w, lo, hi, buf)
		if buf != nil {
			t.putBuf(buf)
		}
		return
	}
	{
		if fused && !b.simd {
			for blk := lo; blk < hi; blk++ {
				j := blk * 4
				nv := min(4, N-j)
				for i := range L {
					var r [4]float32
					qdot4Rows(&r, x[i*K:(i+1)*K], w, [4]int{j, min(j+1, N-1), min(j+2, N-1), min(j+3, N-1)})
					for k := range nv {
						out[i*N+j+k] = r[k]
					}
				}
			}
			return
		}
		if fused {
			for j := lo * 4; j < min(hi*4, N); j++ {
				if j%4 == 0 && j+4 <= N {
					for i := range L {
						var r [4]float32
						b.qdot4(&r, x[i*K:(i+1)*K], w, j)
						out[i*N+j], out[i*N+j+1], out[i*N+j+2], out[i*N+j+3] = r[0], r[1], r[2], r[3]
					}
					j += 3
					continue
				}
				for i := range L {
					out[i*N+j] = b.qdot(x[i*K:(i+1)*K], w, j)
				}
			}
			return
		}
		buf := t.buf(4 * K)
		b.gemmBlocks(out, x, L, w, lo, hi, buf)
		t.putBuf(buf)
	}
}

// gemmBlocks computes out [L, N] = x [L, K] · wᵀ for the weight rows in
// blocks [lo, hi) of four, on the calling goroutine; buf holds 4·K floats.
func (b *Backend) gemmBlocks(out, x []float32, L int, w *weight, lo, hi int, buf []float32) {
	N, K := w.out, w.in
	for blk := lo; blk < hi; blk++ {
		j := blk * 4
		// A last partial block repeats its last row, so every output is
		// computed by the same kernel (results do not depend on N).
		nv := min(4, N-j)
		w0 := w.rowF32(buf[0:K], j)
		w1 := w.rowF32(buf[K:2*K], min(j+1, N-1))
		w2 := w.rowF32(buf[2*K:3*K], min(j+2, N-1))
		w3 := w.rowF32(buf[3*K:4*K], min(j+3, N-1))
		i := 0
		if b.simd && nv == 4 && K%8 == 0 && L >= 3 {
			t := L / 3
			gemm3x4AVX(&x[0], 4*K, t, &w0[0], &w1[0], &w2[0], &w3[0], K, &out[j], 4*N)
			i = 3 * t
		}
		for ; i+2 <= L; i += 2 {
			x0 := x[i*K : (i+1)*K : (i+1)*K]
			x1 := x[(i+1)*K : (i+2)*K : (i+2)*K]
			var r [8]float32
			b.block2x4(&r, x0, x1, w0, w1, w2, w3)
			o0 := out[i*N+j : i*N+j+nv]
			o1 := out[(i+1)*N+j : (i+1)*N+j+nv]
			for k := range o0 {
				o0[k], o1[k] = r[k], r[4+k]
			}
		}
		for ; i < L; i++ {
			xi := x[i*K : (i+1)*K : (i+1)*K]
			var r [4]float32
			b.block1x4(&r, xi, w0, w1, w2, w3)
			o := out[i*N+j : i*N+j+nv]
			for k := range o {
				o[k] = r[k]
			}
		}
	}
}

// qdot is dot(x, row j of a quantized weight) without expanding the row
// to memory. It widens each weight exactly as row() does and accumulates in
// block1x4's order, so its result equals the expand path's bit for bit:
// the KV a prompt produces does not depend on how it was chunked.
func (b *Backend) qdot(x []float32, w *weight, j int) float32 {
	ng := w.in / w.gs
	words := w.q[j*w.wpr : (j+1)*w.wpr]
	sc := w.scales[j*ng : (j+1)*ng]
	bi := w.biases[j*ng : (j+1)*ng]
	x = x[:w.in]
	if !b.simd {
		return qdotScalar(x, words, sc, bi, w.bits, w.gs)
	}
	var acc [8]float32
	if w.bits == 4 {
		q4dotAVX(&x[0], &words[0], &sc[0], &bi[0], ng, w.gs/8, &acc)
	} else {
		q8dotAVX(&x[0], &words[0], &sc[0], &bi[0], ng, w.gs/8, &acc)
	}
	return hsum8(acc[:])
}

// qdot4Rows is qdotScalar for four weight rows at once (independent
// running sums, so the additions overlap), unrolled for 4 and 8 bits. Each
// row's result equals qdotScalar's bit for bit.
func qdot4Rows(r *[4]float32, x []float32, w *weight, rows [4]int) {
	ng := w.in / w.gs
	x = x[:w.in]
	var words [4][]uint32
	var sc, bi [4][]float32
	for k, j := range rows {
		words[k] = w.q[j*w.wpr : (j+1)*w.wpr]
		sc[k] = w.scales[j*ng : (j+1)*ng]
		bi[k] = w.biases[j*ng : (j+1)*ng]
	}
	var a0, a1, a2, a3 float32
	switch w.bits {
	case 4:
		wpg := w.gs / 8
		for g := range ng {
			s0, s1, s2, s3 := sc[0][g], sc[1][g], sc[2][g], sc[3][g]
			b0, b1, b2, b3 := bi[0][g], bi[1][g], bi[2][g], bi[3][g]
			for k := g * wpg; k < (g+1)*wpg; k++ {
				u0, u1, u2, u3 := words[0][k], words[1][k], words[2][k], words[3][k]
				xs := x[k*8 : k*8+8 : k*8+8]
				for e := range 8 {
					sh := uint(4 * e)
					v := xs[e]
					a0 += float32((float32(s0*float32(u0>>sh&15)) + b0) * v)
					a1 += float32((float32(s1*float32(u1>>sh&15)) + b1) * v)
					a2 += float32((float32(s2*float32(u2>>sh&15)) + b2) * v)
					a3 += float32((float32(s3*float32(u3>>sh&15)) + b3) * v)
				}
			}
		}
	case 8:
		wpg := w.gs / 4
		for g := range ng {
			s0, s1, s2, s3 := sc[0][g], sc[1][g], sc[2][g], sc[3][g]
			b0, b1, b2, b3 := bi[0][g], bi[1][g], bi[2][g], bi[3][g]
			for k := g * wpg; k < (g+1)*wpg; k++ {
				u0, u1, u2, u3 := words[0][k], words[1][k], words[2][k], words[3][k]
				xs := x[k*4 : k*4+4 : k*4+4]
				for e := range 4 {
					sh := uint(8 * e)
					v := xs[e]
					a0 += float32((float32(s0*float32(u0>>sh&255)) + b0) * v)
					a1 += float32((float32(s1*float32(u1>>sh&255)) + b1) * v)
					a2 += float32((float32(s2*float32(u2>>sh&255)) + b2) * v)
					a3 += float32((float32(s3*float32(u3>>sh&255)) + b3) * v)
				}
			}
		}
	default:
		for k, j := range rows {
			r[k] = qdotScalar(x, w.q[j*w.wpr:(j+1)*w.wpr], w.scales[j*ng:(j+1)*ng], w.biases[j*ng:(j+1)*ng], w.bits, w.gs)
		}
		return
	}
	r[0], r[1], r[2], r[3] = a0, a1, a2, a3
}

// qdot4 is qdot for rows j..j+3 on the four-row AVX2 kernels (identical
// results per row, several times the throughput of one row at a time).
func (b *Backend) qdot4(r *[4]float32, x []float32, w *weight, j int) {
	ng := w.in / w.gs
	x = x[:w.in]
	_ = w.q[(j+4)*w.wpr-1]
	_ = w.scales[(j+4)*ng-1]
	_ = w.biases[(j+4)*ng-1]
	var acc [32]float32
	if halfSIMD && w.scales16 != nil {
		_ = w.scales16[(j+4)*ng-1]
		_ = w.biases16[(j+4)*ng-1]
		if w.bits == 4 {
			q4dot4HAVX(&x[0], &w.q[j*w.wpr], 4*w.wpr, &w.scales16[j*ng], &w.biases16[j*ng], 2*ng, ng, w.gs/8, &acc)
		} else {
			q8dot4HAVX(&x[0], &w.q[j*w.wpr], 4*w.wpr, &w.scales16[j*ng], &w.biases16[j*ng], 2*ng, ng, w.gs/8, &acc)
		}
	} else if w.bits == 4 {
		q4dot4AVX(&x[0], &w.q[j*w.wpr], 4*w.wpr, &w.scales[j*ng], &w.biases[j*ng], 4*ng, ng, w.gs/8, &acc)
	} else {
		q8dot4AVX(&x[0], &w.q[j*w.wpr], 4*w.wpr, &w.scales[j*ng], &w.biases[j*ng], 4*ng, ng, w.gs/8, &acc)
	}
	for k := range 4 {
		r[k] = hsum8(acc[k*8:])
	}
}

// qdotScalar is qdot in Go: w = s·q + b then a single running sum in
// element order, the explicit conversions ruling out fused multiply-adds so
// it rounds like row() followed by dot1x4.
func qdotScalar(x []float32, words []uint32, sc, bi []float32, bits, gs int) float32 {
	per := 32 / bits
	mask := uint32(1)<<bits - 1
	wpg := gs / per
	var acc float32
	for g := range sc {
		s, bz := sc[g], bi[g]
		gx := x[g*gs : (g+1)*gs]
		for k, u := range words[g*wpg : (g+1)*wpg] {
			xs := gx[k*per : (k+1)*per]
			for e := range xs {
				wv := float32(s*float32(u>>(uint(e)*uint(bits))&mask)) + bz
				acc += float32(wv * xs[e])
			}
		}
	}
	return acc
}

// hsum8 adds the 8 lanes of a SIMD accumulator in the order the assembly
// reduction in gemm3x4AVX uses (high half onto low half, then pairwise), so
// every kernel rounds alike.
func hsum8(s []float32) float32 {
	s = s[:8]
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

// block2x4 is dot2x4 on the AVX2 kernel when the backend may use it.
func (b *Backend) block2x4(r *[8]float32, x0, x1, w0, w1, w2, w3 []float32) {
	n := len(x0)
	if !b.simd || n < 8 {
		dot2x4(r, x0, x1, w0, w1, w2, w3)
		return
	}
	x1, w0, w1, w2, w3 = x1[:n], w0[:n], w1[:n], w2[:n], w3[:n]
	n8 := n &^ 7
	var acc [64]float32
	dot2x4AVX(&x0[0], &x1[0], &w0[0], &w1[0], &w2[0], &w3[0], n8, &acc)
	for p := range 8 {
		r[p] = hsum8(acc[p*8:])
	}
	for i := n8; i < n; i++ {
		a, c := x0[i], x1[i]
		r[0] += a * w0[i]
		r[1] += a * w1[i]
		r[2] += a * w2[i]
		r[3] += a * w3[i]
		r[4] += c * w0[i]
		r[5] += c * w1[i]
		r[6] += c * w2[i]
		r[7] += c * w3[i]
	}
}

// block1x4 is dot1x4 on the AVX2 kernel when the backend may use it.
func (b *Backend) block1x4(r *[4]float32, x, w0, w1, w2, w3 []float32) {
	n := len(x)
	if !b.simd || n < 8 {
		dot1x4(r, x, w0, w1, w2, w3)
		return
	}
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	n8 := n &^ 7
	var acc [32]float32
	dot1x4AVX(&x[0], &w0[0], &w1[0], &w2[0], &w3[0], n8, &acc)
	for p := range 4 {
		r[p] = hsum8(acc[p*8:])
	}
	for i := n8; i < n; i++ {
		a := x[i]
		r[0] += a * w0[i]
		r[1] += a * w1[i]
		r[2] += a * w2[i]
		r[3] += a * w3[i]
	}
}

// dot1x4 computes r[k] = dot(x, wk) for four weight rows.
func dot1x4(r *[4]float32, x, w0, w1, w2, w3 []float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var s0, s1, s2, s3 float32
	for i, v := range x {
		s0 += float32(v * w0[i])
		s1 += float32(v * w1[i])
		s2 += float32(v * w2[i])
		s3 += float32(v * w3[i])
	}
	r[0], r[1], r[2], r[3] = s0, s1, s2, s3
}

// dot2x4 computes the 2×4 block r[i*4+k] = dot(xi, wk).
func dot2x4(r *[8]float32, x0, x1, w0, w1, w2, w3 []float32) {
	n := len(x0)
	x1 = x1[:n]
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var s00, s01, s02, s03, s10, s11, s12, s13 float32
	for i, a := range x0 {
		c := x1[i]
		v0, v1, v2, v3 := w0[i], w1[i], w2[i], w3[i]
		s00 += float32(a * v0)
		s01 += float32(a * v1)
		s02 += float32(a * v2)
		s03 += float32(a * v3)
		s10 += float32(c * v0)
		s11 += float32(c * v1)
		s12 += float32(c * v2)
		s13 += float32(c * v3)
	}
	r[0], r[1], r[2], r[3] = s00, s01, s02, s03
	r[4], r[5], r[6], r[7] = s10, s11, s12, s13
}

// MatMul is a batched matmul a [..., M, K] @ b [..., K, N]; b's leading
// axes must equal a's or be absent.
func (b *Backend) MatMul(x, y engine.Array) engine.Array {
	a, c := materialize(arr(x)), materialize(arr(y))
	if len(a.shape) < 2 || len(c.shape) < 2 {
		panic(fmt.Sprintf("cpu: MatMul: %v @ %v", a.shape, c.shape))
	}
	M, K := a.shape[len(a.shape)-2], a.shape[len(a.shape)-1]
	K2, N := c.shape[len(c.shape)-2], c.shape[len(c.shape)-1]
	lead := a.shape[:len(a.shape)-2]
	clead := c.shape[:len(c.shape)-2]
	if K != K2 || (len(clead) > 0 && !slices.Equal(lead, clead)) {
		panic(fmt.Sprintf("cpu: MatMul: %v @ %v", a.shape, c.shape))
	}
	batches := numel(lead)
	av, cv := floats(a), floats(c)
	var shb [maxFastDims]int
	shape := append(append(shb[:0], lead...), M, N)
	res := b.newF32(shape...)
	out := res.f32
	ct := b.floats(N * K)
	for bt := range batches {
		cb := cv
		if len(clead) > 0 {
			cb = cv[bt*K*N : (bt+1)*K*N]
		}
		// Transpose this batch of c to [N, K] so rows are contiguous.
		for k := range K {
			for n := range N {
				ct[n*K+k] = cb[k*N+n]
			}
		}
		w := &b.mm.mw
		*w = weight{out: N, in: K, dt: engine.F32, f32: ct}
		b.matmulT(out[bt*M*N:(bt+1)*M*N], av[bt*M*K:(bt+1)*M*K], M, w)
		*w = weight{}
	}
	return res
}
