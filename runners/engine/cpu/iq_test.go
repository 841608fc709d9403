package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// iqLinear builds a quantized Linear [N, K] with scales of dtype sdt.
func iqLinear(b *Backend, r *rand.Rand, N, K, bits, gs int, sdt engine.DType) (*engine.Linear, []float32) {
	return iqLinearSym(b, r, N, K, bits, gs, sdt, false)
}

// iqLinearSym is iqLinear with, when sym, every bias set to −2^(bits−1)
// times its (rounded) scale, as a GGUF Q8_0 or Q4_0 weight converts.
func iqLinearSym(b *Backend, r *rand.Rand, N, K, bits, gs int, sdt engine.DType, sym bool) (*engine.Linear, []float32) {
	w := randF32(r, N*K)
	q, s, bz, deq := quantize(w, N, K, bits, gs)
	if sym {
		_, sv := halfBytes(s, sdt)
		for g := range bz {
			s[g], bz[g] = sv[g], sv[g]*-float32(int(1)<<(bits-1))
		}
	}
	lin := &engine.Linear{Bits: bits, GroupSize: gs}
	lin.W = b.FromBytes(u32Bytes(q), []int{N, K * bits / 32}, engine.U32)
	if sdt == engine.F32 {
		lin.Scales = b.FromFloat32(s, N, K/gs)
		lin.Biases = b.FromFloat32(bz, N, K/gs)
		return lin, deq
	}
	sb, sv := halfBytes(s, sdt)
	bb, bv := halfBytes(bz, sdt)
	lin.Scales = b.FromBytes(sb, []int{N, K / gs}, sdt)
	lin.Biases = b.FromBytes(bb, []int{N, K / gs}, sdt)
	per := 32 / bits
	for i := range deq {
		qi := (q[i/per] >> (uint(i%per) * uint(bits))) & (1<<bits - 1)
		g := (i/K)*(K/gs) + (i%K)/gs
		deq[i] = sv[g]*float32(qi) + bv[g]
	}
	return lin, deq
}

// TestIQMatchesIntegerDefinition: the integer path (iq.go) gives, on every
// kernel and for every row count, exactly the result its definition
// states, computed here independently in float64-free scalar Go from the
// dequantized parts; rows do not depend on L; and the result is within
// the activation rounding of the float product.
func TestIQMatchesIntegerDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	kernels := iqKernels()
	const L = 5
	for _, c := range []struct {
		N, K, bits, gs int
		sdt            engine.DType
		sym            bool
	}{
		{16, 64, 4, 32, engine.F16, false}, {13, 128, 4, 64, engine.F16, false}, {24, 256, 4, 128, engine.BF16, false},
		{16, 96, 4, 32, engine.F32, false}, {16, 64, 8, 32, engine.F16, false}, {21, 128, 8, 64, engine.F32, false},
		{8, 32, 8, 32, engine.BF16, false}, {40, 576, 4, 32, engine.F16, false},
		{16, 64, 8, 32, engine.F16, true}, {21, 128, 8, 64, engine.F16, true}, {40, 576, 4, 32, engine.F16, true},
	} {
		for _, k := range kernels {
			name := fmt.Sprintf("q%d g%d %v sym=%v N%d K%d %+v", c.bits, c.gs, c.sdt, c.sym, c.N, c.K, k)
			t.Run(name, func(t *testing.T) {
				b := &Backend{threads: 3, simd: k.simd, vnni: k.vnni, zmm: k.zmm, vbmi: k.vbmi, iq: true}
				lin, deq := iqLinearSym(b, r, c.N, c.K, c.bits, c.gs, c.sdt, c.sym)
				x := randF32(r, L*c.K)
				x[3] = 0 // a block with a zero, and one all zero:
				for k := range 32 {
					x[c.K+k] = 0
				}
				all := get(t, b, b.Linear(b.FromFloat32(x, L, c.K), lin))
				w := &weight{}
				b.setWeight(w, lin)
				if w.iq == nil {
					t.Fatal("weight did not take the integer path")
				}
				if sym := w.iq.negzp != 0; sym != c.sym {
					t.Fatalf("symmetric layout %v (−zp %v), want %v", sym, w.iq.negzp, c.sym)
				}
				for i := range L {
					one := get(t, b, b.Linear(b.FromFloat32(x[i*c.K:(i+1)*c.K], 1, c.K), lin))
					want := iqDefinition(x[i*c.K:(i+1)*c.K], w)
					for j := range c.N {
						if math.Float32bits(all[i*c.N+j]) != math.Float32bits(want[j]) || math.Float32bits(one[j]) != math.Float32bits(want[j]) {
							t.Fatalf("row %d col %d: batch %v, alone %v, definition %v", i, j, all[i*c.N+j], one[j], want[j])
						}
					}
				}
				// Close to the float product: error within the rounding of
				// each activation (half a step of max|x|/32767 per block).
				ref := refMatmulT(x, deq, L, c.N, c.K)
				for i := range L {
					for j := range c.N {
						var bound float64
						for k := 0; k < c.K; k += 32 {
							var amax float64
							for _, v := range x[i*c.K+k : i*c.K+k+32] {
								amax = max(amax, math.Abs(float64(v)))
							}
							for e := range 32 {
								bound += amax / 32767 / 2 * math.Abs(float64(deq[j*c.K+k+e]))
							}
						}
						if d := math.Abs(float64(all[i*c.N+j] - ref[i*c.N+j])); d > bound*1.01+1e-4 {
							t.Fatalf("row %d col %d: %v vs float %v (|Δ| %g > bound %g)", i, j, all[i*c.N+j], ref[i*c.N+j], d, bound)
						}
					}
				}
			})
		}
	}
}

