package cpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

func randF32(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func closeTo(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range got {
		d := math.Abs(float64(got[i] - want[i]))
		if d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: [%d] = %v, want %v (tol %g)", name, i, got[i], want[i], tol)
		}
	}
}

func get(t *testing.T, b engine.Backend, a engine.Array) []float32 {
	t.Helper()
	f, err := b.Float32(a)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// quantize packs w [out, in] into MLX affine form (per-group min/max),
// returning the packed words, scales, biases and the dequantized matrix the
// kernels must reproduce.
func quantize(w []float32, out, in, bits, gs int) (q []uint32, scales, biases, deq []float32) {
	per := 32 / bits
	levels := float32(int(1)<<bits - 1)
	q = make([]uint32, out*in/per)
	ng := in / gs
	scales = make([]float32, out*ng)
	biases = make([]float32, out*ng)
	deq = make([]float32, out*in)
	for r := range out {
		for g := range ng {
			lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
			for _, v := range w[r*in+g*gs : r*in+(g+1)*gs] {
				lo, hi = min(lo, v), max(hi, v)
			}
			s := (hi - lo) / levels
			if s == 0 {
				s = 1
			}
			scales[r*ng+g], biases[r*ng+g] = s, lo
			for k := range gs {
				idx := r*in + g*gs + k
				qi := uint32(math.Round(float64((w[idx] - lo) / s)))
				qi = min(qi, uint32(levels))
				q[idx/per] |= qi << (uint(idx%per) * uint(bits))
				deq[idx] = s*float32(qi) + lo
			}
		}
	}
	return
}

func u32Bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

func halfBytes(v []float32, dt engine.DType) ([]byte, []float32) {
	b := make([]byte, 2*len(v))
	back := make([]float32, len(v))
	for i, x := range v {
		var h uint16
		if dt == engine.BF16 {
			h = half.F32ToBF16(x)
			back[i] = half.BF16ToF32(h)
		} else {
			h = half.F32ToF16(x)
			back[i] = half.F16ToF32(h)
		}
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b, back
}

func refMatmulT(x, w []float32, L, N, K int) []float32 {
	out := make([]float32, L*N)
	for i := range L {
		for j := range N {
			var s float64
			for k := range K {
				s += float64(x[i*K+k]) * float64(w[j*K+k])
			}
			out[i*N+j] = float32(s)
		}
	}
	return out
}

func TestLinear(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name          string
		L, N, K       int
		dt            engine.DType
		bits, gs      int
		bias, threads int
	}{
		{"f32 decode", 1, 37, 64, engine.F32, 0, 0, 0, 2},
		{"f32 prefill odd", 7, 13, 96, engine.F32, 0, 0, 1, 2},
		{"f32 1 thread", 5, 8, 32, engine.F32, 0, 0, 0, 1},
		{"bf16", 3, 9, 64, engine.BF16, 0, 0, 1, 2},
		{"f16", 4, 10, 64, engine.F16, 0, 0, 0, 2},
		{"q4 g32 decode", 1, 19, 128, 0, 4, 32, 0, 2},
		{"q4 g64 two rows", 2, 8, 128, 0, 4, 64, 1, 2},
		{"q4 g128 prefill", 9, 11, 256, 0, 4, 128, 0, 2},
		{"q8 g32 decode", 1, 12, 64, 0, 8, 32, 0, 2},
		{"q8 g64 prefill", 6, 5, 128, 0, 8, 64, 1, 2},
		{"q2 g32", 3, 4, 64, 0, 2, 32, 0, 2},
		{"f32 K not a multiple of 8", 3, 9, 44, engine.F32, 0, 0, 0, 2},
		{"f32 K below 8", 2, 5, 6, engine.F32, 0, 0, 0, 2},
	}
	kernels := []bool{false}
	if hasSIMD() {
		kernels = append(kernels, true)
	}
	for _, c := range cases {
		for _, simd := range kernels {
			t.Run(fmt.Sprintf("%s/simd=%v", c.name, simd), func(t *testing.T) {
				b := &Backend{threads: c.threads, simd: simd}
				x := randF32(r, c.L*c.K)
				w := randF32(r, c.N*c.K)
				lin := &engine.Linear{Bits: c.bits, GroupSize: c.gs}
				ref := w
				switch {
				case c.bits > 0:
					q, s, bz, deq := quantize(w, c.N, c.K, c.bits, c.gs)
					ref = deq
					lin.W = b.FromBytes(u32Bytes(q), []int{c.N, c.K * c.bits / 32}, engine.U32)
					sb, sv := halfBytes(s, engine.F16)
					bb, bv := halfBytes(bz, engine.F16)
					lin.Scales = b.FromBytes(sb, []int{c.N, c.K / c.gs}, engine.F16)
					lin.Biases = b.FromBytes(bb, []int{c.N, c.K / c.gs}, engine.F16)
					// Recompute the reference with the rounded scales/biases.
					per := 32 / c.bits
					for i := range ref {
						qi := (q[i/per] >> (uint(i%per) * uint(c.bits))) & (1<<c.bits - 1)
						g := (i/c.K)*(c.K/c.gs) + (i%c.K)/c.gs
						ref[i] = sv[g]*float32(qi) + bv[g]
					}
				case c.dt == engine.F32:
					lin.W = b.FromFloat32(w, c.N, c.K)
				default:
					wb, back := halfBytes(w, c.dt)
					ref = back
					lin.W = b.FromBytes(wb, []int{c.N, c.K}, c.dt)
				}
				want := refMatmulT(x, ref, c.L, c.N, c.K)
				if c.bias == 1 {
					bias := randF32(r, c.N)
					lin.Bias = b.FromFloat32(bias, c.N)
					for i := range c.L {
						for j := range c.N {
							want[i*c.N+j] += bias[j]
						}
					}
				}
				got := b.Linear(b.FromFloat32(x, c.L, c.K), lin)
				if s := got.Shape(); s[0] != c.L || s[1] != c.N {
					t.Fatalf("shape %v", s)
				}
				closeTo(t, c.name, get(t, b, got), want, 1e-4)
			})
		}
	}
}

func TestMatMulBatched(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := New(2)
	B, M, K, N := 3, 5, 7, 6
	x, y := randF32(r, B*M*K), randF32(r, B*K*N)
	got := get(t, b, b.MatMul(b.FromFloat32(x, B, M, K), b.FromFloat32(y, B, K, N)))
	for bt := range B {
		for i := range M {
			for j := range N {
				var s float32
				for k := range K {
					s += x[bt*M*K+i*K+k] * y[bt*K*N+k*N+j]
				}
				if d := math.Abs(float64(got[bt*M*N+i*N+j] - s)); d > 1e-4 {
					t.Fatalf("[%d,%d,%d] = %v want %v", bt, i, j, got[bt*M*N+i*N+j], s)
				}
			}
		}
	}
}

func refAttention(q, k, v []float32, H, Hkv, L, T, Dh int, scale float32) []float32 {
	out := make([]float32, H*L*Dh)
	for h := range H {
		kh := h / (H / Hkv)
		for i := range L {
			limit := T - L + i
			s := make([]float64, limit+1)
			m := math.Inf(-1)
			for t := 0; t <= limit; t++ {
				var d float64
				for e := range Dh {
					d += float64(q[(h*L+i)*Dh+e]) * float64(k[(kh*T+t)*Dh+e])
				}
				s[t] = d * float64(scale)
				m = math.Max(m, s[t])
			}
			var sum float64
			for t := range s {
				s[t] = math.Exp(s[t] - m)
				sum += s[t]
			}
			for e := range Dh {
				var acc float64
				for t := range s {
					acc += s[t] / sum * float64(v[(kh*T+t)*Dh+e])
				}
				out[(h*L+i)*Dh+e] = float32(acc)
			}
		}
	}
	return out
}

func TestAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct{ H, Hkv, L, T, Dh int }{
		{4, 4, 1, 1, 8},   // first token
		{4, 2, 5, 5, 16},  // prefill, GQA 2
		{6, 2, 1, 9, 8},   // decode after 8 cached
		{9, 3, 3, 11, 32}, // chunk at an offset
		{2, 1, 2, 7, 12},  // head dim not a multiple of 8
	} {
		b := &Backend{threads: 2, simd: hasSIMD()}
		if c.T == 11 {
			b.simd = false // the pure-Go path
		}
		q := randF32(r, c.H*c.L*c.Dh)
		k := randF32(r, c.Hkv*c.T*c.Dh)
		v := randF32(r, c.Hkv*c.T*c.Dh)
		scale := float32(1 / math.Sqrt(float64(c.Dh)))
		got := get(t, b, b.Attention(b.FromFloat32(q, c.H, c.L, c.Dh), b.FromFloat32(k, c.Hkv, c.T, c.Dh), b.FromFloat32(v, c.Hkv, c.T, c.Dh), scale))
		closeTo(t, "attention", got, refAttention(q, k, v, c.H, c.Hkv, c.L, c.T, c.Dh, scale), 1e-4)
	}
}

func TestNormsAndElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	b := New(2)
	x := randF32(r, 3*16)
	w := randF32(r, 16)
	got := get(t, b, b.RMSNorm(b.FromFloat32(x, 3, 16), b.FromFloat32(w, 16), 1e-5))
	want := make([]float32, len(x))
	for i := range 3 {
		var ss float64
		for j := range 16 {
			ss += float64(x[i*16+j] * x[i*16+j])
		}
		inv := 1 / math.Sqrt(ss/16+1e-5)
		for j := range 16 {
			want[i*16+j] = float32(float64(x[i*16+j])*inv) * w[j]
		}
	}
	closeTo(t, "rmsnorm", got, want, 1e-5)

	sm := get(t, b, b.Softmax(b.FromFloat32(x, 3, 16)))
	for i := range 3 {
		var s float32
		for j := range 16 {
			s += sm[i*16+j]
		}
		if math.Abs(float64(s-1)) > 1e-5 {
			t.Fatalf("softmax row %d sums to %v", i, s)
		}
	}
	up := make([]float32, len(x))
	for i := range up {
		up[i] = float32(i%7) - 3
	}
	swiglu := get(t, b, b.SwiGLU(b.FromFloat32(x, 3, 16), b.FromFloat32(up, 3, 16)))
	for i, v := range x {
		want[i] = float32(float64(v) / (1 + math.Exp(-float64(v))) * float64(up[i]))
	}
	closeTo(t, "swiglu", swiglu, want, 1e-5)
	// Every path (AVX2 or Go) rounds as silu32 then one multiply.
	for i, v := range x {
		if swiglu[i] != silu32(v)*up[i] {
			t.Fatalf("swiglu[%d] = %v, want %v bit for bit", i, swiglu[i], silu32(v)*up[i])
		}
	}

	add := get(t, b, b.Add(b.FromFloat32(x, 3, 16), b.FromFloat32(w, 16)))
	mul := get(t, b, b.Mul(b.FromFloat32(w, 1, 16), b.FromFloat32(x, 3, 16)))
	for i, v := range x {
		if add[i] != v+w[i%16] || mul[i] != v*w[i%16] {
			t.Fatalf("broadcast add/mul at %d", i)
		}
	}
	am, err := b.Bytes(b.Argmax(b.FromFloat32([]float32{1, 5, 5, 2, -1, -3, -2, -9}, 2, 4)))
	if err != nil || !bytes.Equal(am, []byte{1, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("argmax bytes %v %v", am, err)
	}
}

