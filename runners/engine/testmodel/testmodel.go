// Package testmodel writes tiny deterministic random-weight models in HF
// safetensors form for tests: Llama (with Llama 3 RoPE scaling), Qwen2
// (q/k/v biases), Qwen3 (q/k RMSNorm, tied embeddings, head_dim ≠
// hidden/heads), Qwen3-MoE (layer 0 dense, the others routed experts:
// one tensor per expert as HF stores them when dense, stacked as mlx-lm's
// switch_mlp with an 8-bit router when quantized) and Qwen2-MoE (Qwen2
// attention, every layer routed experts plus a shared expert behind a
// sigmoid gate, whose gate is 8-bit like the router when quantized), in f32 or bf16, dense or MLX affine-quantized (4/8-bit,
// loadable by mlx-lm), with a real byte-level BPE tokenizer.json (merges
// learned from an embedded text) and a ChatML chat template.
// WriteHarmony gives the gpt-oss one a harmony tokenizer instead. Dense
// presents a quantized checkpoint (a real model's GGUF, say) as a dense
// f32 or bf16 one, for benchmarks of the dense matrix products.
//
// It owns only the generation of such directories; it must not depend on
// backends or runners. Output is byte-identical for the same Spec on every
// platform (the random numbers use integer arithmetic and exact float64
// sums only).
package testmodel

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// Spec describes a test model. Zero sizes take small defaults.
type Spec struct {
	Arch                                                                       string       // "llama" | "qwen2" | "qwen3" | "qwen3moe" | "qwen2moe" | "mistral" | "gemma3" | "gptoss"
	DType                                                                      engine.DType // engine.F32 or engine.BF16 (0 → F32)
	QuantBits, GroupSize                                                       int          // 0 = dense; 4 or 8 with group 32/64/128 (0 → 64)
	Seed                                                                       int64
	Layers, Hidden, Heads, KVHeads, HeadDim, Intermediate, Vocab, MaxPositions int
	Experts, ExpertsPerToken, MoEIntermediate                                  int  // qwen3moe only
	AllSparse                                                                  bool // qwen3moe: layer 0 sparse too (as llama.cpp's qwen3moe requires)
	RawTopKProb                                                                bool // qwen3moe: norm_topk_prob false (weights are the plain softmax probabilities)
	SharedExpertIntermediate                                                   int  // qwen2moe only: the shared expert's width
	SlidingWindow                                                              int  // mistral: sliding_window (0: none); gemma3: the sliding layers' window (0 → 8)
	SlidingPattern                                                             int  // gemma3: every n-th layer is global (0 → 3)
	Tied                                                                       bool // gemma3: tied embeddings (no lm_head), as Gemma ships
	MXFP4                                                                      bool // gptoss: experts in MLX's mxfp4 (random E2M1 values and E8M0 scales)
	// LayerGain scales what each dense layer adds to the residual stream
	// (o_proj and down_proj; 0 → 1). A small gain makes the model of fewer
	// layers and the same seed (which shares its embedding, first layers
	// and head) agree with it most of the time: a draft/target pair.
	LayerGain float64
}

// Defaults used for zero Spec fields.
const (
	DefaultLayers          = 2
	DefaultHidden          = 128
	DefaultHeads           = 4
	DefaultKVHeads         = 2
	DefaultIntermediate    = 256
	DefaultVocab           = 512
	DefaultMaxPositions    = 512
	DefaultGroupSize       = 64
	DefaultExperts         = 8
	DefaultExpertsPerToken = 2
	DefaultMoEIntermediate = 64
	DefaultSharedExpert    = 96
)

