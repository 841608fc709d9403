package testmodel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

func TestWriteIsDeterministicAndLoads(t *testing.T) {
	for _, r := range ReferenceSet() {
		t.Run(r.Name, func(t *testing.T) {
			a, b := t.TempDir(), t.TempDir()
			if err := Write(a, r.Spec); err != nil {
				t.Fatal(err)
			}
			if err := Write(b, r.Spec); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
				x, err1 := os.ReadFile(filepath.Join(a, f))
				y, err2 := os.ReadFile(filepath.Join(b, f))
				if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
					t.Fatalf("%s differs between writes (%v %v)", f, err1, err2)
				}
			}
			src, err := weights.Open(a)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			s, _ := r.Spec.Normalized()
			mlp := "model.layers.0.mlp.down_proj"
			if r.Spec.Arch == "qwen2moe" {
				mlp = "model.layers.0.mlp.shared_expert.gate_proj" // every layer is sparse
			}
			q := src.Quant(mlp)
			if q.Bits != s.QuantBits || q.GroupSize != s.GroupSize {
				t.Errorf("quant %v, spec %v/%v", q, s.QuantBits, s.GroupSize)
			}
			w, err := src.Tensor("model.layers.0.self_attn.q_proj.weight")
			if err != nil {
				t.Fatal(err)
			}
			wantCols := s.Hidden
			if s.QuantBits != 0 {
				wantCols = s.Hidden * s.QuantBits / 32
			}
			if w.Shape[0] != s.Heads*s.HeadDim || w.Shape[1] != wantCols {
				t.Errorf("q_proj shape %v", w.Shape)
			}
			if _, err = src.Tensor("lm_head.weight"); err != nil {
				t.Errorf("lm_head: %v", err)
			}
			_, err = src.Tensor("model.layers.1.self_attn.q_proj.bias")
			if (r.Spec.Arch == "qwen2" || r.Spec.Arch == "qwen2moe") != (err == nil) {
				t.Errorf("q bias: %v", err)
			}
			_, err = src.Tensor("model.layers.1.self_attn.k_norm.weight")
			if (r.Spec.Arch == "qwen3" || r.Spec.Arch == "qwen3moe") != (err == nil) {
				t.Errorf("k_norm: %v", err)
			}
			if r.Spec.Arch == "qwen3moe" {
				// Layer 1 is sparse: per-expert tensors (dense) or
				// mlx-lm's stacked switch_mlp with an 8-bit router.
				if s.QuantBits == 0 {
					e, err := src.Tensor("model.layers.1.mlp.experts.7.down_proj.weight")
					if err != nil || !slices.Equal(e.Shape, []int{s.Hidden, s.MoEIntermediate}) {
						t.Errorf("expert 7 down_proj: %v %v", e.Shape, err)
					}
				} else {
					e, err := src.Tensor("model.layers.1.mlp.switch_mlp.gate_proj.weight")
					if err != nil || !slices.Equal(e.Shape, []int{s.Experts, s.MoEIntermediate, s.Hidden * s.QuantBits / 32}) {
						t.Errorf("stacked gate_proj: %v %v", e.Shape, err)
					}
					if q := src.Quant("model.layers.1.mlp.gate"); q.Bits != 8 {
						t.Errorf("router quantization %v, want 8 bits", q)
					}
				}
				if _, err := src.Tensor("model.layers.1.mlp.gate_proj.weight"); err == nil {
					t.Error("sparse layer has a dense MLP")
				}
			}
			if r.Spec.Arch == "qwen2moe" {
				// A shared expert beside the routed ones; its gate is
				// 8-bit like the router when quantized.
				e, err := src.Tensor("model.layers.1.mlp.shared_expert.up_proj.weight")
				wantCols := s.Hidden
				if s.QuantBits != 0 {
					wantCols = s.Hidden * s.QuantBits / 32
				}
				if err != nil || !slices.Equal(e.Shape, []int{s.SharedExpertIntermediate, wantCols}) {
					t.Errorf("shared expert up_proj: %v %v", e.Shape, err)
				}
				if q := src.Quant("model.layers.1.mlp.shared_expert_gate"); s.QuantBits != 0 && q.Bits != 8 {
					t.Errorf("shared expert gate quantization %v, want 8 bits", q)
				}
				if _, err := src.Tensor("model.layers.0.mlp.gate.weight"); err != nil {
					t.Errorf("layer 0 router: %v", err)
				}
			}
			voc, err := src.Vocab()
			if err != nil || len(voc) != s.Vocab || voc[ImEndID(s.Vocab)] != "<|im_end|>" || voc[32] != "Ġ" {
				t.Errorf("vocab %d %v", len(voc), err)
			}
		})
	}
}

// TestQuantizeError checks the MLX affine quantization against the dense
// weights of the same seed: every dequantized element is within half a
// step (plus the bf16 rounding of scale and bias) of the original.
func TestQuantizeError(t *testing.T) {
	for _, bits := range []int{4, 8} {
		dense, err := Tensors(Spec{Arch: "llama", Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		quant, err := Tensors(Spec{Arch: "llama", Seed: 3, QuantBits: bits, GroupSize: 32})
		if err != nil {
			t.Fatal(err)
		}
		find := func(ts []engine.Tensor, name string) engine.Tensor {
			for _, x := range ts {
				if x.Name == name {
					return x
				}
			}
			t.Fatalf("no %s", name)
			return engine.Tensor{}
		}
		p := "model.layers.0.mlp.gate_proj"
		w := find(dense, p+".weight")
		qw, sc, bi := find(quant, p+".weight"), find(quant, p+".scales"), find(quant, p+".biases")
		rows, cols := w.Shape[0], w.Shape[1]
		per := 32 / bits
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				orig := math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*(r*cols+c):]))
				word := binary.LittleEndian.Uint32(qw.Data[4*((r*cols+c)/per):])
				q := word >> (uint((r*cols+c)%per) * uint(bits)) & (1<<bits - 1)
				g := r*(cols/32) + c/32
				s := math.Float32frombits(binary.LittleEndian.Uint32(sc.Data[4*g:]))
				b := math.Float32frombits(binary.LittleEndian.Uint32(bi.Data[4*g:]))
				if d := math.Abs(float64(s*float32(q) + b - orig)); d > float64(s)*0.5001+1e-6 {
					t.Fatalf("%d-bit [%d,%d]: %v vs %v (scale %v)", bits, r, c, s*float32(q)+b, orig, s)
				}
			}
		}
	}
}