func TestShapeOps(t *testing.T) {
	b := New(1)
	x := make([]float32, 2*3*4)
	for i := range x {
		x[i] = float32(i)
	}
	a := b.FromFloat32(x, 2, 3, 4)
	tr := get(t, b, b.Transpose(a, 1, 0, 2)) // [3, 2, 4]
	for i := range 3 {
		for j := range 2 {
			for k := range 4 {
				if tr[(i*2+j)*4+k] != x[(j*3+i)*4+k] {
					t.Fatalf("transpose at %d %d %d", i, j, k)
				}
			}
		}
	}
	sl := get(t, b, b.Slice(a, 1, 1, 3)) // [2, 2, 4]
	for j := range 2 {
		for i := range 2 {
			for k := range 4 {
				if sl[(j*2+i)*4+k] != x[(j*3+i+1)*4+k] {
					t.Fatalf("slice at %d %d %d", j, i, k)
				}
			}
		}
	}
	cat := b.Concat(1, b.Slice(a, 1, 0, 1), b.Slice(a, 1, 1, 3))
	if got := get(t, b, cat); !equalF(got, x) {
		t.Fatalf("concat of slices %v", got)
	}
	rs := b.Reshape(a, 6, -1)
	if s := rs.Shape(); s[0] != 6 || s[1] != 4 {
		t.Fatalf("reshape %v", s)
	}
	for _, dt := range []engine.DType{engine.F16, engine.BF16} {
		back := get(t, b, b.AsType(b.AsType(a, dt), engine.F32))
		if !equalF(back, x) { // small integers are exact in both
			t.Fatalf("%v round trip %v", dt, back)
		}
	}
	ids := b.FromInt32([]int32{2, 0}, 2)
	emb := get(t, b, b.Embedding(&engine.Linear{W: b.FromFloat32(x[:12], 3, 4)}, ids))
	if !equalF(emb, append(append([]float32{}, x[8:12]...), x[0:4]...)) {
		t.Fatalf("embedding %v", emb)
	}
}