// Added (special) tokens, appended after the BPE vocabulary in this order.
var AddedTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// ChatTemplate is the ChatML template written to tokenizer_config.json.
const ChatTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Normalized returns s with defaults filled in and checks it.
func (s Spec) Normalized() (Spec, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if s.DType == 0 {
		s.DType = engine.F32
	}
	def(&s.Layers, DefaultLayers)
	def(&s.Hidden, DefaultHidden)
	def(&s.Heads, DefaultHeads)
	def(&s.KVHeads, DefaultKVHeads)
	if s.Arch == "qwen2moe" {
		def(&s.SharedExpertIntermediate, DefaultSharedExpert)
	}
	if s.moe() || s.Arch == "gptoss" {
		def(&s.Experts, DefaultExperts)
		def(&s.ExpertsPerToken, DefaultExpertsPerToken)
		def(&s.MoEIntermediate, DefaultMoEIntermediate)
	}
	if s.Arch == "qwen3" || s.Arch == "qwen3moe" {
		def(&s.HeadDim, 2*s.Hidden/s.Heads)
	} else {
		def(&s.HeadDim, s.Hidden/s.Heads)
	}
	def(&s.Intermediate, DefaultIntermediate)
	def(&s.Vocab, DefaultVocab)
	def(&s.MaxPositions, DefaultMaxPositions)
	if s.QuantBits != 0 {
		def(&s.GroupSize, DefaultGroupSize)
	}
	switch s.Arch {
	case "llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "mistral":
	case "gemma3":
		def(&s.SlidingWindow, 8)
		def(&s.SlidingPattern, 3)
	case "gptoss":
		def(&s.SlidingWindow, 8)
		if s.QuantBits != 0 {
			return s, fmt.Errorf("testmodel: gptoss is dense or MXFP4 (Spec.MXFP4), not affine-quantized")
		}
	default:
		return s, fmt.Errorf("testmodel: unknown arch %q", s.Arch)
	}
	if s.DType != engine.F32 && s.DType != engine.BF16 {
		return s, fmt.Errorf("testmodel: dtype %v (want F32 or BF16)", s.DType)
	}
	switch s.QuantBits {
	case 0:
		s.GroupSize = 0
	case 4, 8:
		if s.GroupSize != 32 && s.GroupSize != 64 && s.GroupSize != 128 {
			return s, fmt.Errorf("testmodel: group size %d (want 32, 64 or 128)", s.GroupSize)
		}
	default:
		return s, fmt.Errorf("testmodel: %d quantization bits (want 4 or 8)", s.QuantBits)
	}
	if s.Heads%s.KVHeads != 0 {
		return s, fmt.Errorf("testmodel: %d heads not a multiple of %d kv heads", s.Heads, s.KVHeads)
	}
	if s.HeadDim%2 != 0 {
		return s, fmt.Errorf("testmodel: odd head dim %d", s.HeadDim)
	}
	if s.Vocab < 256+len(AddedTokens) {
		return s, fmt.Errorf("testmodel: vocab %d below %d (bytes + added tokens)", s.Vocab, 256+len(AddedTokens))
	}
	return s, nil
}

// Token ids of the added tokens for a vocabulary of size v.
func EndOfTextID(v int) int32 { return int32(v - 3) }
func ImStartID(v int) int32   { return int32(v - 2) }
func ImEndID(v int) int32     { return int32(v - 1) }

// Write writes the model directory dir (created if needed): config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json,
// generation_config.json.
func Write(dir string, s Spec) error {
	s, err := s.Normalized()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	tok, err := TokenizerJSON(s.Vocab)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"config.json":            configJSON(s),
		"tokenizer.json":         tok,
		"tokenizer_config.json":  tokenizerConfigJSON(s.Vocab),
		"generation_config.json": generationConfigJSON(s.Vocab),
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), files[n], 0o644); err != nil {
			return fmt.Errorf("testmodel: %w", err)
		}
	}
	tensors, err := Tensors(s)
	if err != nil {
		return err
	}
	meta := map[string]string{"format": "pt"}
	if s.QuantBits != 0 {
		meta["format"] = "mlx"
	}
	if err := weights.WriteSafetensorsFile(filepath.Join(dir, "model.safetensors"), tensors, meta); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}

func (s Spec) ropeTheta() float64 {
	switch s.Arch {
	case "llama":
		return 500000
	case "qwen2":
		return 1000000
	}
	return 1000000
}

