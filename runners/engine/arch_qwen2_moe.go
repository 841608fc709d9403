package engine

// Qwen2-MoE (HF Qwen2MoeForCausalLM): Qwen2's attention; sparse layers run
// routed experts plus a shared expert behind a sigmoid gate (moe.go).

func init() {
	Register("Qwen2MoeForCausalLM", &Architecture{KVFamily: "qwen2_moe", Layers: qwen2MoeLayers, Block: qwen2MoeBlock})
}

func qwen2MoeLayers(c *Config) ([]LayerKind, error) {
	if err := fullAttentionOnly(c); err != nil {
		return nil, err
	}
	return uniformKinds(c, 0), checkExperts(c, true)
}

func qwen2MoeBlock(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	return l.preNormLayer(c, i, l.selfAttention(c, qwen2Attention(c, k)), l.sparseOrDense(c, i))
}
