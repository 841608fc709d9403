package engine

import "strings"

// Qwen3-Next (HF Qwen3NextForCausalLM, mlx-lm's qwen3_next): a Gated
// DeltaNet hybrid. Every full_attention_interval-th layer is gated full
// attention (q_proj doubled: queries and a sigmoid output gate, per-head
// q/k norms, partial RoPE); the others are Gated DeltaNet layers
// (deltanet.go) with recurrent state. Sparse layers run routed experts
// with a shared expert. HF checkpoints in the per-expert layout store the
// RMSNorm weights minus one (zero-centred); mlx-lm adds 1 when it sees that
// layout, and so does Open.

func init() {
	Register("Qwen3NextForCausalLM", &Architecture{Family: "qwen3_next", Layers: gatedDeltaNetLayers(true), Block: gatedDeltaNetBlock, Open: qwen3NextOpen})
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
