package weights_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

func float(t engine.Tensor, i int) float64 {
	switch t.DType {
	case engine.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:])))
	case engine.BF16:
		return float64(weights.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
	case engine.F16:
		return float64(weights.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
	}
	panic("not a float tensor")
}

// TestReadsMLXQuantizedModels opens directories quantized by MLX itself
// (mlx_lm.convert, see scripts/reference/mlx_quantized.py) and checks that
// every quantized linear, dequantized as w = scale*q + bias from our
// reading of the packing, is within one quantization step (plus the
// rounding of bf16 scales and biases) of the original weights that
// testmodel regenerates.
func TestReadsMLXQuantizedModels(t *testing.T) {
	for _, c := range []struct {
		dir         string
		dtype       engine.DType
		bits, group int
	}{
		{"llama-mlx-q4g32", engine.F32, 4, 32},
		{"llama-mlx-q8g64-bf16", engine.BF16, 8, 64},
	} {
		t.Run(c.dir, func(t *testing.T) {
			src, err := weights.Open("../testdata/reference/mlx_quantized/" + c.dir)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			orig, err := testmodel.Tensors(testmodel.Spec{Arch: "llama", DType: c.dtype, Seed: 5, Layers: 1,
				Hidden: 64, Heads: 2, KVHeads: 1, Intermediate: 128, Vocab: 320})
			if err != nil {
				t.Fatal(err)
			}
			checked := 0
			for _, o := range orig {
				prefix := o.Name[:len(o.Name)-len(".weight")]
				if len(o.Shape) != 2 {
					continue
				}
				q := src.Quant(prefix)
				if q != (engine.QuantSpec{Bits: c.bits, GroupSize: c.group}) {
					t.Fatalf("%s: quant %v", prefix, q)
				}
				w, err1 := src.Tensor(prefix + ".weight")
				sc, err2 := src.Tensor(prefix + ".scales")
				bi, err3 := src.Tensor(prefix + ".biases")
				if err1 != nil || err2 != nil || err3 != nil {
					t.Fatal(err1, err2, err3)
				}
				rows, cols := o.Shape[0], o.Shape[1]
				if w.DType != engine.U32 || w.Shape[0] != rows || w.Shape[1] != cols*c.bits/32 || sc.Shape[1] != cols/c.group {
					t.Fatalf("%s: shapes w %v %v scales %v", prefix, w.DType, w.Shape, sc.Shape)
				}
				per := 32 / c.bits
				for r := 0; r < rows; r++ {
					for col := 0; col < cols; col++ {
						i := r*cols + col
						word := binary.LittleEndian.Uint32(w.Data[4*(i/per):])
						qv := word >> (uint(i%per) * uint(c.bits)) & (1<<c.bits - 1)
						g := r*(cols/c.group) + col/c.group
						s := float(sc, g)
						got := s*float64(qv) + float(bi, g)
						// One step (MLX moves the grid so that 0 is exact and
						// clips the far end), plus bf16 rounding of scale and
						// bias (relative 2^-8 each) when they are bf16.
						bound := math.Abs(s)*1.01 + 1e-6
						if c.dtype == engine.BF16 {
							bound += (math.Abs(s)*float64(int(1)<<c.bits-1) + math.Abs(float(bi, g))) / 256
						}
						if d := math.Abs(got - float(o, i)); d > bound {
							t.Fatalf("%s[%d,%d]: dequantized %v, original %v (scale %v)", prefix, r, col, got, float(o, i), s)
						}
					}
				}
				checked++
			}
			if checked != 9 { // embed, lm_head, q, k, v, o, gate, up, down
				t.Errorf("checked %d quantized linears", checked)
			}
		})
	}
}