func configJSON(s Spec) []byte {
	arch := map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
		"qwen3moe": "Qwen3MoeForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM", "mistral": "MistralForCausalLM",
		"gemma3": "Gemma3ForCausalLM", "gptoss": "GptOssForCausalLM"}[s.Arch]
	modelType := map[string]string{"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "gemma3": "gemma3_text", "gptoss": "gpt_oss"}[s.Arch]
	if modelType == "" {
		modelType = s.Arch
	}
	dt := "float32"
	if s.DType == engine.BF16 {
		dt = "bfloat16"
	}
	c := map[string]any{
		"architectures":           []string{arch},
		"model_type":              modelType,
		"hidden_size":             s.Hidden,
		"intermediate_size":       s.Intermediate,
		"num_hidden_layers":       s.Layers,
		"num_attention_heads":     s.Heads,
		"num_key_value_heads":     s.KVHeads,
		"head_dim":                s.HeadDim,
		"max_position_embeddings": s.MaxPositions,
		"rms_norm_eps":            1e-5,
		"rope_theta":              s.ropeTheta(),
		"vocab_size":              s.Vocab,
		"tie_word_embeddings":     s.tied(),
		"hidden_act":              "silu",
		"torch_dtype":             dt,
		"bos_token_id":            EndOfTextID(s.Vocab),
		"eos_token_id":            ImEndID(s.Vocab),
	}
	switch s.Arch {
	case "llama":
		c["attention_bias"] = false
		c["mlp_bias"] = false
		c["rope_scaling"] = map[string]any{
			"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
			"original_max_position_embeddings": 64,
		}
	case "qwen2":
		c["use_sliding_window"] = false
	case "gptoss":
		// mlx-lm's gpt_oss: alternating sliding/full layers, every layer
		// sparse (intermediate_size is the experts' size), YaRN with a
		// small original context so that it changes the frequencies.
		types := make([]string, s.Layers)
		for i := range types {
			types[i] = []string{"sliding_attention", "full_attention"}[i%2]
		}
		c["layer_types"] = types
		c["sliding_window"] = s.SlidingWindow
		c["num_local_experts"] = s.Experts
		c["num_experts_per_tok"] = s.ExpertsPerToken
		c["intermediate_size"] = s.MoEIntermediate
		c["attention_bias"] = true
		c["swiglu_limit"] = json.RawMessage("7.0") // transformers checks that it is a float
		c["rope_theta"] = 150000.0
		if s.MXFP4 {
			// Only the experts have scales: mlx-lm and the engine quantize
			// just those modules.
			c["quantization"] = map[string]any{"group_size": 32, "bits": 4, "mode": "mxfp4"}
		}
		// No "truncate" key (the released configs say false): mlx-lm,
		// which computes the reference fixtures, ignores it and always
		// truncates the YaRN correction range, which is the engine's
		// default; the engine's truncate=false is tested in rope_test.go.
		c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
			"original_max_position_embeddings": s.MaxPositions / 4}
	case "gemma3":
		// mlx-lm's gemma3_text reads these (HF's names): sliding layers
		// with the local RoPE base, every SlidingPattern-th layer global
		// with rope_theta and linear rope_scaling; attention scaled by
		// query_pre_attn_scalar (≠ head_dim here, so it matters).
		delete(c, "hidden_act")
		c["hidden_activation"] = "gelu_pytorch_tanh"
		c["query_pre_attn_scalar"] = 24
		c["rope_local_base_freq"] = 10000.0
		c["sliding_window"] = s.SlidingWindow
		c["sliding_window_pattern"] = s.SlidingPattern
		c["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": 2.0}
		c["final_logit_softcapping"] = nil
		c["attn_logit_softcapping"] = nil
	case "mistral":
		// Llama's tensors; every layer attends to its last sliding_window
		// positions (null: full attention).
		c["sliding_window"] = nil
		if s.SlidingWindow > 0 {
			c["sliding_window"] = s.SlidingWindow
		}
	case "qwen3":
		c["attention_bias"] = false
	case "qwen3moe":
		c["attention_bias"] = false
		c["num_experts"] = s.Experts
		c["num_experts_per_tok"] = s.ExpertsPerToken
		c["moe_intermediate_size"] = s.MoEIntermediate
		c["norm_topk_prob"] = !s.RawTopKProb
		c["decoder_sparse_step"] = 1
		c["mlp_only_layers"] = []int{0}
		if s.AllSparse {
			c["mlp_only_layers"] = []int{}
		}
	case "qwen2moe":
		// Every layer sparse: mlx-lm's qwen2_moe reads neither
		// decoder_sparse_step nor mlp_only_layers nor norm_topk_prob.
		c["use_sliding_window"] = false
		c["num_experts"] = s.Experts
		c["num_experts_per_tok"] = s.ExpertsPerToken
		c["moe_intermediate_size"] = s.MoEIntermediate
		c["shared_expert_intermediate_size"] = s.SharedExpertIntermediate
		c["norm_topk_prob"] = false
		c["decoder_sparse_step"] = 1
		c["mlp_only_layers"] = []int{}
	}
	if s.QuantBits != 0 {
		q := map[string]any{"group_size": s.GroupSize, "bits": s.QuantBits}
		if s.moe() {
			// As mlx-community's MoE checkpoints: routers (and shared
			// expert gates) at 8 bits.
			first := 1
			if s.AllSparse || s.Arch == "qwen2moe" {
				first = 0
			}
			for l := first; l < s.Layers; l++ {
				q[fmt.Sprintf("model.layers.%d.mlp.gate", l)] = map[string]any{"group_size": s.GroupSize, "bits": 8}
				if s.Arch == "qwen2moe" {
					q[fmt.Sprintf("model.layers.%d.mlp.shared_expert_gate", l)] = map[string]any{"group_size": s.GroupSize, "bits": 8}
				}
			}
		}
		c["quantization"] = q
		c["quantization_config"] = q
	}
	return marshal(c, true)
}

