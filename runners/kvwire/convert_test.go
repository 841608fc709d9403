package kvwire

import (
	"math"
	"testing"
)

// The element conversions themselves (exhaustive over every 16-bit pattern
// and correctly rounded narrowing) are tested in runners/internal/half; here
// every f16 and bf16 pattern goes through Convert to f32 and back unchanged
// (NaNs: still NaN), so the wire path uses them bit-exactly.
func TestConvertAllHalves(t *testing.T) {
	src := make([]byte, 2<<16)
	for h := range 1 << 16 {
		le.PutUint16(src[2*h:], uint16(h))
	}
	for _, dt := range []DType{DTypeF16, DTypeBF16} {
		wide := make([]byte, ConvertedLen(len(src), dt, DTypeF32))
		if err := Convert(wide, DTypeF32, src, dt); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(src))
		if err := Convert(back, dt, wide, DTypeF32); err != nil {
			t.Fatal(err)
		}
		for h := range 1 << 16 {
			f := math.Float32frombits(le.Uint32(wide[4*h:]))
			if dt == DTypeBF16 && le.Uint32(wide[4*h:]) != uint32(h)<<16 {
				t.Fatalf("bf16 %#04x widened to %#08x", h, le.Uint32(wide[4*h:]))
			}
			got := le.Uint16(back[2*h:])
			if f != f {
				if b := math.Float32frombits(uint32(got) << 16); dt == DTypeBF16 && b == b {
					t.Fatalf("bf16 NaN %#04x came back as %#04x", h, got)
				}
				if dt == DTypeF16 && (got&0x7c00 != 0x7c00 || got&0x3ff == 0) {
					t.Fatalf("f16 NaN %#04x came back as %#04x", h, got)
				}
				continue
			}
			if got != uint16(h) {
				t.Fatalf("%v %#04x → f32 → %#04x", dt, h, got)
			}
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
