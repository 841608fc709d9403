package weights_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// TestGGUFGatedDeltaNetMatchesSafetensors writes the mlx-lm-checked
// hybrid fixtures as llama.cpp's converter lays them out and checks that
// each GGUF loads to the model its safetensors give: logits cosine ≥
// 0.9999999 (A_log comes back as log(-ssm_a), within an ulp) and the same
// greedy 16 tokens on a prompt of 40 tokens.
//
//   - Qwen3-Next (testdata/reference/qwen3_next: a dense layer 0, Gated
//     DeltaNet layers 0 and 2, attention layers 1 and 3, shared experts)
//     as qwen3next, in its current form (attn_qkv + attn_gate, grouped
//     ssm_ba) and its older one (ssm_in);
//   - Qwen3.5 dense and MoE (testdata/reference/qwen3_5*, 2 key heads and
//     4 value heads) as qwen35 / qwen35moe, value heads in the converter's
//     tiled order (rows of attn_qkv's v part, attn_gate, ssm_beta,
//     ssm_alpha, the conv kernel's v channels, ssm_a, ssm_dt; the columns of
//     ssm_out).
func TestGGUFGatedDeltaNetMatchesSafetensors(t *testing.T) {
	for _, tc := range []struct {
		name, dir, arch string
		legacy          bool
	}{
		{"qwen3next", "qwen3_next", "qwen3next", false},
		{"qwen3next-ssm_in", "qwen3_next", "qwen3next", true},
		{"qwen35", "qwen3_5", "qwen35", false},
		{"qwen35moe", "qwen3_5_moe", "qwen35moe", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGDNGGUF(t, filepath.Join("..", "testdata", "reference", tc.dir), tc.arch, tc.legacy)
		})
	}
}