func equalF(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHalfConversions(t *testing.T) {
	for _, c := range []struct {
		f float32
		h uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {1e6, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {6.103515625e-05, 0x0400},
		{0.333251953125, 0x3555},
	} {
		if got := half.F32ToF16(c.f); got != c.h {
			t.Errorf("half.F32ToF16(%v) = %#x, want %#x", c.f, got, c.h)
		}
		if c.h != 0x7c00 {
			if got := half.F16ToF32(c.h); got != c.f {
				t.Errorf("f16ToF32(%#x) = %v, want %v", c.h, got, c.f)
			}
		}
	}
	// Every f16 value survives f16 → f32 → f16.
	for h := range 1 << 16 {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaN
		}
		if got := half.F32ToF16(half.F16ToF32(uint16(h))); got != uint16(h) {
			t.Fatalf("f16 %#x round trips to %#x", h, got)
		}
	}
	// The bulk converters (AVX2/F16C where available) agree with the
	// scalar ones on every 16-bit pattern (NaNs compared by bits).
	all := make([]uint16, 1<<16+3)
	for i := range all {
		all[i] = uint16(i)
	}
	bulk := make([]float32, len(all))
	f16ToF32(bulk, all)
	for i, h := range all {
		if w := half.F16ToF32(h); math.Float32bits(bulk[i]) != math.Float32bits(w) && !(bulk[i] != bulk[i] && w != w) {
			t.Fatalf("bulk f16 %#x = %v, scalar %v", h, bulk[i], w)
		}
	}
	bf16ToF32(bulk, all)
	for i, h := range all {
		if math.Float32bits(bulk[i]) != uint32(h)<<16 {
			t.Fatalf("bulk bf16 %#x = %#x", h, math.Float32bits(bulk[i]))
		}
	}
	if got := half.F32ToBF16(1.00390625); got != 0x3f80 { // tie → even
		t.Errorf("bf16 tie rounding %#x", got)
	}
	if got := half.F32ToBF16(1.01171875); got != 0x3f82 { // 1 + 3/256: tie → even up
		t.Errorf("bf16 tie rounding up %#x", got)
	}
}

func TestRoPE(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	b := New(2)
	H, L, Dh := 2, 3, 8
	x := randF32(r, H*L*Dh)
	rope := &engine.RoPE{Dims: Dh, Base: 10000}
	got := get(t, b, b.RoPE(b.FromFloat32(x, H, L, Dh), 5, rope))
	for h := range H {
		for i := range L {
			pos := float64(5 + i)
			for j := range Dh / 2 {
				th := pos / math.Pow(10000, float64(2*j)/float64(Dh))
				x1, x2 := float64(x[(h*L+i)*Dh+j]), float64(x[(h*L+i)*Dh+j+Dh/2])
				w1 := x1*math.Cos(th) - x2*math.Sin(th)
				w2 := x2*math.Cos(th) + x1*math.Sin(th)
				if math.Abs(w1-float64(got[(h*L+i)*Dh+j])) > 1e-4 || math.Abs(w2-float64(got[(h*L+i)*Dh+j+Dh/2])) > 1e-4 {
					t.Fatalf("rope at h%d i%d j%d", h, i, j)
				}
			}
		}
	}
}

// TestLinearRowsIndependentOfL: row i of Linear(x) is bit-identical to
// Linear of x_i alone and of any slice containing it, for every weight kind
// and kernel (fused decode vs expanded prefill, 1×4 vs 2×4 blocks).
func TestLinearRowsIndependentOfL(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const N, K, L = 13, 128, 7
	kernels := []bool{false}
	if hasSIMD() {
		kernels = append(kernels, true)
	}
	for _, kind := range []struct {
		dt       engine.DType
		bits, gs int
	}{{engine.F32, 0, 0}, {engine.BF16, 0, 0}, {engine.F16, 0, 0}, {0, 4, 32}, {0, 4, 64}, {0, 8, 32}, {0, 8, 128}, {0, 2, 32}} {
		for _, simd := range kernels {
			b := &Backend{threads: 2, simd: simd}
			w := randF32(r, N*K)
			lin := &engine.Linear{Bits: kind.bits, GroupSize: kind.gs}
			switch {
			case kind.bits > 0:
				q, s, bz, _ := quantize(w, N, K, kind.bits, kind.gs)
				sb, _ := halfBytes(s, engine.F16)
				bb, _ := halfBytes(bz, engine.F16)
				lin.W = b.FromBytes(u32Bytes(q), []int{N, K * kind.bits / 32}, engine.U32)
				lin.Scales = b.FromBytes(sb, []int{N, K / kind.gs}, engine.F16)
				lin.Biases = b.FromBytes(bb, []int{N, K / kind.gs}, engine.F16)
			case kind.dt == engine.F32:
				lin.W = b.FromFloat32(w, N, K)
			default:
				wb, _ := halfBytes(w, kind.dt)
				lin.W = b.FromBytes(wb, []int{N, K}, kind.dt)
			}
			x := randF32(r, L*K)
			all := get(t, b, b.Linear(b.FromFloat32(x, L, K), lin))
			for lo := range L {
				for _, hi := range []int{lo + 1, min(lo+2, L), L} {
					part := get(t, b, b.Linear(b.FromFloat32(x[lo*K:hi*K], hi-lo, K), lin))
					for i := range part {
						if math.Float32bits(part[i]) != math.Float32bits(all[lo*N+i]) {
							t.Fatalf("%v/%d-bit g%d simd=%v: rows [%d,%d) differ from the full product at %d: %v vs %v",
								kind.dt, kind.bits, kind.gs, simd, lo, hi, i, part[i], all[lo*N+i])
						}
					}
				}
			}
		}
	}
}

// TestParallelPanicReachesCaller: a panic on a worker goroutine surfaces on
// the calling goroutine (where the engine turns it into an error) instead of
// killing the process.
func TestParallelPanicReachesCaller(t *testing.T) {
	b := &Backend{threads: 4}
	defer func() {
		if r := recover(); r == nil || fmt.Sprint(r) != "boom" {
			t.Fatalf("recovered %v", r)
		}
	}()
	b.parallel(100, 1, func(lo, hi int) {
		if lo > 0 {
			panic("boom")
		}
	})
	t.Fatal("no panic")
}

// TestWeightedSumMatchesAxpy: attention's value sum (wsumAVX, the output row
// in registers) is bit-identical to one axpy per key, for head dims that
// take its eight-, four- and one-group paths.
func TestWeightedSumMatchesAxpy(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no AVX2+FMA")
	}
	r := rand.New(rand.NewPCG(21, 22))
	b := &Backend{threads: 1, simd: true}
	for _, dh := range []int{8, 40, 64, 96, 128} {
		for _, n := range []int{1, 7, 300} {
			p, v := randF32(r, n), randF32(r, n*dh)
			want, got := randF32(r, dh), make([]float32, dh)
			copy(got, want)
			for j := range n {
				b.axpy(p[j], v[j*dh:(j+1)*dh], want)
			}
			wsumAVX(&p[0], n, &v[0], 4*dh, &got[0], dh/8)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("dh %d, %d keys: [%d] = %v, axpy gives %v", dh, n, i, got[i], want[i])
				}
			}
		}
	}
}

// TestScaleMaxMatchesGo: attention's scaling and maximum (scaleMaxAVX)
// gives the Go loop's products and maximum, with NaN winning and -Inf
// (masked) scores kept.
func TestScaleMaxMatchesGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(23, 24))
	for _, n := range []int{1, 8, 13, 64, 301} {
		for _, special := range []float32{0, float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN())} {
			row := randF32(r, n)
			if special != 0 {
				row[r.IntN(n)] = special
			}
			want := append([]float32(nil), row...)
			wm := float32(math.Inf(-1))
			for j := range want {
				want[j] *= 0.125
				wm = max(wm, want[j])
			}
			for _, simd := range []bool{false, true} {
				got := append([]float32(nil), row...)
				gm := (&Backend{simd: simd}).scaleMax(got, 0.125, float32(math.Inf(-1)))
				if math.Float32bits(gm) != math.Float32bits(wm) && !(gm != gm && wm != wm) {
					t.Fatalf("n %d, %v, simd %v: max %v, want %v", n, special, simd, gm, wm)
				}
				for j := range got {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("n %d, %v, simd %v: [%d] = %v, want %v", n, special, simd, j, got[j], want[j])
					}
				}
			}
		}
	}
}
