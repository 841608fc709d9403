package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// The benchmarks use SmolLM2-135M's MLP shape (up/gate: 1536×576) so the
// numbers speak for the model the tests run. GFLOP/s counts 2·L·N·K.

func benchWeights(b *testing.B, be *Backend, N, K int, kind string) *engine.Linear {
	r := rand.New(rand.NewPCG(1, 1))
	w := randF32(r, N*K)
	switch kind {
	case "f32":
		return &engine.Linear{W: be.FromFloat32(w, N, K)}
	case "bf16":
		wb, _ := halfBytes(w, engine.BF16)
		return &engine.Linear{W: be.FromBytes(wb, []int{N, K}, engine.BF16)}
	case "q4", "q8":
		bits := 4
		if kind == "q8" {
			bits = 8
		}
		q, s, bz, _ := quantize(w, N, K, bits, 32)
		sb, _ := halfBytes(s, engine.F16)
		bb, _ := halfBytes(bz, engine.F16)
		return &engine.Linear{Bits: bits, GroupSize: 32,
			W:      be.FromBytes(u32Bytes(q), []int{N, K * bits / 32}, engine.U32),
			Scales: be.FromBytes(sb, []int{N, K / 32}, engine.F16),
			Biases: be.FromBytes(bb, []int{N, K / 32}, engine.F16)}
	}
	b.Fatalf("kind %s", kind)
	return nil
}

func reportFlops(b *testing.B, L, N, K int) {
	b.ReportMetric(float64(2*L*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkLinear measures the kernels the model uses: decode (L=1) and
// prefill (L=128) for dense f32/bf16 and MLX 4/8-bit weights, on all cores.
func BenchmarkLinear(b *testing.B) {
	const N, K = 1536, 576
	for _, kind := range []string{"f32", "bf16", "q4", "q8"} {
		for _, L := range []int{1, 128} {
			b.Run(fmt.Sprintf("%s/L=%d", kind, L), func(b *testing.B) {
				be := newBackend(0)
				lin := benchWeights(b, be, N, K, kind)
				x := be.FromFloat32(randF32(rand.New(rand.NewPCG(2, 2)), L*K), L, K)
				b.ReportAllocs()
				b.SetBytes(int64(N * K * 4))
				for b.Loop() {
					be.Linear(x, lin)
				}
				reportFlops(b, L, N, K)
			})
		}
	}
}

// BenchmarkQ4Decode compares the two ways of multiplying a 4-bit weight
// at decode: fused (read packed words, fold the bias per group) against
// expanding each row to float32 first, and against weights dequantized to
// f32 at load (the dense kernel).
func BenchmarkQ4Decode(b *testing.B) {
	const N, K = 1536, 576
	be := newBackend(0)
	for _, mode := range []string{"fused", "expand", "dequantized-at-load"} {
		b.Run(mode, func(b *testing.B) {
			lin := benchWeights(b, be, N, K, "q4")
			if mode == "dequantized-at-load" {
				w := be.newWeight(lin)
				full := make([]float32, N*K)
				for j := range N {
					w.row(full[j*K:(j+1)*K], j)
				}
				lin = &engine.Linear{W: be.FromFloat32(full, N, K)}
			}
			w := be.newWeight(lin)
			x := randF32(rand.New(rand.NewPCG(2, 2)), K)
			out := make([]float32, N)
			b.ReportAllocs()
			for b.Loop() {
				if mode == "expand" {
					be.matmulTExpand(out, x, 1, w)
				} else {
					be.matmulT(out, x, 1, w)
				}
			}
			reportFlops(b, 1, N, K)
		})
	}
}

// BenchmarkNaiveMatmul is the baseline: a plain single-threaded triple loop
// over f32, for the ratio recorded in docs/BENCHMARKS.md.
func BenchmarkNaiveMatmul(b *testing.B) {
	const N, K = 1536, 576
	for _, L := range []int{1, 128} {
		b.Run(fmt.Sprintf("L=%d", L), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			w, x := randF32(r, N*K), randF32(r, L*K)
			out := make([]float32, L*N)
			for b.Loop() {
				for i := range L {
					for j := range N {
						var s float32
						for k := range K {
							s += x[i*K+k] * w[j*K+k]
						}
						out[i*N+j] = s
					}
				}
			}
			reportFlops(b, L, N, K)
		})
	}
}

// BenchmarkDecodeModelSized settles dequantize-at-load against on-the-fly
// for decode where it matters: one token through all 30 layers of
// SmolLM2-135M's projections (≈106M weights), a working set far larger
// than the caches. "q4-fused" keeps 4-bit words (≈60 MB) and expands them
// in registers; "f32-dequantized" is the same weights expanded at load
// (≈425 MB).
func BenchmarkDecodeModelSized(b *testing.B) {
	const D, F, KV, layers = 576, 1536, 192, 30
	shapes := [][2]int{{D, D}, {KV, D}, {KV, D}, {D, D}, {F, D}, {F, D}, {D, F}}
	be := newBackend(0)
	r := rand.New(rand.NewPCG(5, 5))
	type mat struct {
		q4, q4h, f32 *weight
	}
	var mats []mat
	flops := 0
	for range layers {
		for _, s := range shapes {
			N, K := s[0], s[1]
			w := randF32(r, N*K)
			q, sc, bz, deq := quantize(w, N, K, 4, 32)
			sc16, bz16 := make([]uint16, len(sc)), make([]uint16, len(bz))
			half.NarrowF16(sc16, sc)
			half.NarrowF16(bz16, bz)
			q4h := &weight{out: N, in: K, bits: 4, gs: 32, q: q, scales: sc, biases: bz, wpr: K / 8, simd: be.simd}
			q4h.scales16, q4h.biases16 = sc16, bz16
			mats = append(mats, mat{
				q4h: q4h,
				q4:  &weight{out: N, in: K, bits: 4, gs: 32, q: q, scales: sc, biases: bz, wpr: K / 8, simd: be.simd},
				f32: &weight{out: N, in: K, dt: engine.F32, f32: deq},
			})
			flops += 2 * N * K
		}
	}
	x := randF32(r, F)
	out := make([]float32, F)
	for _, mode := range []string{"q4-fused", "q4-fused-f16-scales", "q4-expand", "f32-dequantized"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range mats {
					switch mode {
					case "q4-fused":
						be.matmulTMode(out[:m.q4.out], x[:m.q4.in], 1, m.q4, true)
					case "q4-fused-f16-scales":
						be.matmulTMode(out[:m.q4h.out], x[:m.q4h.in], 1, m.q4h, true)
					case "q4-expand":
						be.matmulTMode(out[:m.q4.out], x[:m.q4.in], 1, m.q4, false)
					default:
						be.matmulT(out[:m.f32.out], x[:m.f32.in], 1, m.f32)
					}
				}
			}
			b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/token")
		})
	}
}
