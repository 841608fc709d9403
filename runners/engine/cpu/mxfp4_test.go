package cpu

import (
	"math"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// TestMXFP4Exact: every E2M1 code under several E8M0 scales dequantizes to
// exactly e2m1(code) · 2^(s-127) through the 8-bit affine form, and a
// Linear over it equals the dense product with those weights.
func TestMXFP4Exact(t *testing.T) {
	b := New(1)
	vals := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	const out, in = 4, 64
	words := make([]uint32, out*in/8)
	scales := make([]byte, out*in/32)
	want := make([]float32, out*in)
	for o := range out {
		for j := range in {
			code := uint32((o*7 + j) % 16)
			words[(o*in+j)/8] |= code << (4 * uint(j%8))
		}
		for g := range in / 32 {
			scales[o*in/32+g] = byte(120 + 3*o + g)
		}
		for j := range in {
			code := (o*7 + j) % 16
			want[o*in+j] = float32(vals[code] * math.Ldexp(1, int(scales[o*in/32+j/32])-127))
		}
	}
	wb := make([]byte, 4*len(words))
	for i, w := range words {
		wb[4*i], wb[4*i+1], wb[4*i+2], wb[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	}
	l := &engine.Linear{W: b.FromBytes(wb, []int{out, in / 8}, engine.U32), Scales: b.FromBytes(scales, []int{out, in / 32}, engine.U8),
		Bits: 4, GroupSize: 32, Mode: "mxfp4"}
	w := mxfp4Weight(l)
	row := make([]float32, in)
	for o := range out {
		w.row(row, o)
		for j := range in {
			if row[j] != want[o*in+j] {
				t.Fatalf("row %d col %d: %v, want %v", o, j, row[j], want[o*in+j])
			}
		}
	}
	x := make([]float32, 2*in)
	for i := range x {
		x[i] = float32(i%13) - 6
	}
	got, _ := b.Float32(b.Linear(b.FromFloat32(x, 2, in), l))
	dense, _ := b.Float32(b.Linear(b.FromFloat32(x, 2, in), &engine.Linear{W: b.FromFloat32(want, out, in)}))
	for i := range got {
		if math.Abs(float64(got[i]-dense[i])) > 1e-4*math.Max(1, math.Abs(float64(dense[i]))) {
			t.Fatalf("output %d: %v, dense %v", i, got[i], dense[i])
		}
	}
}
