package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExp32: within 2e-7 relative of math.Exp on [-87.3, 0], exact at 0,
// NaN kept, and tiny (not zero, not negative) below the range.
func TestExp32(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 200000; i++ {
		x := float32(-87.3 * float64(i) / 200000)
		got, want := float64(exp32(x)), math.Exp(float64(x))
		worst = max(worst, math.Abs(got-want)/want)
	}
	if worst > 2e-7 {
		t.Fatalf("worst relative error %g", worst)
	}
	if exp32(0) != 1 {
		t.Fatalf("exp32(0) = %v", exp32(0))
	}
	if v := exp32(float32(math.NaN())); v == v {
		t.Fatalf("exp32(NaN) = %v", v)
	}
	if v := exp32(float32(math.Inf(-1))); !(v > 0 && v < 1e-37) {
		t.Fatalf("exp32(-Inf) = %v", v)
	}
}

// TestExpSumAVXMatchesGo: the vector softmax numerator and sum equal the Go
// code's bits for every length (tails included) and with NaN inside.
func TestExpSumAVXMatchesGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(31, 32))
	for _, n := range []int{1, 7, 8, 9, 31, 64, 1000} {
		row := make([]float32, n)
		for i := range row {
			row[i] = float32(r.NormFloat64() * 20)
		}
		if n == 64 {
			row[13] = float32(math.NaN())
			row[20] = -1e30
		}
		m := float32(math.Inf(-1))
		for _, v := range row {
			m = max(m, v)
		}
		if n == 64 {
			m = 30
		}
		a, g := append([]float32(nil), row...), append([]float32(nil), row...)
		sa := (&Backend{simd: true}).expSum(a, m)
		sg := (&Backend{}).expSum(g, m)
		if math.Float32bits(sa) != math.Float32bits(sg) && !(sa != sa && sg != sg) {
			t.Fatalf("n %d: sum %v, Go %v", n, sa, sg)
		}
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(g[i]) && !(a[i] != a[i] && g[i] != g[i]) {
				t.Fatalf("n %d: [%d] = %v, Go %v (x %v)", n, i, a[i], g[i], row[i]-m)
			}
		}
	}
}

// TestSwiGLUAVXMatchesGo: the vector SwiGLU equals silu32(g)·u bit for bit,
// across signs, large magnitudes, ±0 and NaN, and stays within 1e-6
// relative of the float64 formula.
func TestSwiGLUAVXMatchesGo(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	const n = 1003
	g, u := make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(5)-2)))
		u[i] = float32(r.NormFloat64())
	}
	g[0], g[1], g[2], g[3], g[4] = 0, float32(math.Copysign(0, -1)), 200, -200, float32(math.NaN())
	for _, simd := range []bool{false, hasSIMD()} {
		out := make([]float32, n)
		swiglu(out, g, u, simd)
		for i := range out {
			want := silu32(g[i]) * u[i]
			if math.Float32bits(out[i]) != math.Float32bits(want) && !(out[i] != out[i] && want != want) {
				t.Fatalf("simd=%v [%d] g=%v: %v, want %v", simd, i, g[i], out[i], want)
			}
			if i >= 5 {
				exact := float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i])
				if math.Abs(float64(out[i])-exact) > 1e-6*math.Abs(exact)+1e-30 {
					t.Fatalf("[%d] g=%v: %v, float64 %v", i, g[i], out[i], exact)
				}
			}
		}
	}
}
