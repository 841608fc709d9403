package kvconv

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func TestRoundTrips(t *testing.T) {
	vals := []float32{0, 1, -2.5, 0.1, 65504, 1e-5, -3.75e-3, 1024.5}
	src := f32bytes(vals...)
	for _, dt := range []engine.DType{engine.F16, engine.BF16} {
		half, err := Convert(src, engine.F32, dt)
		if err != nil {
			t.Fatal(err)
		}
		if len(half) != 2*len(vals) {
			t.Fatalf("%v: %d bytes", dt, len(half))
		}
		back, err := Convert(half, dt, engine.F32)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range vals {
			got := math.Float32frombits(binary.LittleEndian.Uint32(back[4*i:]))
			tol := float64(want) * 1e-3
			if dt == engine.BF16 {
				tol = float64(want) * 8e-3
			}
			if math.Abs(float64(got-want)) > math.Abs(tol)+1e-7 {
				t.Errorf("%v: %v → %v", dt, want, got)
			}
		}
		// half → other half goes through float32 exactly for values
		// representable in both.
		other := engine.BF16
		if dt == engine.BF16 {
			other = engine.F16
		}
		if _, err := Convert(half, dt, other); err != nil {
			t.Fatal(err)
		}
	}
	same, _ := Convert(src, engine.F32, engine.F32)
	if &same[0] != &src[0] {
		t.Fatal("equal dtypes should not copy")
	}
	if _, err := Convert([]byte{1, 2, 3}, engine.F32, engine.F16); err == nil {
		t.Fatal("ragged input accepted")
	}
	one16, _ := Convert(f32bytes(1), engine.F32, engine.F16)
	oneBF, _ := Convert(f32bytes(1), engine.F32, engine.BF16)
	if binary.LittleEndian.Uint16(one16) != 0x3c00 || binary.LittleEndian.Uint16(oneBF) != 0x3f80 {
		t.Fatal("exact values")
	}
	if Engine(Wire(engine.BF16)) != engine.BF16 || Wire(engine.I32) != 0 {
		t.Fatal("dtype maps")
	}
}

// The element conversions themselves (exhaustive over every 16-bit pattern
// and correctly rounded narrowing) are tested in runners/internal/half; here
// every f16 and bf16 pattern goes through Convert to f32 and back unchanged
// (NaNs: still NaN), so the KV path uses them bit-exactly.
func TestConvertAllHalves(t *testing.T) {
	le := binary.LittleEndian
	src := make([]byte, 2<<16)
	for h := range 1 << 16 {
		le.PutUint16(src[2*h:], uint16(h))
	}
	for _, dt := range []engine.DType{engine.F16, engine.BF16} {
		wide, err := Convert(src, dt, engine.F32)
		if err != nil {
			t.Fatal(err)
		}
		if len(wide) != 2*len(src) {
			t.Fatalf("%v: %d bytes widened to %d", dt, len(src), len(wide))
		}
		back, err := Convert(wide, engine.F32, dt)
		if err != nil {
			t.Fatal(err)
		}
		for h := range 1 << 16 {
			f := math.Float32frombits(le.Uint32(wide[4*h:]))
			if dt == engine.BF16 && le.Uint32(wide[4*h:]) != uint32(h)<<16 {
				t.Fatalf("bf16 %#04x widened to %#08x", h, le.Uint32(wide[4*h:]))
			}
			got := le.Uint16(back[2*h:])
			if f != f {
				if b := math.Float32frombits(uint32(got) << 16); dt == engine.BF16 && b == b {
					t.Fatalf("bf16 NaN %#04x came back as %#04x", h, got)
				}
				if dt == engine.F16 && (got&0x7c00 != 0x7c00 || got&0x3ff == 0) {
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

func TestConvertExactAndErrors(t *testing.T) {
	le := binary.LittleEndian
	src := f32bytes(1.5, -2.25, 1e-3)
	for _, to := range []engine.DType{engine.F16, engine.BF16, engine.F32} {
		mid, err := Convert(src, engine.F32, to)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Convert(mid, to, engine.F32)
		if err != nil {
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
	if _, err := Convert(src[:9], engine.F32, engine.BF16); err == nil {
		t.Fatal("odd source length accepted")
	}
	if _, err := Convert(src, engine.F32, engine.I32); err == nil {
		t.Fatal("unknown dtype accepted")
	}
}