// iqKernel is one set of integer kernels iqRows may run.
type iqKernel struct{ simd, vnni, zmm, vbmi bool }

// iqKernels is every set this machine can run: Go, AVX2, AVX-512 VNNI on
// 256-bit registers, with the 512-bit gemm, and with its VBMI unpacking.
func iqKernels() []iqKernel {
	kernels := []iqKernel{{}}
	if hasSIMD() {
		kernels = append(kernels, iqKernel{simd: true})
	}
	if hasVNNI() {
		kernels = append(kernels, iqKernel{simd: true, vnni: true})
	}
	if hasVNNI512() {
		kernels = append(kernels, iqKernel{simd: true, vnni: true, zmm: true})
	}
	if hasVBMI() {
		kernels = append(kernels, iqKernel{simd: true, vnni: true, zmm: true, vbmi: true})
	}
	return kernels
}

// TestIQSmallM: a step of M = 1..17 positions (a verification of up to 16
// drafts, or a batch of such) gives every row exactly its definition's
// bits, on every kernel, for each weight kind the GGUF conversions and
// MLX files produce (4-bit with float16 scale and bias as Q4_1, 8-bit
// symmetric as Q8_0, 4-bit symmetric as Q4_0, 8-bit with float32 scales,
// larger groups), whatever the thread count splits the rows into (N = 40
// is five groups of eight: two pairs for the 512-bit gemm and one left
// over, or a pair split between two threads), and K one run of blocks
// of the 512-bit gemm or several (iqWideRun).
func TestIQSmallM(t *testing.T) {
	r := rand.New(rand.NewPCG(97, 98))
	for _, c := range []struct {
		name     string
		bits, gs int
		sdt      engine.DType
		sym      bool
		N, K     int
	}{
		{"q4_1", 4, 32, engine.F16, false, 40, 576},
		{"q8_0", 8, 32, engine.F16, true, 40, 576},
		{"q4_0", 4, 32, engine.F16, true, 48, 96},
		{"q8 f32 scales", 8, 32, engine.F32, false, 40, 832},
		{"q4 g64 bf16", 4, 64, engine.BF16, false, 33, 1024},
		{"q8 g128", 8, 128, engine.F16, false, 24, 1024},
		{"q4 short rows", 4, 32, engine.F16, false, 32, 64},
	} {
		lin, _ := iqLinearSym(newBackend(1), r, c.N, c.K, c.bits, c.gs, c.sdt, c.sym)
		x := randF32(r, 17*c.K)
		for k := range 32 { // an all-zero block
			x[2*c.K+k] = 0
		}
		for _, k := range iqKernels() {
			for _, threads := range []int{1, 2, 3} {
				b := &Backend{threads: threads, simd: k.simd, vnni: k.vnni, zmm: k.zmm, vbmi: k.vbmi, iq: true}
				w := &weight{}
				b.setWeight(w, lin)
				if w.iq == nil || (w.iq.negzp != 0) != c.sym {
					t.Fatalf("%s: integer path %v, symmetric %v", c.name, w.iq != nil, c.sym)
				}
				want := make([][]float32, 17)
				for i := range want {
					want[i] = iqDefinition(x[i*c.K:(i+1)*c.K], w)
				}
				for M := 1; M <= 17; M++ {
					out := make([]float32, M*c.N)
					b.matmulT(out, x[:M*c.K], M, w)
					for i := range M {
						for j := range c.N {
							if math.Float32bits(out[i*c.N+j]) != math.Float32bits(want[i][j]) {
								t.Fatalf("%s %+v threads %d M=%d: row %d col %d = %v, definition %v", c.name, k, threads, M, i, j, out[i*c.N+j], want[i][j])
							}
						}
					}
				}
			}
		}
	}
}

