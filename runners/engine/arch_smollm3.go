package engine

import (
	"encoding/json"
	"slices"
)

// SmolLM3 (HF SmolLM3ForCausalLM, mlx-lm's smollm3): Llama's layers, but
// the layers that no_rope_layers marks 0 (by default every
// no_rope_layer_interval-th) apply no rotary embedding (NoPE): their keys
// enter the cache unrotated. Embeddings are tied by default, and when tied
// the LM head is the embedding even if the checkpoint carries an lm_head
// (mlx-lm drops it).

// smolLM3Config holds SmolLM3's own config.json fields (Config.ext).
type smolLM3Config struct {
	UseRoPE []bool // per layer: no_rope_layers[i] == 1
}

func init() {
	Register("SmolLM3ForCausalLM", &Architecture{KVFamily: "smollm3", Prepare: smolLM3Prepare, Parse: parseSmolLM3,
		Layers: smolLM3Layers, Head: smolLM3Head, Block: smolLM3Block, Fingerprint: smolLM3Fingerprint})
}

// smolLM3Prepare fills in HF SmolLM3Config's tie_word_embeddings default
// (true).
func smolLM3Prepare(data []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return data, nil // the common parser reports it
	}
	if _, ok := m["tie_word_embeddings"]; ok {
		return data, nil
	}
	m["tie_word_embeddings"] = json.RawMessage("true")
	return json.Marshal(m)
}

func parseSmolLM3(data []byte, c *Config) error {
	var r struct {
		Interval *int  `json:"no_rope_layer_interval"`
		Layers   []int `json:"no_rope_layers"`
		MLPBias  bool  `json:"mlp_bias"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return cfgErr("config.json", "%v", err)
	}
	if r.MLPBias {
		return cfgErr("mlp_bias", "MLP biases are not supported")
	}
	g := &smolLM3Config{UseRoPE: make([]bool, c.Layers)}
	switch {
	case r.Layers != nil:
		if len(r.Layers) != c.Layers {
			return cfgErr("no_rope_layers", "%d entries for %d layers", len(r.Layers), c.Layers)
		}
		for i, v := range r.Layers {
			if v != 0 && v != 1 {
				return cfgErr("no_rope_layers", "layer %d: %d (want 0: no RoPE, or 1: RoPE)", i, v)
			}
			g.UseRoPE[i] = v == 1
		}
	default:
		n := 4
		if r.Interval != nil {
			n = *r.Interval
		}
		if n <= 0 {
			return cfgErr("no_rope_layer_interval", "must be positive (got %d)", n)
		}
		for i := range g.UseRoPE {
			g.UseRoPE[i] = (i+1)%n != 0
		}
	}
	if slices.Contains(c.LayerTypes, "sliding_attention") {
		return cfgErr("layer_types", "sliding_attention layers are not supported for SmolLM3")
	}
	c.ext = g
	return nil
}

func smolLM3Layers(c *Config) ([]LayerKind, error) {
	if _, ok := c.ext.(*smolLM3Config); !ok {
		return nil, cfgErr("architectures", "%s without its SmolLM3 settings", c.Arch)
	}
	if err := fullAttentionOnly(c); err != nil {
		return nil, err
	}
	return uniformKinds(c, 0), checkExperts(c, false)
}

// smolLM3Fingerprint: which layers' keys are rotated.
func smolLM3Fingerprint(c *Config, w *fpWriter) {
	w.str("rope layers")
	for _, r := range c.ext.(*smolLM3Config).UseRoPE {
		w.u64(map[bool]uint64{false: 0, true: 1}[r])
	}
}

func smolLM3Head(l *loader, c *Config, e *embedding) (*outputHead, error) {
	if !c.TieEmbeddings {
		return standardHead(l, c, e)
	}
	n, err := l.norm("model.norm.weight", c.Hidden)
	if err != nil {
		return nil, err
	}
	return &outputHead{norm: n, out: e.table}, nil
}

func smolLM3Block(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	sp := llamaAttention(c, k)
	if !c.ext.(*smolLM3Config).UseRoPE[i] {
		sp.rope = nil
	}
	return l.preNormLayer(c, i, l.selfAttention(c, sp), l.denseMLP(c))
}
