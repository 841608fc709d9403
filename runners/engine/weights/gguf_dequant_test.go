package weights

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// dequantMLX expands MLX affine-quantized rows (U32 words, F16 scales and
// biases) to float32: w = scale*q + bias.
func dequantMLX(t *testing.T, w, scales, biases engine.Tensor, bits, group int) [][]float32 {
	t.Helper()
	// F16 scales and biases; F32 for the embedding table (exact copies).
	if w.DType != engine.U32 || scales.DType != biases.DType || (scales.DType != engine.F16 && scales.DType != engine.F32) {
		t.Fatalf("dtypes %v %v %v", w.DType, scales.DType, biases.DType)
	}
	at := func(x engine.Tensor, g int) float32 {
		if x.DType == engine.F32 {
			return math.Float32frombits(binary.LittleEndian.Uint32(x.Data[4*g:]))
		}
		return F16ToF32(binary.LittleEndian.Uint16(x.Data[2*g:]))
	}
	rows, words := w.Shape[0], w.Shape[1]
	cols := words * 32 / bits
	if scales.Shape[0] != rows || scales.Shape[1] != cols/group || biases.Shape[1] != cols/group {
		t.Fatalf("shapes w %v scales %v biases %v", w.Shape, scales.Shape, biases.Shape)
	}
	out := make([][]float32, rows)
	mask := uint32(1)<<bits - 1
	for r := range out {
		out[r] = make([]float32, cols)
		for c := range out[r] {
			word := binary.LittleEndian.Uint32(w.Data[4*(r*words+c*bits/32):])
			q := word >> (uint(c*bits) % 32) & mask
			g := r*(cols/group) + c/group
			s, b := at(scales, g), at(biases, g)
			out[r][c] = s*float32(q) + b
		}
	}
	return out
}

type dequantFixture struct {
	Synthetic []struct {
		Type       string
		Rows, Cols int
		RawB64     string `json:"raw_b64"`
		Values     []float32
	}
	SmolLM2 []struct {
		Tensor string
		Type   string
		Dims   []int
		Rows   []int
		Values [][]float32
	} `json:"smollm2"`
}