// iqDefinition is the integer path's definition written out plainly:
// quantize each 32-block of x, form Σ w·q exactly from the unpacked
// weight, accumulate in float32 with each operation rounded.
func iqDefinition(x []float32, w *weight) []float32 {
	K := w.in
	ng := K / w.gs
	out := make([]float32, w.out)
	for j := range w.out {
		var acc float32
		for k := 0; k < K; k += 32 {
			var amax float32
			for _, v := range x[k : k+32] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			var q [32]int32
			var sum int32
			d := amax / 32767
			if amax > 0 {
				for e, v := range x[k : k+32] {
					q[e] = int32(math.RoundToEven(float64(v * (32767 / amax))))
					sum += q[e]
				}
			}
			var isum int32
			per := 32 / w.bits
			for e := range 32 {
				n := k + e
				u := w.q[j*w.wpr+n/per] >> (uint(n%per) * uint(w.bits)) & (1<<w.bits - 1)
				isum += int32(u) * q[e]
			}
			g := j*ng + k/w.gs
			t := float32(w.scales[g] * d)
			acc = float32(acc + float32(float32(isum)*t))
			acc = float32(acc + float32(w.biases[g]*float32(d*float32(sum))))
		}
		out[j] = acc
	}
	return out
}

func TestQuantizeBlock(t *testing.T) {
	var q [32]int16
	xs := make([]float32, 32)
	if d, s := quantizeBlock(q[:], xs, false); d != 0 || s != 0 {
		t.Fatalf("zeros: d %v sum %v", d, s)
	}
	for i := range xs {
		xs[i] = float32(i) - 15.5
	}
	d, s := quantizeBlock(q[:], xs, false)
	if d != 15.5/iqMax || q[0] != -iqMax || q[31] != iqMax || s != 0 {
		t.Fatalf("ramp: d %v q %v sum %v", d, q, s)
	}
	// Nibble order: even elements first, then odd ones.
	quantizeBlock(q[:], xs, true)
	if q[0] != -iqMax || q[16] != int16(math.RoundToEven(float64(float32(-14.5)*(iqMax/float32(15.5))))) || q[31] != iqMax {
		t.Fatalf("nibble order: %v", q)
	}
	xs[5] = float32(math.NaN())
	if d, _ := quantizeBlock(q[:], xs, false); !math.IsNaN(float64(d)) {
		t.Fatalf("NaN input: d %v", d)
	}
	xs[5] = float32(math.Inf(-1))
	if d, _ := quantizeBlock(q[:], xs, false); !math.IsNaN(float64(d)) {
		t.Fatalf("Inf input: d %v", d)
	}
}

