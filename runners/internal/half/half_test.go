package half

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

func f16Value(h uint16) float64 { return float64(F16ToF32(h)) }

// Every f16 bit pattern widens to its exact IEEE value and (NaNs aside)
// survives f16 → f32 → f16.
func TestF16Widen(t *testing.T) {
	for h := range 1 << 16 {
		got := f16Value(uint16(h))
		want := halfExact(uint16(h))
		if math.IsNaN(want) != math.IsNaN(got) || (!math.IsNaN(want) && (got != want || math.Signbit(got) != math.Signbit(want))) {
			t.Fatalf("f16 %#04x: %v, want %v", h, got, want)
		}
		if !math.IsNaN(want) {
			if back := F32ToF16(F16ToF32(uint16(h))); back != uint16(h) {
				t.Fatalf("f16 %#04x → f32 → %#04x", h, back)
			}
		} else if bits := math.Float32bits(F16ToF32(uint16(h))); bits>>13&0x3ff != uint32(h)&0x3ff {
			t.Fatalf("f16 NaN %#04x lost its payload: %#08x", h, bits)
		}
	}
}

// Every bf16 bit pattern widens exactly and (NaNs aside) round trips.
func TestBF16Widen(t *testing.T) {
	for h := range 1 << 16 {
		f := BF16ToF32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("bf16 %#04x → %#08x", h, math.Float32bits(f))
		}
		if f == f {
			if back := F32ToBF16(f); back != uint16(h) {
				t.Fatalf("bf16 %#04x → f32 → %#04x", h, back)
			}
		} else if back := F32ToBF16(f); back != uint16(h)|0x40 {
			t.Fatalf("bf16 NaN %#04x → %#04x, want quieted %#04x", h, back, uint16(h)|0x40)
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
	bf16 := func(b uint16) float64 { return float64(BF16ToF32(b)) }
	rng := rand.New(rand.NewPCG(1, 2))
	vals := []float32{0, 1, -1, 0.1, 65504, 65519, 65520, 1e-8, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 3.0517578e-05, 1.5, 2.5, 1 + 1.0/2048, 1 + 3.0/2048}
	for range 200000 {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
		vals = append(vals, float32(rng.NormFloat64()*math.Pow(2, float64(rng.IntN(40)-20))))
	}
	for _, x := range vals {
		xf := float64(x)
		if math.IsNaN(xf) {
			if h := F32ToF16(x); !math.IsNaN(f16Value(h)) {
				t.Fatalf("NaN → f16 %#04x", h)
			}
			if b := F32ToBF16(x); !math.IsNaN(bf16(b)) {
				t.Fatalf("NaN → bf16 %#04x", b)
			}
			continue
		}
		h := F32ToF16(x)
		if math.Abs(xf) >= 65520 {
			if !math.IsInf(f16Value(h), 0) || math.Signbit(f16Value(h)) != math.Signbit(xf) {
				t.Fatalf("%g → f16 %#04x, want ±Inf", xf, h)
			}
		} else if !nearestOK(xf, h, f16Value) {
			t.Fatalf("%g → f16 %#04x (%g) is not the nearest", xf, h, f16Value(h))
		}
		b := F32ToBF16(x)
		if !math.IsInf(bf16(b), 0) && !nearestOK(xf, b, bf16) {
			t.Fatalf("%g → bf16 %#04x (%g) is not the nearest", xf, b, bf16(b))
		}
	}
}

func TestKnownValues(t *testing.T) {
	for _, c := range []struct {
		f float32
		h uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {1e6, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {6.103515625e-05, 0x0400},
		{0.333251953125, 0x3555},
	} {
		if got := F32ToF16(c.f); got != c.h {
			t.Errorf("F32ToF16(%v) = %#x, want %#x", c.f, got, c.h)
		}
		if c.h != 0x7c00 {
			if got := F16ToF32(c.h); got != c.f {
				t.Errorf("F16ToF32(%#x) = %v, want %v", c.h, got, c.f)
			}
		}
	}
	if got := F32ToF16(float32(math.Copysign(0, -1))); got != 0x8000 {
		t.Errorf("-0 → f16 %#x", got)
	}
	if got := F32ToBF16(1.00390625); got != 0x3f80 { // tie → even
		t.Errorf("bf16 tie rounding %#x", got)
	}
	if got := F32ToBF16(1.01171875); got != 0x3f82 { // 1 + 3/256: tie → even up
		t.Errorf("bf16 tie rounding up %#x", got)
	}
}

// The slice forms agree with the scalar ones on every 16-bit pattern.
func TestSlices(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	f := make([]float32, len(all))
	WidenF16(f, all)
	for i, h := range all {
		if math.Float32bits(f[i]) != math.Float32bits(F16ToF32(h)) {
			t.Fatalf("WidenF16 %#x", h)
		}
	}
	n := make([]uint16, len(all))
	NarrowF16(n, f)
	for i := range all {
		if n[i] != F32ToF16(f[i]) {
			t.Fatalf("NarrowF16 %v", f[i])
		}
	}
	WidenBF16(f, all)
	for i, h := range all {
		if math.Float32bits(f[i]) != uint32(h)<<16 {
			t.Fatalf("WidenBF16 %#x", h)
		}
	}
	NarrowBF16(n, f)
	for i := range all {
		if n[i] != F32ToBF16(f[i]) {
			t.Fatalf("NarrowBF16 %v", f[i])
		}
	}
}

func BenchmarkNarrow(b *testing.B) {
	src := make([]float32, 4096)
	for i := range src {
		src[i] = float32(i) * 0.37
	}
	dst := make([]uint16, len(src))
	for _, c := range []struct {
		name   string
		narrow func(dst []uint16, src []float32)
	}{{"BF16", NarrowBF16}, {"F16", NarrowF16}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(4 * len(src)))
			b.ReportAllocs()
			for b.Loop() {
				c.narrow(dst, src)
			}
		})
	}
}
