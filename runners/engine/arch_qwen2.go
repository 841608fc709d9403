package engine

// Qwen2 (HF Qwen2ForCausalLM): Llama's layers with q/k/v biases always
// (o_proj without), and HF's sliding-window rule (qwenKinds).

func init() {
	Register("Qwen2ForCausalLM", &Architecture{KVFamily: "qwen2", Layers: qwen2Layers, Block: qwen2Block,
		GGUF: &GGUFLayout{Name: "qwen2", ModelType: "qwen2"}})
}

func qwen2Layers(c *Config) ([]LayerKind, error) {
	k, err := qwenKinds(c)
	if err != nil {
		return nil, err
	}
	return k, checkExperts(c, false)
}

// qwen2Attention is Qwen2's attention: q/k/v biases whatever
// attention_bias says.
func qwen2Attention(c *Config, k LayerKind) attentionSpec {
	sp := llamaAttention(c, k)
	sp.qkvBias = true
	return sp
}

func qwen2Block(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	return l.preNormLayer(c, i, l.selfAttention(c, qwen2Attention(c, k)), l.denseMLP(c))
}

// qwenKinds is HF Qwen2/Qwen3's rule: with use_sliding_window, the layers
// from max_window_layers on (or those layer_types names
// sliding_attention) slide over sliding_window; without it none does.
func qwenKinds(c *Config) ([]LayerKind, error) {
	if !c.SlidingWindowUse {
		return uniformKinds(c, 0), nil
	}
	if c.SlidingWindow <= 0 {
		return nil, cfgErr("sliding_window", "use_sliding_window needs a positive sliding_window")
	}
	k := make([]LayerKind, c.Layers)
	for i := range k {
		slide := i >= c.MaxWindowLayers
		if c.LayerTypes != nil {
			slide = c.LayerTypes[i] == "sliding_attention"
		}
		if slide {
			k[i].Window = c.SlidingWindow
		}
	}
	return k, nil
}