// BenchmarkMatvecQ4: one input row against a 4-bit [N, K] weight (a decode
// step's product), integer path against the float path, one thread; bytes
// are the packed weight's.
func BenchmarkMatvecQ4(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, shape := range [][2]int{{1536, 576}, {576, 1536}, {16384, 576}} {
		N, K := shape[0], shape[1]
		for _, iq := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dx%d/iq=%v", N, K, iq), func(b *testing.B) {
				be := &Backend{threads: 1, simd: hasSIMD(), iq: iq}
				lin, _ := iqLinear(be, r, N, K, 4, 32, engine.F16)
				x := be.FromFloat32(randF32(r, K), 1, K)
				b.SetBytes(int64(N * K / 2))
				b.ReportAllocs()
				for b.Loop() {
					be.Free(be.Linear(x, lin))
				}
			})
		}
	}
}

// BenchmarkMatvecQ4Cold is BenchmarkMatvecQ4 over eight weights of 4.7 MB
// in turn (more than the last-level cache here), as a decode step reads
// its model.
func BenchmarkMatvecQ4Cold(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const N, K = 16384, 576
	for _, iq := range []bool{false, true} {
		b.Run(fmt.Sprintf("iq=%v", iq), func(b *testing.B) {
			be := &Backend{threads: 1, simd: hasSIMD(), iq: iq}
			var lins []*engine.Linear
			for range 8 {
				lin, _ := iqLinear(be, r, N, K, 4, 32, engine.F16)
				lins = append(lins, lin)
			}
			x := be.FromFloat32(randF32(r, K), 1, K)
			b.SetBytes(int64(N * K / 2))
			i := 0
			for b.Loop() {
				be.Free(be.Linear(x, lins[i%len(lins)]))
				i++
			}
		})
	}
}

// TestQuantizeAVXMatchesGo: the assembly quantization equals the Go
// definition on every block, including ties, zero, NaN and Inf blocks.
func TestQuantizeAVXMatchesGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(91, 92))
	const nb = 64
	x := make([]float32, nb*32)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4)))
	}
	for k := range 32 { // exact halves: x·(32767/max) = n + 0.5
		x[k] = float32(k-16) + 0.5
	}
	x[31] = 32767
	clear(x[32:64])
	x[70] = float32(math.NaN())
	x[100] = float32(math.Inf(1))
	x[140] = -float32(math.MaxFloat32)
	x[170] = 1e-42 // subnormal
	for _, nib := range []bool{false, true} {
		var a, want iqActs
		a.quantize(x, 1, len(x), nib, true)
		want.quantize(x, 1, len(x), nib, false)
		for i := range want.m {
			g, w := a.m[i], want.m[i]
			same := math.Float32bits(g.d) == math.Float32bits(w.d) || (g.d != g.d && w.d != w.d)
			if !same || (g.s != w.s && !(g.s != g.s && w.s != w.s)) {
				t.Fatalf("nibble=%v block %d: %+v, Go %+v", nib, i, g, w)
			}
		}
		for i := range want.q {
			if a.q[i] != want.q[i] {
				t.Fatalf("nibble=%v q[%d] = %d, Go %d", nib, i, a.q[i], want.q[i])
			}
		}
	}
}

