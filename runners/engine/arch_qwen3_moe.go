package engine

// Qwen3-MoE (HF Qwen3MoeForCausalLM): Qwen3's attention; every
// decoder_sparse_step-th layer not in mlp_only_layers replaces the MLP by
// routed experts (moe.go).

func init() {
	// llama.cpp's qwen3moe: every layer sparse, the chosen experts'
	// weights renormalized.
	Register("Qwen3MoeForCausalLM", &Architecture{KVFamily: "qwen3_moe", Layers: qwen3MoeLayers, Block: qwen3MoeBlock,
		GGUF: &GGUFLayout{Name: "qwen3moe", ModelType: "qwen3_moe", ExpertFFN: true, Config: ggufMoE}})
}

func qwen3MoeLayers(c *Config) ([]LayerKind, error) {
	k, err := qwenKinds(c)
	if err != nil {
		return nil, err
	}
	return k, checkExperts(c, true)
}

func qwen3MoeBlock(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	return l.preNormLayer(c, i, l.selfAttention(c, qwen3Attention(c, k)), l.sparseOrDense(c, i))
}
