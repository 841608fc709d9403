package kvwire

import (
	"math"
	"math/rand/v2"
	"testing"
)

// halfExact computes a half's value from the IEEE definition.
func halfExact(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return s * math.Inf(1)
	case 0:
		return s * math.Ldexp(m, -24)
	}
	return s * math.Ldexp(1024+m, e-25)
}

func TestF16Widen(t *testing.T) {
	for h := range 1 << 16 {
		got := f16Value(uint16(h))
		want := halfExact(uint16(h))
		if math.IsNaN(want) != math.IsNaN(got) || (!math.IsNaN(want) && (got != want || math.Signbit(got) != math.Signbit(want))) {
			t.Fatalf("f16 %#04x: %v, want %v", h, got, want)
		}
		if !math.IsNaN(want) {
			if back := f32ToF16(f16ToF32(uint16(h))); back != uint16(h) {
				t.Fatalf("f16 %#04x → f32 → %#04x", h, back)
			}
		}
	}
}

// nearestOK checks that r is a correctly rounded (ties to even) narrowing
// of x given the value function and the neighbours r±1.
func nearestOK(x float64, r uint16, val func(uint16) float64) bool {
	v := val(r)
	if math.IsInf(v, 0) {
		return true // overflow handled separately
	}
	d := math.Abs(x - v)
	for _, n := range []uint16{r + 1, r - 1} {
		if n&0x7fff == 0x7fff || n>>15 != r>>15 && r&0x7fff != 0 {
			continue
		}
		nv := val(n)
		if math.IsNaN(nv) || math.IsInf(nv, 0) {
			continue
		}
		nd := math.Abs(x - nv)
		if nd < d || (nd == d && r&1 == 1) {
			return false
		}
	}
	return true
}

func TestF32Narrow(t *testing.T) {
	bf16 := func(b uint16) float64 { return float64(math.Float32frombits(uint32(b) << 16)) }
	rng := rand.New(rand.NewPCG(1, 2))
	vals := []float32{0, 1, -1, 0.1, 65504, 65519, 65520, 1e-8, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 3.0517578e-05, 1.5, 2.5, 1 + 1.0/2048, 1 + 3.0/2048}
	for range 200000 {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
		vals = append(vals, float32(rng.NormFloat64()*math.Pow(2, float64(rng.IntN(40)-20))))
	}
	for _, x := range vals {
		f := math.Float32bits(x)
		xf := float64(x)
		if math.IsNaN(xf) {
			if h := f32ToF16(f); !math.IsNaN(f16Value(h)) {
				t.Fatalf("NaN → f16 %#04x", h)
			}
			if b := f32ToBF16(f); !math.IsNaN(bf16(b)) {
				t.Fatalf("NaN → bf16 %#04x", b)
			}
			continue
		}
		h := f32ToF16(f)
		if math.Abs(xf) >= 65520 {
			if !math.IsInf(f16Value(h), 0) || math.Signbit(f16Value(h)) != math.Signbit(xf) {
				t.Fatalf("%g → f16 %#04x, want ±Inf", xf, h)
			}
		} else if !nearestOK(xf, h, f16Value) {
			t.Fatalf("%g → f16 %#04x (%g) is not the nearest", xf, h, f16Value(h))
		}
		b := f32ToBF16(f)
		if !math.IsInf(bf16(b), 0) && !nearestOK(xf, b, bf16) {
			t.Fatalf("%g → bf16 %#04x (%g) is not the nearest", xf, b, bf16(b))
		}
	}
}

func TestConvert(t *testing.T) {
	src := make([]byte, 4*3)
	for i, v := range []float32{1.5, -2.25, 1e-3} {
		le.PutUint32(src[4*i:], math.Float32bits(v))
	}
	for _, to := range []DType{DTypeF16, DTypeBF16, DTypeF32} {
		mid := make([]byte, ConvertedLen(len(src), DTypeF32, to))
		if err := Convert(mid, to, src, DTypeF32); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(src))
		if err := Convert(back, DTypeF32, mid, to); err != nil {
			t.Fatal(err)
		}
		for i := range 2 { // 1.5 and -2.25 are exact in every dtype
			if le.Uint32(back[4*i:]) != le.Uint32(src[4*i:]) {
				t.Fatalf("%v: element %d changed", to, i)
			}
		}
		if got := math.Float32frombits(le.Uint32(back[8:])); math.Abs(float64(got)-1e-3) > 1e-5 {
			t.Fatalf("%v: 1e-3 came back as %g", to, got)
		}
	}
	bf := make([]byte, 6)
	if err := Convert(bf, DTypeBF16, src[:9], DTypeF32); err == nil {
		t.Fatal("odd source length accepted")
	}
	if err := Convert(bf, 9, src, DTypeF32); err == nil {
		t.Fatal("unknown dtype accepted")
	}
}
