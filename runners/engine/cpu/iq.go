package cpu

import (
	"math"
	"unsafe"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// Integer products for affine-quantized weights.
//
// A decode step of a quantized model is a chain of matrix-vector products
// whose cost is reading the packed weights and turning them into products.
// Widening every weight to float32 (the float path in matmul.go) costs
// about five vector instructions per eight weights, which makes a decode
// step compute-bound at half the memory bandwidth of a core. llama.cpp
// quantizes the activations to int8 instead; that is cheap but moves
// SmolLM2's logits visibly (cosine 0.993 against exact arithmetic on one
// of the reference prompts, and "capital of France" no longer answered
// Paris). This file quantizes them to int16, 256 times finer, and
// multiplies 16-bit integers (VPMADDWD: 16 pairs per instruction) — for
// MLX-affine 4- and 8-bit weights whose group size is a multiple of 32:
//
//   - each input row x is cut into blocks of 32 and quantized:
//     d = max|x|/32767, q = round-half-even(x · (32767/max|x|)), and the
//     block's s = d · Σq;
//   - for weight row j with scale sc and bias bi in the group holding block
//     k, the exact integer Σ w·q is formed, and the row's accumulator does,
//     in float32 with every product and sum rounded on its own (no fused
//     multiply-add):   acc = acc + float32(Σ w·q)·(sc·d);  acc = acc + bi·s
//     block after block, from 0.
//
// Every kernel here (the AVX2 and AVX-512 VNNI ones, eight weight rows at
// a time; the 512-bit VNNI gemm, sixteen; the Go one, one row) computes
// exactly this, so a row's result does not
// depend on how many input rows are multiplied at once, which kernel ran,
// or the thread count: the chunk-invariance, batched = alone and remote =
// local guarantees of matmul.go hold unchanged. The integer sums are exact
// (|Σ w·q| < 2³¹), so the order in which the kernels add products does not
// matter.
//
// Which kernel runs: one input row (a decode step) or two take the
// one-row kernels, which widen the packed words in registers; from three
// rows on (a prompt, a batch, a speculative step verifying drafts) the
// weight rows are unpacked to int16 once and every input row runs over
// them — sixteen rows at a time on 512-bit registers where the machine has
// AVX-512 VNNI (1.1–1.6× less CPU time per row than eight at a time for
// 3–17 rows, more with more rows: BenchmarkSmallM in docs/BENCHMARKS.md),
// 4-bit rows unpacked with VBMI byte permutes where it has those, and the
// next group's words prefetched while the gemm runs over this one's (a
// model's weights are not in the core's caches: without it a step of 3–9
// positions spent a quarter of its time waiting on them,
// BenchmarkSmolLM2StepPositions).
//
// Against float arithmetic on the dequantized weights the result moves by
// the activation rounding: at most half a step of max|x|/32767 per element.
// Backend.iq turns the path off (the float kernels then run, as before).

// iqBlock is the activation block length, iqMax the largest |q|.
const (
	iqBlock = 32
	iqMax   = 32767
)

// iqLayout is a weight's scales and biases regrouped for the eight-row
// kernel: for row block rb (rows 8rb..8rb+7) and group g, the eight rows'
// values are consecutive at (rb·ng + g)·8. A last partial row block repeats
// its last row. F16 scales and biases stay F16, and so do float32 ones
// that are all float16 values (the kernel widens them exactly); others are
// float32.
type iqLayout struct {
	scales, biases engine.Array // the arrays it was made from
	s16, b16       []uint16
	s32, b32       []float32
	// negzp ≠ 0: the weight is symmetric, every bias exactly scale·negzp
	// with negzp = −2^k (Q8_0: −128, Q4_0: −8), and b16 is nil: the
	// kernels form each bias in registers (the same value, exactly) and
	// read one float16 per group instead of two — a decode step of an
	// 8-bit model reads 34 bytes per 32 weights instead of 36.
	negzp float32
}

// iqEligible reports whether w takes the integer path.
func (b *Backend) iqEligible(w *weight) bool {
	return b.iq && (w.bits == 4 || w.bits == 8) && w.gs%iqBlock == 0 && w.in%iqBlock == 0
}

// iqLayoutFor returns l's regrouped scales, memoized on its weight array.
func iqLayoutFor(w *weight, l *engine.Linear) *iqLayout {
	a := arr(l.W)
	if m := a.iq; m != nil && m.scales == l.Scales && m.biases == l.Biases {
		return m
	}
	m := newIQLayout(w)
	m.scales, m.biases = l.Scales, l.Biases
	a.iq = m
	return m
}

// newIQLayout regroups w's scales and biases.
func newIQLayout(w *weight) *iqLayout {
	ng := w.in / w.gs
	rb := (w.out + 7) / 8
	m := new(iqLayout)
	s16, b16 := w.scales16, w.biases16
	if s16 == nil {
		s16, b16 = exactHalves(w.scales), exactHalves(w.biases)
	}
	if s16 != nil && b16 != nil {
		m.s16 = make([]uint16, rb*ng*8)
		m.negzp = symmetricZero(s16, b16, w.bits)
		if m.negzp == 0 {
			m.b16 = make([]uint16, rb*ng*8)
		}
	} else {
		m.s32 = make([]float32, rb*ng*8)
		m.b32 = make([]float32, rb*ng*8)
	}
	for j := range rb * 8 {
		r := min(j, w.out-1)
		for g := range ng {
			at := ((j/8)*ng+g)*8 + j%8
			if m.s16 != nil {
				m.s16[at] = s16[r*ng+g]
				if m.b16 != nil {
					m.b16[at] = b16[r*ng+g]
				}
			} else {
				m.s32[at], m.b32[at] = w.scales[r*ng+g], w.biases[r*ng+g]
			}
		}
	}
	return m
}

// symmetricZero returns −zp when every float16 bias equals its scale times
// −zp, bit for bit in float32, for one power of two zp ≤ 2^bits (the
// product is then exact, so a kernel forming it gets the stored value);
// else 0.
func symmetricZero(s16, b16 []uint16, bits int) float32 {
	var negzp float32
	for g, h := range s16 {
		if sc, bi := half.F16ToF32(h), half.F16ToF32(b16[g]); sc != 0 && bi != 0 {
			negzp = bi / sc
			break
		}
	}
	if fr, _ := math.Frexp(float64(-negzp)); !(negzp < 0) || fr != 0.5 || float64(-negzp) > math.Ldexp(1, bits) {
		return 0 // none, or not minus a power of two
	}
	for g, h := range s16 {
		if math.Float32bits(half.F16ToF32(h)*negzp) != math.Float32bits(half.F16ToF32(b16[g])) {
			return 0
		}
	}
	return negzp
}

// exactHalves returns v as float16 when every value converts exactly (a
// GGUF embedding's float32 scales are float16 values: half the bytes to
// read per step), else nil.
func exactHalves(v []float32) []uint16 {
	out := make([]uint16, len(v))
	for i, x := range v {
		h := half.F32ToF16(x)
		if half.F16ToF32(h) != x || x != x {
			return nil
		}
		out[i] = h
	}
	return out
}

// iqActs is one product's quantized input rows: q [L, K] (for 4-bit
// weights each block is stored even elements first, then odd ones, the
// order the kernels unpack nibbles in) and m [L, K/32].
type iqActs struct {
	q []int16
	m []iqMeta
}

// iqMeta is one activation block's step d and d·Σq; sum and nan are
// iqquantAVX's scratch.
type iqMeta struct {
	d, s float32
	sum  int32
	nan  int32
}

// quantize fills a from x [L, K].
func (a *iqActs) quantize(x []float32, L, K int, nibbleOrder bool, simd bool) {
	nb := K / iqBlock
	a.q = grow(a.q, L*K)
	a.m = grow(a.m, L*nb)
	if simd {
		nib := 0
		if nibbleOrder {
			nib = 1
		}
		iqquantAVX(&x[0], L*nb, &a.q[0], &a.m[0], nib)
		for i := range a.m {
			m := &a.m[i]
			amax, sum := m.d, m.sum
			if m.nan != 0 || !(amax > 0) || math.IsInf(float64(amax), 0) {
				// Zero or not finite: the Go definition decides.
				d, sum := quantizeBlock(a.q[i*iqBlock:(i+1)*iqBlock], x[i*iqBlock:(i+1)*iqBlock], nibbleOrder)
				*m = iqMeta{d: d, s: d * float32(sum)}
				continue
			}
			d := amax / iqMax
			*m = iqMeta{d: d, s: d * float32(sum)}
		}
		return
	}
	for i := range L * nb {
		xs := x[i*iqBlock : (i+1)*iqBlock : (i+1)*iqBlock]
		q := a.q[i*iqBlock : (i+1)*iqBlock : (i+1)*iqBlock]
		d, sum := quantizeBlock(q, xs, nibbleOrder)
		a.m[i] = iqMeta{d: d, s: d * float32(sum)}
	}
}

// quantizeBlock quantizes 32 values into q, returning the step d and Σq.
func quantizeBlock(q []int16, xs []float32, nibbleOrder bool) (float32, int32) {
	var amax float32
	for _, v := range xs {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	if !(amax > 0) || math.IsInf(float64(amax), 0) {
		// Zero (or not finite: the product is meaningless anyway).
		clear(q)
		if amax > 0 || amax != amax {
			return float32(math.NaN()), 0
		}
		return 0, 0
	}
	id := iqMax / amax
	var sum int32
	for e, v := range xs {
		r := int32(math.RoundToEven(float64(v * id)))
		r = min(max(r, -iqMax), iqMax)
		sum += r
		p := e
		if nibbleOrder {
			p = e>>1 + 16*(e&1)
		}
		q[p] = int16(r)
	}
	return amax / iqMax, sum
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// iqdotRow is the Go kernel: row j of w against quantized row i of a.
func iqdotRow(a *iqActs, i int, w *weight, j int) float32 {
	K := w.in
	nb := K / iqBlock
	ng := K / w.gs
	bpg := w.gs / iqBlock
	q := a.q[i*K : (i+1)*K]
	meta := a.m[i*nb : (i+1)*nb]
	words := w.q[j*w.wpr : (j+1)*w.wpr]
	sc, bi := w.scales[j*ng:(j+1)*ng], w.biases[j*ng:(j+1)*ng]
	var acc float32
	for k := range nb {
		xq := q[k*iqBlock : (k+1)*iqBlock : (k+1)*iqBlock]
		var isum int32
		if w.bits == 4 {
			for wi, u := range words[k*4 : k*4+4] {
				for e := range 8 {
					n := wi*8 + e
					isum += int32(u>>(4*uint(e))&15) * int32(xq[n>>1+16*(n&1)])
				}
			}
		} else {
			for wi, u := range words[k*8 : k*8+8] {
				for e := range 4 {
					isum += int32(u>>(8*uint(e))&255) * int32(xq[wi*4+e])
				}
			}
		}
		g := k / bpg
		t := float32(sc[g] * meta[k].d)
		acc = float32(acc + float32(float32(isum)*t))
		acc = float32(acc + float32(bi[g]*meta[k].s))
	}
	return acc
}

// iqRows computes out[i, j] for rows i < L and weight rows j in blocks
// [lo, hi) of eight; buf is scratch of at least iqUnpackFloats(w) floats
// when L ≥ iqGemmMinRows.
func (b *Backend) iqRows(out []float32, a *iqActs, L int, w *weight, lo, hi int, buf []float32) {
	N, K := w.out, w.in
	nb := K / iqBlock
	ng := K / w.gs
	m := w.iq
	var res [8]float32
	for blk := lo; blk < hi; blk++ {
		j := blk * 8
		if !b.simd || j+8 > N {
			for r := j; r < min(j+8, N); r++ {
				for i := range L {
					out[i*N+r] = iqdotRow(a, i, w, r)
				}
			}
			continue
		}
		so := blk * ng * 8
		p := iqArgs{
			m: &a.m[0], nblk: nb, words: &w.q[j*w.wpr], wstride: 4 * w.wpr, bpg: w.gs / iqBlock,
		}
		_ = w.q[(j+8)*w.wpr-1]
		switch {
		case m.negzp != 0:
			_ = m.s16[so+ng*8-1]
			p.sc, p.bi, p.half, p.negzp = unsafe.Pointer(&m.s16[so]), unsafe.Pointer(&m.s16[so]), 2, m.negzp
		case m.s16 != nil:
			_ = m.s16[so+ng*8-1]
			p.sc, p.bi, p.half = unsafe.Pointer(&m.s16[so]), unsafe.Pointer(&m.b16[so]), 1
		default:
			_ = m.s32[so+ng*8-1]
			p.sc, p.bi = unsafe.Pointer(&m.s32[so]), unsafe.Pointer(&m.b32[so])
		}
		if b.zmm && L >= iqGemmMinRows && blk+1 < hi && j+16 <= N {
			// Sixteen rows (this block and the next) on 512-bit
			// registers: twice the work per instruction of the eight-row
			// gemm below, the same bits.
			_ = w.q[(j+16)*w.wpr-1]
			if m.s16 != nil {
				_ = m.s16[so+2*ng*8-1]
				p.sstride = 2 * ng * 8
			} else {
				_ = m.s32[so+2*ng*8-1]
				p.sstride = 4 * ng * 8
			}
			w16 := buf[:iqUnpackFloats(w)]
			w8 := (*int16)(unsafe.Pointer(&w16[0]))
			second := (*int16)(unsafe.Pointer(&w16[8])) // 32 bytes on: rows j+8..j+15
			p.w8, p.ldo, p.rowblk = w8, 4*N, nb
			// A run of blocks at a time (whole groups), so that the
			// unpacked rows stay in the first-level cache for the gemm.
			bpg := w.gs / iqBlock
			run := max(bpg, iqWideRun/bpg*bpg)
			sc, bi := p.sc, p.bi
			// The unpacking prefetches the next group's words (a prefetch
			// past the weight's end, for its last group, is harmless).
			ahead := 16 * p.wstride
			for k0 := 0; k0 < nb; k0 += run {
				n := min(run, nb-k0)
				words := k0 * w.bits // a block is 32 values of w.bits bits
				switch {
				case b.vbmi && w.bits == 4:
					q4i16unpack8TWVBMI(&w.q[j*w.wpr+words], p.wstride, n, w8, ahead)
					q4i16unpack8TWVBMI(&w.q[(j+8)*w.wpr+words], p.wstride, n, second, ahead)
				case w.bits == 4:
					q4i16unpack8TWAVX(&w.q[j*w.wpr+words], p.wstride, n, w8, ahead)
					q4i16unpack8TWAVX(&w.q[(j+8)*w.wpr+words], p.wstride, n, second, ahead)
				default:
					q8i16unpack8TWAVX(&w.q[j*w.wpr+words], p.wstride, n, w8, ahead)
					q8i16unpack8TWAVX(&w.q[(j+8)*w.wpr+words], p.wstride, n, second, ahead)
				}
				// Group k0/bpg's eight scales: 8 values on per group.
				at := uintptr(k0/bpg) * 8 * uintptr(p.sstride/(ng*8))
				p.sc, p.bi = unsafe.Add(sc, at), unsafe.Add(bi, at)
				p.nblk, p.cont = n, min(k0, 1)
				iqGemmZ(&p, a, L, K, N, j, k0, out)
			}
			blk++
			continue
		}
		if L < iqGemmMinRows {
			for i := range L {
				p.x, p.m = &a.q[i*K], &a.m[i*nb]
				switch {
				case w.bits == 4 && b.vnni:
					q4i16dot8VNNI(&p, &res)
				case w.bits == 4:
					q4i16dot8AVX(&p, &res)
				case b.vnni:
					q8i16dot8VNNI(&p, &res)
				default:
					q8i16dot8AVX(&p, &res)
				}
				copy(out[i*N+j:i*N+j+8], res[:])
			}
			continue
		}
		// Several rows: unpack the eight weight rows once, then run every
		// input row over them.
		w16 := buf[:iqUnpackFloats(w)]
		w8 := (*int16)(unsafe.Pointer(&w16[0]))
		p.w8, p.ldo = w8, 4*N
		// The unpacking prefetches the next group's words (past the
		// weight's end for its last group: harmless).
		ahead := 8 * p.wstride
		if b.vnni {
			if w.bits == 4 {
				q4i16unpack8TAVX(p.words, p.wstride, nb, w8, ahead)
			} else {
				q8i16unpack8TAVX(p.words, p.wstride, nb, w8, ahead)
			}
			iqGemmT(&p, a, L, K, N, j, out)
			continue
		}
		if w.bits == 4 {
			q4i16unpack8AVX(p.words, p.wstride, nb, w8, ahead)
		} else {
			q8i16unpack8AVX(p.words, p.wstride, nb, w8, ahead)
		}
		for i0 := 0; i0 < L; i0 += iqGemmTile {
			p.x, p.m, p.rows, p.out = &a.q[i0*K], &a.m[i0*nb], min(iqGemmTile, L-i0), &out[i0*N+j]
			_ = out[(i0+p.rows-1)*N+j+7]
			i16gemm8AVX(&p)
		}
	}
}

// iqGemmT runs the VNNI gemm over all L input rows, eight at a time, for
// the eight weight rows from j that p describes (unpacked interleaved).
func iqGemmT(p *iqArgs, a *iqActs, L, K, N, j int, out []float32) {
	nb := K / iqBlock
	for i0 := 0; i0 < L; i0 += 8 {
		n := min(8, L-i0)
		p.x, p.m, p.out = &a.q[i0*K], &a.m[i0*nb], &out[i0*N+j]
		_ = out[(i0+n-1)*N+j+7]
		_ = a.q[(i0+n)*K-1]
		switch n {
		case 8:
			i16gemm8x8VNNI(p)
		case 7:
			i16gemm8x7VNNI(p)
		case 6:
			i16gemm8x6VNNI(p)
		case 5:
			i16gemm8x5VNNI(p)
		case 4:
			i16gemm8x4VNNI(p)
		case 3:
			i16gemm8x3VNNI(p)
		case 2:
			i16gemm8x2VNNI(p)
		default:
			i16gemm8x1VNNI(p)
		}
	}
}

// iqGemmZ is iqGemmT for the sixteen weight rows from j on 512-bit
// registers (p describes them, unpacked by the TW variants), over the
// p.nblk blocks from block k0 of each input row.
func iqGemmZ(p *iqArgs, a *iqActs, L, K, N, j, k0 int, out []float32) {
	nb := K / iqBlock
	for i0 := 0; i0 < L; i0 += 8 {
		n := min(8, L-i0)
		p.x, p.m, p.out = &a.q[i0*K+k0*iqBlock], &a.m[i0*nb+k0], &out[i0*N+j]
		_ = out[(i0+n-1)*N+j+15]
		_ = a.q[(i0+n)*K-1]
		switch n {
		case 8:
			i16gemm16x8VNNI(p)
		case 7:
			i16gemm16x7VNNI(p)
		case 6:
			i16gemm16x6VNNI(p)
		case 5:
			i16gemm16x5VNNI(p)
		case 4:
			i16gemm16x4VNNI(p)
		case 3:
			i16gemm16x3VNNI(p)
		case 2:
			i16gemm16x2VNNI(p)
		default:
			i16gemm16x1VNNI(p)
		}
	}
}

// iqGemmMinRows is the row count from which iqRows unpacks weights first
// (two rows run as fast on the one-row kernel: BenchmarkSmallM);
// iqGemmTile bounds the input rows run over them in one pass (their int16
// data stays in the core's cache).
const (
	iqGemmMinRows = 3
	// iqWideRun is how many blocks the 512-bit gemm unpacks at a time
	// (16 rows × 12 blocks × 64 bytes = 12 KiB).
	iqWideRun  = 12
	iqGemmTile = 128
)

// iqUnpackFloats is the scratch iqRows needs for sixteen unpacked rows, in
// float32s.
func iqUnpackFloats(w *weight) int {
	return 16 * (w.in / iqBlock) * 64 / 4 // 32 int16 per row and block
}

// iqArgs is the kernels' argument block (one pointer crosses into the
// assembly; field offsets are fixed there).
type iqArgs struct {
	x       *int16         // 0: quantized row
	m       *iqMeta        // 8: its blocks' metadata
	nblk    int            // 16
	words   *uint32        // 24: row j's words
	wstride int            // 32: bytes from one row's words to the next
	sc, bi  unsafe.Pointer // 40, 48: regrouped scales and biases at (rb, 0)
	half    int            // 56: 1 when sc, bi are float16
	bpg     int            // 64: blocks per group
	// The gemm kernels only:
	rows int      // 72: input rows (x and m advance through them; i16gemm8AVX only)
	out  *float32 // 80: row 0's eight results
	ldo  int      // 88: bytes between rows of out
	w8   *int16   // 96: the unpacked weight rows
	// negzp is −zp when half is 2: every bias is scale·(−zp) (iqLayout).
	negzp float32 // 104
	// sstride is the bytes from one group of eight rows' scales and biases
	// to the next (the 512-bit gemm only).
	sstride int // 112
	// rowblk is the blocks in an input row (nblk is how many the kernel
	// runs); cont ≠ 0: go on from the sums in out (the 512-bit gemm only).
	rowblk int // 120
	cont   int // 128
}