// tied reports tie_word_embeddings. The test models never tie: random
// tied embeddings make greedy decoding degenerate (the input token or one
// fixed token wins every step). Tied embeddings are exercised by SmolLM2.
func (s Spec) tied() bool { return s.Tied && s.Arch == "gemma3" }

// moe reports whether the architecture routes experts.
func (s Spec) moe() bool { return s.Arch == "qwen3moe" || s.Arch == "qwen2moe" }

func tokenizerConfigJSON(vocab int) []byte {
	dec := map[string]any{}
	for i, t := range AddedTokens {
		dec[fmt.Sprint(vocab-len(AddedTokens)+i)] = map[string]any{
			"content": t, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true,
		}
	}
	c := map[string]any{
		"add_bos_token":                false,
		"add_eos_token":                false,
		"added_tokens_decoder":         dec,
		"bos_token":                    "<|endoftext|>",
		"eos_token":                    "<|im_end|>",
		"pad_token":                    "<|endoftext|>",
		"unk_token":                    nil,
		"chat_template":                ChatTemplate,
		"clean_up_tokenization_spaces": false,
		"model_max_length":             2048,
		"tokenizer_class":              "GPT2Tokenizer",
	}
	return marshal(c, true)
}

func generationConfigJSON(vocab int) []byte {
	c := map[string]any{
		"bos_token_id": EndOfTextID(vocab),
		"eos_token_id": []int32{ImEndID(vocab), EndOfTextID(vocab)},
		"do_sample":    false,
	}
	return marshal(c, true)
}

