package engine

import "encoding/json"

// OLMo 2 (HF Olmo2ForCausalLM, mlx-lm's olmo2): norms after each branch
// instead of before (x + post_attention_layernorm(attn(x)), then
// h + post_feedforward_layernorm(mlp(h))), and q_norm / k_norm as RMSNorms
// over the whole q and k projections ([H·Dh], [Hkv·Dh]) before the heads
// are split; the model's RoPE, a SwiGLU MLP, biases on q/k/v/o when
// attention_bias.

func init() {
	Register("Olmo2ForCausalLM", &Architecture{KVFamily: "olmo2", Parse: parseOlmo2, Layers: olmo2Layers, Block: olmo2Block,
		NoTensorSplit: "its q/k norms span the whole projection, which a rank holds only a share of (an all_gather per layer, not implemented)"})
}

func parseOlmo2(data []byte, c *Config) error {
	var r struct {
		MLPBias bool `json:"mlp_bias"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return cfgErr("config.json", "%v", err)
	}
	if r.MLPBias {
		return cfgErr("mlp_bias", "MLP biases are not supported")
	}
	return nil
}

func olmo2Layers(c *Config) ([]LayerKind, error) {
	if err := fullAttentionOnly(c); err != nil {
		return nil, err
	}
	return uniformKinds(c, 0), checkExperts(c, false)
}

func olmo2Block(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	p := layerPrefix(i)
	sp := llamaAttention(c, k)
	sp.qkNorm, sp.normWhole = true, true
	d := &decoderLayer{eps: float32(c.RMSNormEps)}
	var err error
	if d.mix, err = l.attention(p+"self_attn.", c.Hidden, sp, d.eps, l.norm); err != nil {
		return nil, err
	}
	if d.ff, err = l.mlp(p+"mlp.", c.Hidden, c.Intermediate, activation{}); err != nil {
		return nil, err
	}
	return d, d.norms(l.norm, c.Hidden, "", p+"post_attention_layernorm.weight", "", p+"post_feedforward_layernorm.weight")
}
