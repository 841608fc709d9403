package engine

// Mistral (HF MistralForCausalLM): Llama's layers, every one attending over
// the last sliding_window positions when the config sets one (a ring
// cache per layer), full attention otherwise. Its KV is Llama's: it shares
// Llama's fingerprint family.

func init() {
	Register("MistralForCausalLM", &Architecture{KVFamily: "llama", Layers: mistralLayers, Block: llamaBlock})
}

func mistralLayers(c *Config) ([]LayerKind, error) {
	if err := fullAttentionOnly(c); err != nil {
		return nil, err
	}
	return uniformKinds(c, c.SlidingWindow), checkExperts(c, false)
}