// Tensors returns the model's tensors (sorted by name) as they are written
// to model.safetensors.
func Tensors(s Spec) ([]engine.Tensor, error) {
	s, err := s.Normalized()
	if err != nil {
		return nil, err
	}
	var out []engine.Tensor
	g := &gen{s: s}
	// linear adds a (possibly quantized) weight [out, in] with std std.
	linear := func(prefix string, outDim, inDim int, std float64) {
		w := g.normal(prefix+".weight", outDim*inDim, std, 0)
		if s.QuantBits != 0 && inDim%s.GroupSize == 0 {
			out = append(out, quantize(prefix, w, outDim, inDim, s.QuantBits, s.GroupSize, s.DType)...)
			return
		}
		out = append(out, floatTensor(prefix+".weight", w, s.DType, outDim, inDim))
	}
	vec := func(name string, n int, std, mean float64) {
		out = append(out, floatTensor(name, g.normal(name, n, std, mean), s.DType, n))
	}
	h, hd := s.Hidden, s.HeadDim
	// Embeddings with unit variance; the final RMSNorm makes the scale of
	// the residual stream irrelevant, so lm_head's std sets the logit
	// spread (≈ 4): sharp enough that greedy decoding is stable across
	// engines.
	if s.tied() {
		// Tied: the embeddings are the output head too, so their std sets
		// the logit spread (≈ 4 over the final norm's √h).
		linear("model.embed_tokens", s.Vocab, h, 0.35)
	} else {
		linear("model.embed_tokens", s.Vocab, h, 1)
	}
	if !s.tied() {
		linear("lm_head", s.Vocab, h, 4/math.Sqrt(float64(h)))
	}
	if s.Arch == "gemma3" {
		vec("model.norm.weight", h, 0.1, 0)
	} else {
		vec("model.norm.weight", h, 0.1, 1)
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		normMean, postMean := 1.0, 1.0
		if s.Arch == "gemma3" {
			// Gemma's norms scale by 1 + w. Its post-attention and post-
			// feedforward norms set how much each layer adds to the
			// residual: 1 + w ≈ 3, so that the layers, not the input
			// token's (√h-scaled) embedding, decide the next token.
			normMean, postMean = 0, 2
			vec(p+"pre_feedforward_layernorm.weight", h, 0.1, 0)
			vec(p+"post_feedforward_layernorm.weight", h, 0.1, postMean)
		}
		vec(p+"input_layernorm.weight", h, 0.1, normMean)
		vec(p+"post_attention_layernorm.weight", h, 0.1, postMean)
		in := 1 / math.Sqrt(float64(h))
		linear(p+"self_attn.q_proj", s.Heads*hd, h, in)
		linear(p+"self_attn.k_proj", s.KVHeads*hd, h, in)
		linear(p+"self_attn.v_proj", s.KVHeads*hd, h, in)
		gain := cmp.Or(s.LayerGain, 1)
		linear(p+"self_attn.o_proj", h, s.Heads*hd, gain/math.Sqrt(float64(s.Heads*hd)))
		if s.Arch == "gptoss" {
			vec(p+"self_attn.q_proj.bias", s.Heads*hd, 0.2, 0)
			vec(p+"self_attn.k_proj.bias", s.KVHeads*hd, 0.2, 0)
			vec(p+"self_attn.v_proj.bias", s.KVHeads*hd, 0.2, 0)
			vec(p+"self_attn.o_proj.bias", h, 0.2, 0)
			vec(p+"self_attn.sinks", s.Heads, 1, 0)
			out = append(out, g.gptossMoE(p+"mlp.", in)...)
			continue
		}
		if s.Arch == "qwen2" || s.Arch == "qwen2moe" {
			vec(p+"self_attn.q_proj.bias", s.Heads*hd, 0.2, 0)
			vec(p+"self_attn.k_proj.bias", s.KVHeads*hd, 0.2, 0)
			vec(p+"self_attn.v_proj.bias", s.KVHeads*hd, 0.2, 0)
		}
		if s.Arch == "qwen3" || s.Arch == "qwen3moe" || s.Arch == "gemma3" {
			vec(p+"self_attn.q_norm.weight", hd, 0.1, normMean)
			vec(p+"self_attn.k_norm.weight", hd, 0.1, normMean)
		}
		if s.Arch == "qwen3moe" && (l > 0 || s.AllSparse) || s.Arch == "qwen2moe" {
			out = append(out, g.moe(p+"mlp.", in)...)
			if s.Arch == "qwen2moe" {
				F := s.SharedExpertIntermediate
				linear(p+"mlp.shared_expert.gate_proj", F, h, in)
				linear(p+"mlp.shared_expert.up_proj", F, h, in)
				linear(p+"mlp.shared_expert.down_proj", h, F, 1/math.Sqrt(float64(F)))
				gate := g.normal(p+"mlp.shared_expert_gate.weight", h, 2*in, 0)
				if s.QuantBits != 0 {
					out = append(out, quantize(p+"mlp.shared_expert_gate", gate, 1, h, 8, s.GroupSize, s.DType)...)
				} else {
					out = append(out, floatTensor(p+"mlp.shared_expert_gate.weight", gate, s.DType, 1, h))
				}
			}
			continue
		}
		linear(p+"mlp.gate_proj", s.Intermediate, h, in)
		linear(p+"mlp.up_proj", s.Intermediate, h, in)
		linear(p+"mlp.down_proj", h, s.Intermediate, gain/math.Sqrt(float64(s.Intermediate)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// moe returns a sparse block's tensors: the router prefix+"gate" [E, h]
// (std 2/√h: distinct probabilities, so top-k choices are not near ties)
// and the experts, one tensor per expert and projection when dense, or
// stacked [E, …] under prefix+"switch_mlp." when quantized (mlx-lm's
// layout; its loader stacks only dense per-expert weights).
func (g *gen) moe(prefix string, in float64) []engine.Tensor {
	s := g.s
	h, F, E := s.Hidden, s.MoEIntermediate, s.Experts
	var out []engine.Tensor
	router := g.normal(prefix+"gate.weight", E*h, 2/math.Sqrt(float64(h)), 0)
	if s.QuantBits != 0 {
		out = append(out, quantize(prefix+"gate", router, E, h, 8, s.GroupSize, s.DType)...)
	} else {
		out = append(out, floatTensor(prefix+"gate.weight", router, s.DType, E, h))
	}
	projs := []struct {
		name       string
		rows, cols int
		std        float64
	}{{"gate_proj", F, h, in}, {"up_proj", F, h, in}, {"down_proj", h, F, 1 / math.Sqrt(float64(F))}}
	for _, p := range projs {
		if s.QuantBits == 0 {
			for e := range E {
				name := fmt.Sprintf("%sexperts.%d.%s", prefix, e, p.name)
				out = append(out, floatTensor(name+".weight", g.normal(name+".weight", p.rows*p.cols, p.std, 0), s.DType, p.rows, p.cols))
			}
			continue
		}
		var stacked []engine.Tensor
		for e := range E {
			name := fmt.Sprintf("%sexperts.%d.%s", prefix, e, p.name)
			parts := quantize(prefix+"switch_mlp."+p.name, g.normal(name+".weight", p.rows*p.cols, p.std, 0), p.rows, p.cols, s.QuantBits, s.GroupSize, s.DType)
			if stacked == nil {
				stacked = parts
				for i := range stacked {
					stacked[i].Shape = append([]int{E}, stacked[i].Shape...)
				}
				continue
			}
			for i := range stacked {
				stacked[i].Data = append(stacked[i].Data, parts[i].Data...)
			}
		}
		out = append(out, stacked...)
	}
	return out
}

// gptossMoE returns a gpt-oss sparse block in mlx-lm's layout: the router
// prefix+"router" with a bias, and the experts stacked [E, out, in] under
// prefix+"experts.{gate,up,down}_proj" with biases [E, out]. Gate and up
// have std 4/√h, so that gpt-oss's clamp at ±7 can be reached.
func (g *gen) gptossMoE(prefix string, in float64) []engine.Tensor {
	s := g.s
	h, F, E := s.Hidden, s.MoEIntermediate, s.Experts
	out := []engine.Tensor{
		floatTensor(prefix+"router.weight", g.normal(prefix+"router.weight", E*h, 2/math.Sqrt(float64(h)), 0), s.DType, E, h),
		floatTensor(prefix+"router.bias", g.normal(prefix+"router.bias", E, 0.5, 0), s.DType, E),
	}
	for _, p := range []struct {
		name       string
		rows, cols int
		std        float64
	}{{"gate_proj", F, h, 4 * in}, {"up_proj", F, h, 4 * in}, {"down_proj", h, F, 1 / math.Sqrt(float64(F))}} {
		name := prefix + "experts." + p.name
		if s.MXFP4 {
			out = append(out, g.mxfp4(name, E*p.rows, p.cols, []int{E, p.rows}),
				floatTensor(name+".bias", g.normal(name+".bias", E*p.rows, 0.2, 0), s.DType, E, p.rows))
			out = append(out, g.mxfp4Scales(name, E*p.rows, p.cols, []int{E, p.rows}, p.std))
			continue
		}
		out = append(out,
			floatTensor(name+".weight", g.normal(name+".weight", E*p.rows*p.cols, p.std, 0), s.DType, E, p.rows, p.cols),
			floatTensor(name+".bias", g.normal(name+".bias", E*p.rows, 0.2, 0), s.DType, E, p.rows))
	}
	return out
}

// mxfp4 returns name.weight: rows×cols random 4-bit E2M1 codes packed 8 per
// uint32 (little end first), shape lead + [cols/8].
func (g *gen) mxfp4(name string, rows, cols int, lead []int) engine.Tensor {
	u := g.normal(name+".weight", rows*cols, 1, 0)
	data := make([]byte, rows*cols/2)
	for i, v := range u {
		code := byte(int(math.Abs(v)*1000)) & 15 // deterministic, spread over all 16 codes
		data[i/2] |= code << (4 * uint(i%2))
	}
	return engine.Tensor{Name: name + ".weight", DType: engine.U32, Shape: append(append([]int(nil), lead...), cols/8), Data: data}
}

// mxfp4Scales returns name.scales: E8M0 scales (uint8, 2^(s-127)) per 32
// values, around std/2.5 (E2M1 codes average about 2.5 in magnitude).
func (g *gen) mxfp4Scales(name string, rows, cols int, lead []int, std float64) engine.Tensor {
	u := g.normal(name+".scales", rows*cols/32, 0.7, 0)
	base := 127 + math.Round(math.Log2(std/2.5))
	data := make([]byte, len(u))
	for i, v := range u {
		data[i] = byte(base + math.Round(v))
	}
	return engine.Tensor{Name: name + ".scales", DType: engine.U8, Shape: append(append([]int(nil), lead...), cols/32), Data: data}
}

// floatTensor encodes float64 values as an F32 or BF16 tensor.
func floatTensor(name string, v []float64, dt engine.DType, shape ...int) engine.Tensor {
	data := make([]byte, len(v)*dt.Size())
	for i, x := range v {
		putFloat(data, i, x, dt)
	}
	return engine.Tensor{Name: name, DType: dt, Shape: shape, Data: data}
}

func putFloat(data []byte, i int, x float64, dt engine.DType) {
	if dt == engine.BF16 {
		binary.LittleEndian.PutUint16(data[2*i:], weights.F32ToBF16(float32(x)))
		return
	}
	binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(x)))
}

// roundTo returns x as stored in dtype dt.
func roundTo(x float64, dt engine.DType) float64 {
	if dt == engine.BF16 {
		return float64(weights.BF16ToF32(weights.F32ToBF16(float32(x))))
	}
	return float64(float32(x))
}

// quantize applies MLX's affine quantization per group of g consecutive
// input elements: scale = (max-min)/(2^bits-1), bias = min (both rounded
// to dt), q = round((w-bias)/scale) clipped to [0, 2^bits-1]; q packed
// into uint32 words little-end first. Returns prefix.weight (U32),
// prefix.scales and prefix.biases ([out, in/g] in dt).
func quantize(prefix string, w []float64, rows, cols, bits, g int, dt engine.DType) []engine.Tensor {
	groups := cols / g
	maxQ := float64(int(1)<<bits - 1)
	perWord := 32 / bits
	words := make([]byte, rows*cols/perWord*4)
	scales := make([]byte, rows*groups*dt.Size())
	biases := make([]byte, rows*groups*dt.Size())
	for r := 0; r < rows; r++ {
		for gi := 0; gi < groups; gi++ {
			vals := w[r*cols+gi*g : r*cols+(gi+1)*g]
			lo, hi := vals[0], vals[0]
			for _, v := range vals {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
			scale := roundTo((hi-lo)/maxQ, dt)
			bias := roundTo(lo, dt)
			putFloat(scales, r*groups+gi, scale, dt)
			putFloat(biases, r*groups+gi, bias, dt)
			for k, v := range vals {
				q := 0.0
				if scale != 0 {
					q = math.Max(0, math.Min(maxQ, math.RoundToEven((v-bias)/scale)))
				}
				idx := r*cols + gi*g + k
				word := idx / perWord
				shift := uint(idx%perWord) * uint(bits)
				old := binary.LittleEndian.Uint32(words[4*word:])
				binary.LittleEndian.PutUint32(words[4*word:], old|uint32(q)<<shift)
			}
		}
	}
	return []engine.Tensor{
		{Name: prefix + ".weight", DType: engine.U32, Shape: []int{rows, cols / perWord}, Data: words},
		{Name: prefix + ".scales", DType: dt, Shape: []int{rows, groups}, Data: scales},
		{Name: prefix + ".biases", DType: dt, Shape: []int{rows, groups}, Data: biases},
	}
}

// gen draws deterministic pseudo-random numbers per tensor name.
type gen struct{ s Spec }

// normal returns n approximately normal values (Irwin–Hall: sum of 12
// uniforms − 6, exact in float64 on every platform) with mean and std,
// from a stream seeded by (Spec.Seed, Spec.Arch, name).
func (g *gen) normal(name string, n int, std, mean float64) []float64 {
	h := uint64(1469598103934665603)
	for _, c := range []byte(g.s.Arch + "/" + name) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	st := h ^ uint64(g.s.Seed)*0x9e3779b97f4a7c15
	out := make([]float64, n)
	for i := range out {
		sum := 0.0
		for k := 0; k < 12; k++ {
			st += 0x9e3779b97f4a7c15
			z := st
			z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
			z = (z ^ (z >> 27)) * 0x94d049bb133111eb
			z ^= z >> 31
			sum += float64(z>>11) / (1 << 53)
		}
		out[i] = mean + std*(sum-6)
	}
	return out
}
