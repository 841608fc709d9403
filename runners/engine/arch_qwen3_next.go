package engine

import (
	"fmt"
	"strings"
)

// Qwen3-Next (HF Qwen3NextForCausalLM, mlx-lm's qwen3_next): a Gated
// DeltaNet hybrid. Every full_attention_interval-th layer is gated full
// attention (q_proj doubled: queries and a sigmoid output gate, per-head
// q/k norms, partial RoPE); the others are Gated DeltaNet layers
// (deltanet.go) with recurrent state. Sparse layers run routed experts
// with a shared expert. HF checkpoints in the per-expert layout store the
// RMSNorm weights minus one (zero-centred); mlx-lm adds 1 when it sees that
// layout, and so does Open.

func init() {
	Register("Qwen3NextForCausalLM", &Architecture{KVFamily: "qwen3_next", Layers: gatedDeltaNetLayers(true), Block: gatedDeltaNetBlock, Open: qwen3NextOpen,
		GGUF: &GGUFLayout{Name: "qwen3next", ModelType: "qwen3_next", ExpertFFN: true, DeltaNetTensors: true,
			LayerNames: gatedDeltaNetGGUFNames, Config: gatedDeltaNetGGUFConfig(true)}})
}

// gatedDeltaNetGGUFNames are the hybrids' block stems that map one to one
// (the Gated DeltaNet tensors are engine/weights' gguf_qwen3next.go's).
var gatedDeltaNetGGUFNames = map[string]string{
	"post_attention_norm": "post_attention_layernorm",
	"ffn_gate_shexp":      "mlp.shared_expert.gate_proj",
	"ffn_up_shexp":        "mlp.shared_expert.up_proj",
	"ffn_down_shexp":      "mlp.shared_expert.down_proj",
}

// gatedDeltaNetGGUFConfig maps llama.cpp's qwen3next / qwen35moe (every
// layer sparse with a shared expert, the chosen experts' weights
// renormalized; sparse) and qwen35 (every layer dense) metadata.
func gatedDeltaNetGGUFConfig(sparse bool) func(md GGUFMetadata, key func(string) string, cfg map[string]any) error {
	return func(md GGUFMetadata, key func(string) string, cfg map[string]any) error {
		keys := map[string]string{"linear_num_key_heads": "ssm.group_count",
			"linear_num_value_heads": "ssm.time_step_rank", "linear_key_head_dim": "ssm.state_size",
			"linear_conv_kernel_dim": "ssm.conv_kernel"}
		if sparse {
			keys["num_experts"], keys["num_experts_per_tok"], keys["moe_intermediate_size"] = "expert_count", "expert_used_count", "expert_feed_forward_length"
		}
		if err := ggufCopy(md, key, cfg, keys); err != nil {
			return err
		}
		inner, err := ggufNeed(md, key("ssm.inner_size"))
		if err != nil {
			return err
		}
		hv := cfg["linear_num_value_heads"].(uint64)
		if hv == 0 || inner%hv != 0 {
			return fmt.Errorf("metadata %s %d is not a multiple of ssm.time_step_rank %d", key("ssm.inner_size"), inner, hv)
		}
		cfg["linear_value_head_dim"] = inner / hv
		recurrent := md.RecurrentLayers()
		if sparse {
			cfg["shared_expert_intermediate_size"] = cfg["intermediate_size"]
			if v, ok := md.Uint(key("expert_shared_feed_forward_length")); ok {
				cfg["shared_expert_intermediate_size"] = v
			}
			// Layers with a dense MLP (llama.cpp's have none; HF's
			// mlp_only_layers) are those without a router.
			dense := []int{}
			for i := range recurrent {
				if !md.HasTensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", i)) {
					dense = append(dense, i)
				}
			}
			cfg["norm_topk_prob"], cfg["decoder_sparse_step"], cfg["mlp_only_layers"] = true, 1, dense
		}
		n := fullAttentionInterval(recurrent)
		if n == 0 {
			return fmt.Errorf("metadata %s: the recurrent layers %v do not repeat with a full-attention interval", key("attention.recurrent_layers"), recurrent)
		}
		cfg["full_attention_interval"] = n
		// llama.cpp rotates rope.dimension_count dims (default: all).
		cfg["partial_rotary_factor"] = 1.0
		if d, ok := md.Uint(key("rope.dimension_count")); ok {
			cfg["partial_rotary_factor"] = float64(d) / float64(cfg["head_dim"].(uint64))
		}
		return nil
	}
}

// fullAttentionInterval is the full_attention_interval that gives the
// recurrent flags (0 when none does).
func fullAttentionInterval(recurrent []bool) int {
	for n := 1; n <= len(recurrent); n++ {
		ok := true
		for i, r := range recurrent {
			if r != ((i+1)%n != 0) {
				ok = false
				break
			}
		}
		if ok {
			return n
		}
	}
	return 0
}

func qwen3NextOpen(l *loader, c *Config) error {
	for _, n := range l.src.Names() {
		if strings.HasSuffix(n, ".mlp.experts.0.up_proj.weight") {
			l.normOffset = true
			break
		}
	}
	return nil
}

// gatedDeltaNetLayers is the hybrids' layer pattern (Config.IsLinearLayer);
// sparse says whether the architecture routes experts.
func gatedDeltaNetLayers(sparse bool) func(c *Config) ([]LayerKind, error) {
	return func(c *Config) ([]LayerKind, error) {
		if err := fullAttentionOnly(c); err != nil {
			return nil, err
		}
		if err := checkExperts(c, sparse); err != nil {
			return nil, err
		}
		if c.FullAttentionInterval <= 0 {
			return nil, cfgErr("full_attention_interval", "missing (a Gated DeltaNet hybrid needs linear_* and full_attention_interval)")
		}
		k := make([]LayerKind, c.Layers)
		for i := range k {
			k[i].Recurrent = c.IsLinearLayer(i)
		}
		return k, nil
	}
}

// gatedDeltaNetBlock is a hybrid's layer i: Gated DeltaNet or gated
// attention, then the MLP or MoE.
func gatedDeltaNetBlock(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	mix := func(p string) (mixer, error) { return l.delta(p+"linear_attn.", c) }
	if !k.Recurrent {
		sp := attentionSpec{H: c.Heads, Hkv: c.KVHeads, Dh: c.HeadDim, qkvBias: c.AttentionBias, oBias: c.AttentionBias,
			qkNorm: true, gated: true, rope: &c.RoPE}
		mix = l.selfAttention(c, sp)
	}
	return l.preNormLayer(c, i, mix, l.sparseOrDense(c, i))
}