func TestTokenizerJSON(t *testing.T) {
	b, err := TokenizerJSON(DefaultVocab)
	if err != nil {
		t.Fatal(err)
	}
	var tj struct {
		AddedTokens []struct {
			ID      int
			Content string
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int
			Merges []string
		}
	}
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	if len(tj.Model.Vocab) != DefaultVocab-3 || len(tj.Model.Merges) != DefaultVocab-259 {
		t.Fatalf("%d tokens, %d merges", len(tj.Model.Vocab), len(tj.Model.Merges))
	}
	// Every merge joins two known tokens into a known token with the next id.
	for i, m := range tj.Model.Merges {
		a, c, ok := strings.Cut(m, " ")
		_, okA := tj.Model.Vocab[a]
		_, okC := tj.Model.Vocab[c]
		if !ok || !okA || !okC || tj.Model.Vocab[a+c] != 256+i {
			t.Fatalf("merge %d %q", i, m)
		}
	}
	if tj.AddedTokens[2].Content != "<|im_end|>" || tj.AddedTokens[2].ID != int(ImEndID(DefaultVocab)) {
		t.Errorf("added tokens %v", tj.AddedTokens)
	}
	if _, err := TokenizerJSON(4000); err == nil {
		t.Error("a vocabulary larger than the training text allows was accepted")
	}
}

func TestSpecValidation(t *testing.T) {
	for _, s := range []Spec{
		{Arch: "gpt2"},
		{Arch: "llama", QuantBits: 3},
		{Arch: "llama", QuantBits: 4, GroupSize: 48},
		{Arch: "llama", Heads: 4, KVHeads: 3},
		{Arch: "llama", Vocab: 100},
		{Arch: "llama", DType: engine.U32},
	} {
		if err := Write(t.TempDir(), s); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// TestDense reads quantized models through Dense: no scales or biases are
// left, the config is a dense one of the asked dtype, every linear's
// weight is within half a quantization step of the dense model of the same
// seed (the bit order and groups are MLX's), bf16 is float32 rounded, and
// the other tensors keep their values.
func TestDense(t *testing.T) {
	dense, err := Tensors(Spec{Arch: "qwen3", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	orig := map[string]engine.Tensor{}
	for _, x := range dense {
		orig[x.Name] = x
	}
	for _, c := range []struct {
		bits, group int
		dt          engine.DType
	}{{4, 32, engine.F32}, {8, 64, engine.F32}, {4, 64, engine.BF16}} {
		dir := t.TempDir()
		if err := Write(dir, Spec{Arch: "qwen3", Seed: 5, QuantBits: c.bits, GroupSize: c.group}); err != nil {
			t.Fatal(err)
		}
		src, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := Dense(src, c.dt)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := engine.ParseConfig(ds.Config())
		if err != nil || cfg.Quant.Bits != 0 || cfg.DType != c.dt {
			t.Fatalf("%+v: config %+v %v", c, cfg, err)
		}
		quantized := 0
		for _, n := range ds.Names() {
			if strings.HasSuffix(n, ".scales") || strings.HasSuffix(n, ".biases") {
				t.Fatalf("%+v: %s listed", c, n)
			}
			p, _ := strings.CutSuffix(n, ".weight")
			sc, _ := src.Tensor(p + ".scales")
			got, err := ds.Tensor(n)
			if err != nil {
				t.Fatal(err)
			}
			want := orig[n]
			if got.DType != c.dt || !slices.Equal(got.Shape, want.Shape) {
				t.Fatalf("%+v: %s: %v %v, want %v %v", c, n, got.DType, got.Shape, c.dt, want.Shape)
			}
			g, w := floatsOf(t, got), floatsOf(t, want)
			var step []float32
			if src.Quant(p).Bits > 0 {
				quantized++
				step = floatsOf(t, sc)
			}
			for i := range w {
				tol := 0.0
				if step != nil {
					tol = float64(step[i/c.group])*0.5001 + 1e-6
				}
				if c.dt == engine.BF16 {
					tol += math.Abs(float64(g[i])) / 128 // bf16 keeps 8 significant bits
				}
				if d := math.Abs(float64(g[i] - w[i])); d > tol {
					t.Fatalf("%+v: %s[%d] = %v, want %v (±%v)", c, n, i, g[i], w[i], tol)
				}
			}
		}
		if quantized == 0 {
			t.Fatalf("%+v: no quantized linear checked", c)
		}
		if _, err := ds.Tensor("model.layers.0.mlp.up_proj.scales"); !errors.Is(err, engine.ErrNotFound) {
			t.Errorf("%+v: scales read through Dense: %v", c, err)
		}
		ds.Close()
	}
	if _, err := Dense(nil, engine.F16); err == nil {
		t.Error("Dense to float16 accepted")
	}
}

func floatsOf(t *testing.T, x engine.Tensor) []float32 {
	t.Helper()
	v, err := floats(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