// TestIQPastOneTile: more input rows than one gemm pass takes (iqGemmTile)
// still give each row its definition's bits, whatever the rows left after
// the VNNI gemm's groups of eight (1 to 7).
func TestIQPastOneTile(t *testing.T) {
	r := rand.New(rand.NewPCG(93, 94))
	const N, K = 16, 64
	for L, vnni := range map[int]bool{iqGemmTile + 1: false, iqGemmTile + 2: hasVNNI(), iqGemmTile + 3: hasVNNI(), iqGemmTile + 4: hasVNNI(),
		iqGemmTile + 5: hasVNNI(), iqGemmTile + 6: hasVNNI(), iqGemmTile + 7: hasVNNI(), iqGemmTile + 9: hasVNNI(), iqGemmTile + 10: false} {
		b := &Backend{threads: 2, simd: hasSIMD(), vnni: vnni, iq: true}
		lin, _ := iqLinear(b, r, N, K, 4, 32, engine.F16)
		x := randF32(r, L*K)
		all := get(t, b, b.Linear(b.FromFloat32(x, L, K), lin))
		w := &weight{}
		b.setWeight(w, lin)
		for i := range L {
			want := iqDefinition(x[i*K:(i+1)*K], w)
			for j := range N {
				if math.Float32bits(all[i*N+j]) != math.Float32bits(want[j]) {
					t.Fatalf("L=%d vnni=%v row %d col %d: %v, definition %v", L, vnni, i, j, all[i*N+j], want[j])
				}
			}
		}
	}
}

// TestIQExactHalfScales: float32 scales and biases that are all float16
// values are regrouped as float16 (half the bytes) and give the same bits
// as the definition; one value off float16 keeps them float32.
func TestIQExactHalfScales(t *testing.T) {
	r := rand.New(rand.NewPCG(95, 96))
	const N, K = 16, 64
	for _, exact := range []bool{true, false} {
		b := newBackend(2)
		w := randF32(r, N*K)
		q, s, bz, _ := quantize(w, N, K, 4, 32)
		_, sv := halfBytes(s, engine.F16)
		_, bv := halfBytes(bz, engine.F16)
		if !exact {
			sv[3] += 1e-6 // no longer a float16 value
		}
		lin := &engine.Linear{Bits: 4, GroupSize: 32,
			W:      b.FromBytes(u32Bytes(q), []int{N, K / 8}, engine.U32),
			Scales: b.FromFloat32(sv, N, K/32), Biases: b.FromFloat32(bv, N, K/32)}
		wt := &weight{}
		b.setWeight(wt, lin)
		if (wt.iq.s16 != nil) != exact {
			t.Fatalf("exact=%v: float16 layout %v", exact, wt.iq.s16 != nil)
		}
		x := randF32(r, 3*K)
		got := get(t, b, b.Linear(b.FromFloat32(x, 3, K), lin))
		for i := range 3 {
			want := iqDefinition(x[i*K:(i+1)*K], wt)
			for j := range N {
				if math.Float32bits(got[i*N+j]) != math.Float32bits(want[j]) {
					t.Fatalf("exact=%v row %d col %d: %v, definition %v", exact, i, j, got[i*N+j], want[j])
				}
			}
		}
	}
}

// BenchmarkGemmIQ: a 128-row prefill chunk against an 8-bit [1536, 576]
// weight (SmolLM2's MLP up), one thread, for the float path and each
// integer kernel; "bytes" are multiply-adds, so MB/s reads as millions of
// multiply-adds per second.
func BenchmarkGemmIQ(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	const L, N, K = 128, 1536, 576
	for _, k := range []struct {
		name     string
		iq, vnni bool
	}{{"float", false, false}, {"avx2", true, false}, {"vnni", true, true}} {
		if k.vnni && !hasVNNI() {
			continue
		}
		b.Run(k.name, func(b *testing.B) {
			be := &Backend{threads: 1, simd: hasSIMD(), iq: k.iq, vnni: k.vnni}
			lin, _ := iqLinear(be, r, N, K, 8, 32, engine.F16)
			x := be.FromFloat32(randF32(r, L*K), L, K)
			b.SetBytes(int64(L * N * K))
			for b.Loop() {
				be.Free(be.Linear(x, lin))
			}
		})
	}
}

