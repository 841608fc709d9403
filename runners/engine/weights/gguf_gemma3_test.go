package weights_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// TestGGUFGemma3 writes a tiny Gemma 3 as llama.cpp's converter lays it
// out (general.architecture gemma3, norms stored as 1 + w, ffn_norm /
// post_attention_norm / post_ffw_norm, attention.sliding_window, linear
// rope scaling) and checks that it loads to the same model as the
// safetensors original (with llama.cpp's fixed choices: every 6th layer
// global, attention scaled by 1/√head_dim): logits equal bit for bit on a
// prompt of 5 windows.
func TestGGUFGemma3(t *testing.T) {
	spec := testmodel.Spec{Arch: "gemma3", Seed: 5, Layers: 6, SlidingPattern: 6}
	dir := t.TempDir()
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	spec, _ = spec.Normalized()
	var cfg map[string]any
	raw, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["query_pre_attn_scalar"] = spec.HeadDim // llama.cpp's gemma3 scale
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	tensors, err := testmodel.Tensors(spec)
	if err != nil {
		t.Fatal(err)
	}
	ggufName := map[string]string{
		"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
		"pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
		"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
		"self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
		"mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
	}
	b := &weights.GGUFTestBuilder{}
	b.Str("general.architecture", "gemma3")
	for k, v := range map[string]int{"block_count": spec.Layers, "embedding_length": spec.Hidden,
		"feed_forward_length": spec.Intermediate, "attention.head_count": spec.Heads, "attention.head_count_kv": spec.KVHeads,
		"attention.key_length": spec.HeadDim, "attention.value_length": spec.HeadDim, "context_length": spec.MaxPositions,
		"attention.sliding_window": spec.SlidingWindow} {
		b.U32("gemma3."+k, uint32(v))
	}
	b.F32("gemma3.attention.layer_norm_rms_epsilon", 1e-5)
	b.F32("gemma3.rope.freq_base", 1e6)
	b.Str("gemma3.rope.scaling.type", "linear")
	b.F32("gemma3.rope.scaling.factor", 2)
	toks := make([]string, spec.Vocab)
	for i := range toks {
		toks[i] = fmt.Sprintf("t%d", i)
	}
	b.Str("tokenizer.ggml.model", "gpt2")
	b.Strs("tokenizer.ggml.tokens", toks)
	for _, x := range tensors {
		name := ""
		switch {
		case x.Name == "model.embed_tokens.weight":
			name = "token_embd.weight"
		case x.Name == "lm_head.weight":
			name = "output.weight"
		case x.Name == "model.norm.weight":
			name = "output_norm.weight"
		default:
			rest := strings.TrimPrefix(x.Name, "model.layers.")
			num, mod, _ := strings.Cut(rest, ".")
			mod = strings.TrimSuffix(mod, ".weight")
			name = "blk." + num + "." + ggufName[mod] + ".weight"
		}
		if x.DType != engine.F32 {
			t.Fatalf("%s: %v", x.Name, x.DType)
		}
		data := x.Data
		if strings.HasSuffix(x.Name, "norm.weight") {
			data = make([]byte, len(x.Data))
			for i := 0; i < len(data); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:]))
				binary.LittleEndian.PutUint32(data[i:], math.Float32bits(1+v))
			}
		}
		dims := make([]uint64, len(x.Shape))
		for i, d := range x.Shape {
			dims[len(dims)-1-i] = uint64(d)
		}
		b.Tensor(name, weights.TypeF32, data, dims...)
	}
	path := filepath.Join(t.TempDir(), "gemma3.gguf")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	be := cpu.New(1)
	load := func(p string) *engine.Model {
		src, err := weights.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		m, err := engine.LoadSource(ctx, src, be, engine.LoadOptions{CacheDType: engine.F32})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return m
	}
	hf, gg := load(dir), load(path)
	if w := gg.Info().Windows; !slices.Equal(w, []int{8, 8, 8, 8, 8, 0}) {
		t.Fatalf("GGUF layer windows %v", w)
	}
	p := testmodel.SlidingPrompts()[3]
	a, err := hf.Forward(ctx, hf.NewCache(), p)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gg.Forward(ctx, gg.NewCache(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, g) {
		t.Fatal("the GGUF gemma3 gives other logits than the safetensors model")
	}
}
