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
	if HalfToFloat(FloatToHalf(1)) != 1 || FloatToBF16(1) != 0x3f80 {
		t.Fatal("exact values")
	}
	if Engine(Wire(engine.BF16)) != engine.BF16 || Wire(engine.I32) != 0 {
		t.Fatal("dtype maps")
	}
}
