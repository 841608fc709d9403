package engine

// Qwen3 (HF Qwen3ForCausalLM): Llama's layers with a per-head RMSNorm on q
// and k before RoPE, and Qwen2's sliding-window rule.

func init() {
	Register("Qwen3ForCausalLM", &Architecture{KVFamily: "qwen3", Layers: qwen2Layers, Block: qwen3Block,
		GGUF: &GGUFLayout{Name: "qwen3", ModelType: "qwen3"}})
}

// qwen3Attention is Qwen3's attention: per-head q/k norms.
func qwen3Attention(c *Config, k LayerKind) attentionSpec {
	sp := llamaAttention(c, k)
	sp.qkNorm = true
	return sp
}

func qwen3Block(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	return l.preNormLayer(c, i, l.selfAttention(c, qwen3Attention(c, k)), l.denseMLP(c))
}