// BenchmarkSmallM: what a step of M positions costs per position, one
// thread, for the products a speculative verification step runs (M = 1 is
// a plain decode step, 2..17 one sequence verifying 1..16 drafts, or a
// batch of such). Shapes are SmolLM2-135M's MLP up [1536, 576] and down
// [576, 1536]; kinds are its GGUF conversions (Q4_1: 4-bit with float16
// scale and bias; Q8_0: 8-bit symmetric) and dense f32/bf16. "bytes" are
// multiply-adds (MB/s reads as millions of multiply-adds per second);
// ns/row is the time per input row, cpu-ns/row the thread's CPU time per
// input row (it moves much less with the machine's load).
func BenchmarkSmallM(b *testing.B) {
	for _, shape := range [][2]int{{1536, 576}, {576, 1536}} {
		N, K := shape[0], shape[1]
		for _, kind := range []string{"q4_1", "q8_0", "f32", "bf16"} {
			for _, M := range []int{1, 2, 3, 4, 8, 9, 16, 17} {
				b.Run(fmt.Sprintf("%dx%d/%s/M=%d", N, K, kind, M), func(b *testing.B) {
					r := rand.New(rand.NewPCG(11, uint64(M)))
					be := newBackend(1) // the kernels this machine runs
					var lin *engine.Linear
					switch kind {
					case "q4_1":
						lin, _ = iqLinear(be, r, N, K, 4, 32, engine.F16)
					case "q8_0":
						lin, _ = iqLinearSym(be, r, N, K, 8, 32, engine.F16, true)
					default:
						lin = benchWeights(b, be, N, K, kind)
					}
					w := be.newWeight(lin)
					x, out := randF32(r, M*K), make([]float32, M*N)
					be.matmulT(out, x, M, w) // warm: scratch and regrouped scales
					b.SetBytes(int64(M * N * K))
					b.ReportAllocs()
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					cpu0 := threadCPU()
					for b.Loop() {
						be.matmulT(out, x, M, w)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*M), "ns/row")
					if cpu := threadCPU() - cpu0; cpu0 > 0 {
						b.ReportMetric(float64(cpu)/float64(b.N*M), "cpu-ns/row")
					}
				})
			}
		}
	}
}

// BenchmarkSmallMCold is BenchmarkSmallM's up projection (Q4_1) over 48
// different weights in turn (24 MB, more than the core's L2), as a model's
// step meets them, for each set of integer kernels this machine has: what
// the unpacking's prefetch of the next group's words is worth (cpu-ns/row,
// the thread's CPU time per input row).
func BenchmarkSmallMCold(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const N, K = 1536, 576
	for _, k := range iqKernels() {
		if !k.simd || k.zmm != k.vbmi {
			continue // the Go kernels; the 512-bit gemm without VBMI
		}
		be := &Backend{threads: 1, simd: k.simd, vnni: k.vnni, zmm: k.zmm, vbmi: k.vbmi, iq: true}
		ws := make([]*weight, 48)
		for i := range ws {
			lin, _ := iqLinear(be, r, N, K, 4, 32, engine.F16)
			ws[i] = be.newWeight(lin)
		}
		name := map[bool]string{false: "avx2", true: "vnni256"}[k.vnni]
		if k.zmm {
			name = "vnni512"
		}
		for _, M := range []int{1, 3, 9} {
			b.Run(fmt.Sprintf("%s/M=%d", name, M), func(b *testing.B) {
				x, out := randF32(r, M*K), make([]float32, M*N)
				b.SetBytes(int64(M * N * K))
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0 := threadCPU()
				i := 0
				for b.Loop() {
					be.matmulT(out, x, M, ws[i%len(ws)])
					i++
				}
				if cpu := threadCPU() - cpu0; cpu0 > 0 {
					b.ReportMetric(float64(cpu)/float64(b.N*M), "cpu-ns/row")
				}
			})
		}
	}
}