func loadDequantFixture(t *testing.T) dequantFixture {
	b, err := os.ReadFile("../testdata/reference/gguf_dequant.json")
	if err != nil {
		t.Fatal(err)
	}
	var f dequantFixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func closeTo(a, b float32) bool {
	return math.Abs(float64(a-b)) <= 1e-6+1e-6*math.Abs(float64(b))
}

// TestGGUFToMLXMatchesGGUFPy checks every quantized GGUF type's → MLX
// conversion against gguf-py's dequantization: of blocks gguf-py quantized
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and of random K-quant blocks. The legacy
// types are exact but for f16 rounding of Q5_0's bias; Q4_K/Q5_K round
// their group scale d*sc and bias dmin*m to f16 (2^-11 relative); Q6_K is
// requantized to 8 bits (at most half an 8-bit step of its group's range,
// plus the f16 rounding of that step and of the group minimum).
func TestGGUFToMLXMatchesGGUFPy(t *testing.T) {
	types := map[string]GGMLType{"Q4_0": TypeQ4_0, "Q4_1": TypeQ4_1, "Q5_0": TypeQ5_0, "Q5_1": TypeQ5_1,
		"Q8_0": TypeQ8_0, "Q4_K": TypeQ4_K, "Q5_K": TypeQ5_K, "Q6_K": TypeQ6_K}
	seen := map[string]bool{}
	for _, c := range loadDequantFixture(t).Synthetic {
		seen[c.Type] = true
		t.Run(c.Type, func(t *testing.T) {
			raw, err := base64.StdEncoding.DecodeString(c.RawB64)
			if err != nil {
				t.Fatal(err)
			}
			typ, ok := types[c.Type]
			if !ok {
				t.Fatalf("fixture type %s unknown to the test", c.Type)
			}
			w, s, b, err := ggufToMLX(typ, raw, c.Rows, c.Cols)
			if err != nil {
				t.Fatal(err)
			}
			bits := mlxBits(typ)
			got := dequantMLX(t,
				engine.Tensor{DType: engine.U32, Shape: []int{c.Rows, c.Cols * bits / 32}, Data: w},
				engine.Tensor{DType: engine.F16, Shape: []int{c.Rows, c.Cols / 32}, Data: s},
				engine.Tensor{DType: engine.F16, Shape: []int{c.Rows, c.Cols / 32}, Data: b}, bits, 32)
			worst := 0.0
			for r := 0; r < c.Rows; r++ {
				for g := 0; g < c.Cols/32; g++ {
					want := c.Values[r*c.Cols+32*g : r*c.Cols+32*g+32]
					lo, hi := slices.Min(want), slices.Max(want)
					span := math.Max(math.Abs(float64(lo)), math.Abs(float64(hi)))
					var tol float64
					switch typ {
					case TypeQ4_0, TypeQ4_1, TypeQ8_0, TypeQ5_1:
						tol = 1e-6 + 1e-6*span
					case TypeQ5_0, TypeQ4_K, TypeQ5_K:
						tol = 1e-6 + 32*span/2048 // scale and bias each off by 2^-11 relative
					case TypeQ6_K:
						tol = 1e-6 + float64(hi-lo)/255*0.51 + 2*span/2048
					}
					for i, x := range want {
						if d := math.Abs(float64(got[r][32*g+i] - x)); d > tol {
							t.Fatalf("[%d,%d] = %v, gguf-py %v (off by %g, tolerance %g)", r, 32*g+i, got[r][32*g+i], x, d, tol)
						} else if span > 0 {
							worst = math.Max(worst, d/span)
						}
					}
				}
			}
			t.Logf("%s: worst error %.2g of the group's largest magnitude", c.Type, worst)
		})
	}
	for name := range types {
		if !seen[name] {
			t.Errorf("the fixture has no %s case (rerun scripts/reference/gguf_dequant.py)", name)
		}
	}
	if _, _, _, err := ggufToMLX(TypeQ4_0, make([]byte, 17), 1, 32); err == nil {
		t.Error("short block accepted")
	}
}

// TestGGUFSourceSmolLM2 opens the real SmolLM2 GGUF as a Source and checks
// HF names, shapes, the synthesized config and dequantized rows (after
// undoing llama.cpp's Q/K permutation) against gguf-py.
func TestGGUFSourceSmolLM2(t *testing.T) {
	path := testenv.SmolLM2(t)
	src, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var cfg struct {
		Architectures []string
		HiddenSize    int     `json:"hidden_size"`
		Layers        int     `json:"num_hidden_layers"`
		Heads         int     `json:"num_attention_heads"`
		KVHeads       int     `json:"num_key_value_heads"`
		HeadDim       int     `json:"head_dim"`
		Vocab         int     `json:"vocab_size"`
		RopeTheta     float64 `json:"rope_theta"`
		Eps           float64 `json:"rms_norm_eps"`
		Tie           bool    `json:"tie_word_embeddings"`
		Intermediate  int     `json:"intermediate_size"`
		Quantization  map[string]any
	}
	if err := json.Unmarshal(src.Config(), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Architectures[0] != "LlamaForCausalLM" || cfg.HiddenSize != 576 || cfg.Layers != 30 || cfg.Heads != 9 ||
		cfg.KVHeads != 3 || cfg.HeadDim != 64 || cfg.Vocab != 49152 || cfg.RopeTheta != 100000 || !cfg.Tie ||
		cfg.Intermediate != 1536 || math.Abs(cfg.Eps-1e-5) > 1e-12 {
		t.Errorf("config = %s", src.Config())
	}
	if cfg.Quantization["bits"] != 4.0 || cfg.Quantization["model.embed_tokens"] == nil {
		t.Errorf("quantization = %v", cfg.Quantization)
	}
	if q := src.Quant("model.embed_tokens"); q != (engine.QuantSpec{Bits: 8, GroupSize: 32}) {
		t.Errorf("embed quant %v", q)
	}
	if q := src.Quant("model.layers.29.mlp.down_proj"); q != (engine.QuantSpec{Bits: 4, GroupSize: 32}) {
		t.Errorf("down_proj quant %v", q)
	}
	if q := src.Quant("model.norm"); q.Bits != 0 {
		t.Errorf("norm quant %v", q)
	}
	names := src.Names()
	if len(names) != 1+61+210*3+0+2 && len(names) < 600 {
		t.Errorf("%d names", len(names))
	}
	for _, n := range names {
		if strings.HasPrefix(n, "blk.") || strings.HasPrefix(n, "token_embd") {
			t.Errorf("unmapped name %q", n)
		}
	}
	voc, err := src.Vocab()
	if err != nil || len(voc) != 49152 || voc[2] != "<|im_end|>" {
		t.Errorf("vocab %d %v", len(voc), err)
	}
	hf := map[string]string{
		"token_embd.weight":      "model.embed_tokens",
		"blk.0.attn_q.weight":    "model.layers.0.self_attn.q_proj",
		"blk.0.attn_k.weight":    "model.layers.0.self_attn.k_proj",
		"blk.3.ffn_down.weight":  "model.layers.3.mlp.down_proj",
		"blk.0.attn_norm.weight": "model.layers.0.input_layernorm",
		"output_norm.weight":     "model.norm",
	}
	for _, fx := range loadDequantFixture(t).SmolLM2 {
		prefix := hf[fx.Tensor]
		var rows [][]float32
		if fx.Type == "F32" {
			w, err := src.Tensor(prefix + ".weight")
			if err != nil {
				t.Fatal(err)
			}
			if w.DType != engine.F32 || len(w.Shape) != 1 || w.Shape[0] != fx.Dims[0] {
				t.Fatalf("%s: %v %v", prefix, w.DType, w.Shape)
			}
			row := make([]float32, w.Shape[0])
			for i := range row {
				row[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*i:]))
			}
			rows = [][]float32{row}
		} else {
			q := src.Quant(prefix)
			parts := make([]engine.Tensor, 3)
			for i, s := range []string{".weight", ".scales", ".biases"} {
				if parts[i], err = src.Tensor(prefix + s); err != nil {
					t.Fatal(err)
				}
			}
			rows = dequantMLX(t, parts[0], parts[1], parts[2], q.Bits, q.GroupSize)
			if len(rows) != fx.Dims[1] || len(rows[0]) != fx.Dims[0] {
				t.Fatalf("%s: HF shape %dx%d, GGUF dims %v", prefix, len(rows), len(rows[0]), fx.Dims)
			}
		}
		heads := 0
		switch fx.Tensor {
		case "blk.0.attn_q.weight":
			heads = 9
		case "blk.0.attn_k.weight":
			heads = 3
		}
		for k, g := range fx.Rows {
			r := g
			if heads > 0 { // GGUF row h*hd + 2i + j is HF row h*hd + j*hd/2 + i
				hd := fx.Dims[1] / heads
				h, within := g/hd, g%hd
				r = h*hd + (within%2)*(hd/2) + within/2
			}
			for c, want := range fx.Values[k] {
				if !closeTo(rows[r][c], want) {
					t.Fatalf("%s GGUF row %d (HF row %d) col %d = %v, gguf-py %v", fx.Tensor, g, r, c, rows[r][c], want)
				}
			}
		}
	}
}

