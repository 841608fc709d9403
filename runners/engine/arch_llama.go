package engine

// Llama (HF LlamaForCausalLM, mlx-lm's llama): pre-norm layers of
// grouped-query attention (biases when attention_bias) with the model's
// RoPE (default, linear, llama3 or YaRN scaling) and a SwiGLU MLP.

func init() {
	Register("LlamaForCausalLM", &Architecture{KVFamily: "llama", Layers: llamaLayers, Block: llamaBlock,
		GGUF: &GGUFLayout{Name: "llama", ModelType: "llama", PermutedQK: true}})
}

func llamaLayers(c *Config) ([]LayerKind, error) {
	if err := fullAttentionOnly(c); err != nil {
		return nil, err
	}
	return uniformKinds(c, 0), checkExperts(c, false)
}

func llamaBlock(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	return l.preNormLayer(c, i, l.selfAttention(c, llamaAttention(c, k)), l.denseMLP(c))
}