func checkGDNGGUF(t *testing.T, dir, arch string, legacy bool) {
	src, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cfg, err := engine.ParseConfig(src.Config())
	if err != nil {
		t.Fatal(err)
	}
	Hk, Hv, Dk, Dv := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim
	r := Hv / Hk
	tiled := arch != "qwen3next"
	ctx := context.Background()
	be := cpu.New(1)
	load := func(p string) *engine.Model {
		s, err := weights.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m, err := engine.LoadSource(ctx, s, be, engine.LoadOptions{CacheDType: engine.F32})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return m
	}
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % 500)
	}
	run := func(m *engine.Model) ([]float32, []int32) {
		c := m.NewCache()
		logits, err := m.Forward(ctx, c, prompt)
		if err != nil {
			t.Fatal(err)
		}
		first := slices.Clone(logits)
		var greedy []int32
		for range 16 {
			tok := int32(slices.Index(logits, slices.Max(logits)))
			greedy = append(greedy, tok)
			if logits, err = m.Forward(ctx, c, []int32{tok}); err != nil {
				t.Fatal(err)
			}
		}
		return first, greedy
	}
	wantLogits, wantGreedy := run(load(dir))

	// tile reorders blocks of w values (rows of rowLen floats, or
	// columns when cols) from grouped by key head (g·r + j) to the
	// converter's tiled order (j·Hk + g), after the first skip values.
	tile := func(v []float32, rowLen, skip, w int) []float32 {
		if !tiled || r == 1 {
			return v
		}
		out := slices.Clone(v)
		for h := range Hv {
			p := (h%r)*Hk + h/r
			copy(out[(skip+p*w)*rowLen:(skip+(p+1)*w)*rowLen], v[(skip+h*w)*rowLen:(skip+(h+1)*w)*rowLen])
		}
		return out
	}
	tileCols := func(v []float32, cols, w int) []float32 {
		if !tiled || r == 1 {
			return v
		}
		out := slices.Clone(v)
		for row := 0; row < len(v)/cols; row++ {
			for h := range Hv {
				p := (h%r)*Hk + h/r
				copy(out[row*cols+p*w:row*cols+(p+1)*w], v[row*cols+h*w:row*cols+(h+1)*w])
			}
		}
		return out
	}

	b := &weights.GGUFTestBuilder{}
	b.Str("general.architecture", arch)
	meta := map[string]int{"block_count": cfg.Layers, "embedding_length": cfg.Hidden,
		"feed_forward_length": cfg.Intermediate, "attention.head_count": cfg.Heads, "attention.head_count_kv": cfg.KVHeads,
		"attention.key_length": cfg.HeadDim, "attention.value_length": cfg.HeadDim, "context_length": cfg.MaxPositions,
		"ssm.conv_kernel": cfg.LinearConvKernel, "ssm.state_size": Dk, "ssm.group_count": Hk, "ssm.time_step_rank": Hv,
		"ssm.inner_size": Hv * Dv, "rope.dimension_count": cfg.HeadDim / 4, "full_attention_interval": cfg.FullAttentionInterval}
	if cfg.Experts > 0 {
		meta["expert_count"], meta["expert_used_count"], meta["expert_feed_forward_length"] = cfg.Experts, cfg.ExpertsPerToken, cfg.MoEIntermediate
		meta["expert_shared_feed_forward_length"] = cfg.SharedExpertIntermediate
	}
	for k, v := range meta {
		b.U32(arch+"."+k, uint32(v))
	}
	if tiled {
		b.I32s(arch+".rope.dimension_sections", []int32{2, 1, 1, 0})
	}
	b.F32(arch+".attention.layer_norm_rms_epsilon", 1e-6)
	b.F32(arch+".rope.freq_base", 10000)
	vocab, err := src.Vocab()
	if err != nil {
		t.Fatal(err)
	}
	b.Str("tokenizer.ggml.model", "gpt2")
	b.Strs("tokenizer.ggml.tokens", vocab)
	f32 := func(name string, v []float32, dims ...uint64) {
		data := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
		}
		b.Tensor(name, weights.TypeF32, data, dims...)
	}
	D := cfg.Hidden
	for _, name := range src.Names() {
		x, err := src.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if x.DType != engine.F32 {
			t.Fatalf("%s: %v", name, x.DType)
		}
		v := make([]float32, len(x.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(x.Data[4*i:]))
		}
		dims := make([]uint64, len(x.Shape))
		for i, d := range x.Shape {
			dims[len(dims)-1-i] = uint64(d)
		}
		name = strings.TrimPrefix(name, "language_model.")
		if gg := ggufQwen3NextName(name); gg != "" {
			f32(gg, v, dims...)
			continue
		}
		num, mod, _ := strings.Cut(strings.TrimPrefix(name, "model.layers."), ".")
		blk := "blk." + num + "."
		switch mod {
		case "linear_attn.in_proj_qkvz.weight":
			if legacy {
				f32(blk+"ssm_in.weight", v, dims...)
				continue
			}
			// Per key head [q, k, v (r heads), z (r heads)] → q of all
			// heads, k of all, v of all; z apart.
			group := 2*Dk + 2*r*Dv
			var q, k, vv, z []float32
			for g := range Hk {
				row := func(i int) []float32 { return v[(g*group+i)*D : (g*group+i+1)*D] }
				for i := range group {
					switch {
					case i < Dk:
						q = append(q, row(i)...)
					case i < 2*Dk:
						k = append(k, row(i)...)
					case i < 2*Dk+r*Dv:
						vv = append(vv, row(i)...)
					default:
						z = append(z, row(i)...)
					}
				}
			}
			qkv := append(append(q, k...), vv...)
			f32(blk+"attn_qkv.weight", qkv, uint64(D), uint64(len(qkv)/D))
			f32(blk+"attn_gate.weight", z, uint64(D), uint64(len(z)/D))
		case "linear_attn.in_proj_qkv.weight":
			f32(blk+"attn_qkv.weight", tile(v, D, 2*Hk*Dk, Dv), dims...)
		case "linear_attn.in_proj_z.weight":
			f32(blk+"attn_gate.weight", tile(v, D, 0, Dv), dims...)
		case "linear_attn.in_proj_b.weight":
			f32(blk+"ssm_beta.weight", tile(v, D, 0, 1), dims...)
		case "linear_attn.in_proj_a.weight":
			f32(blk+"ssm_alpha.weight", tile(v, D, 0, 1), dims...)
		case "linear_attn.in_proj_ba.weight":
			f32(blk+"ssm_ba.weight", v, dims...)
		case "linear_attn.conv1d.weight": // [C, K, 1] → GGUF {K, C}
			f32(blk+"ssm_conv1d.weight", tile(v, x.Shape[1], 2*Hk*Dk, Dv), uint64(x.Shape[1]), uint64(x.Shape[0]))
		case "linear_attn.A_log":
			for i := range v {
				v[i] = float32(-math.Exp(float64(v[i])))
			}
			f32(blk+"ssm_a", tile(v, 1, 0, 1), dims...)
		case "linear_attn.dt_bias":
			f32(blk+"ssm_dt.bias", tile(v, 1, 0, 1), dims...)
		case "linear_attn.out_proj.weight":
			f32(blk+"ssm_out.weight", tileCols(v, x.Shape[1], Dv), dims...)
		case "mlp.shared_expert_gate.weight": // [1, D] → {D}
			f32(blk+"ffn_gate_inp_shexp.weight", v, uint64(D))
		default:
			t.Fatalf("no GGUF name for %s", name)
		}
	}
	path := filepath.Join(t.TempDir(), arch+".gguf")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	logits, greedy := run(load(path))
	cs := fixture.Cosine(logits, wantLogits)
	t.Logf("cosine %.9f, greedy %v", cs, greedy)
	if cs < 0.9999999 || !slices.Equal(greedy, wantGreedy) {
		t.Errorf("cosine %.9f, greedy %v; safetensors greedy %v", cs, greedy, wantGreedy)
	}
}

// ggufQwen3NextName is the GGUF name of the tensors that map one to one.
func ggufQwen3NextName(hf string) string {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight"
	case "model.norm.weight":
		return "output_norm.weight"
	case "lm_head.weight":
		return "output.weight"
	}
	num, mod, _ := strings.Cut(strings.TrimPrefix(hf, "model.layers."), ".")
	gg := map[string]string{
		"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "post_attention_norm",
		"self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
		"self_attn.o_proj.weight": "attn_output", "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
		"linear_attn.norm.weight": "ssm_norm",
		"mlp.gate_proj.weight":    "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down",
		"mlp.gate.weight": "ffn_gate_inp", "mlp.switch_mlp.gate_proj.weight": "ffn_gate_exps",
		"mlp.switch_mlp.up_proj.weight": "ffn_up_exps", "mlp.switch_mlp.down_proj.weight": "ffn_down_exps",
		"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp", "mlp.shared_expert.up_proj.weight": "ffn_up_shexp",
		"mlp.shared_expert.down_proj.weight": "ffn_down_shexp",
	}[mod]
	if gg == "" {
		return ""
	}
	return "blk." + num + "." + gg + ".weight"
}