func TestHalfConversions(t *testing.T) {
	for _, f := range []float32{0, 1, -2.5, 65504, 6.1035156e-05, 5.9604645e-08, 0.1, -0.3333} {
		h := F32ToF16(f)
		back := F16ToF32(h)
		if math.Abs(float64(back-f)) > math.Abs(float64(f))*1e-3+1e-7 {
			t.Errorf("f16 %v → %#x → %v", f, h, back)
		}
		bb := BF16ToF32(F32ToBF16(f))
		if math.Abs(float64(bb-f)) > math.Abs(float64(f))*1e-2 {
			t.Errorf("bf16 %v → %v", f, bb)
		}
	}
	if F32ToF16(1e6) != 0x7c00 || F16ToF32(0x3c00) != 1 || F32ToBF16(1) != 0x3f80 {
		t.Error("f16/bf16 constants")
	}
	// Exhaustive f16 round trip.
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaN
		}
		if got := F32ToF16(F16ToF32(uint16(h))); got != uint16(h) {
			t.Fatalf("f16 %#x round-trips to %#x", h, got)
		}
	}
}

func TestF16Mul(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 {
			continue // inf, NaN
		}
		for _, m := range []float32{-8, -128} {
			want := F32ToF16(F16ToF32(uint16(h)) * m)
			if got := f16Mul(uint16(h), m); got != want {
				t.Fatalf("f16Mul(%#x, %v) = %#x, want %#x", h, m, got, want)
			}
		}
	}
}
