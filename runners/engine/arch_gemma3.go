package engine

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// This file is Gemma 3's text model (HF Gemma3ForCausalLM and the text tower
// of Gemma3ForConditionalGeneration) as a composition of the engine's
// building blocks: sliding-window layers (sliding.go) interleaved with full
// ones by the config's pattern, a local RoPE base on the sliding layers and
// the global base plus rope_scaling on the others, q/k RMSNorms, GeGLU,
// four RMSNorms per layer with (1 + w) weights (folded into the weights at
// load), embeddings scaled by √d, attention scaled by query_pre_attn_scalar,
// tied embeddings. Numerics follow mlx-lm's gemma3_text.

// gemma3Config holds the Gemma 3 fields of config.json (Config.ext).
type gemma3Config struct {
	QueryPreAttnScalar float64  // query_pre_attn_scalar: attention scale is its -1/2 power
	LocalBase          float64  // rope_local_base_freq: the sliding layers' RoPE base
	LayerTypes         []string // layer_types, or from sliding_window_pattern
}

func init() {
	for _, name := range []string{"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"} {
		a := &Architecture{KVFamily: "gemma3", Prepare: gemma3Prepare, Parse: parseGemma3, Layers: gemma3Layers,
			Source: wrapLanguageModel, Embed: gemma3Embed, Head: gemma3Head, Block: gemma3Block, Fingerprint: gemma3Fingerprint}
		if name == "Gemma3ForCausalLM" {
			a.GGUF = gemma3GGUF
		}
		Register(name, a)
	}
}

// gemma3GGUF is Gemma 3's text model as llama.cpp's converter writes it:
// norm weights stored as 1 + w, ffn_norm the pre-feedforward norm.
var gemma3GGUF = &GGUFLayout{Name: "gemma3", ModelType: "gemma3_text", NormsPlusOne: true, Config: gemma3GGUFConfig,
	LayerNames: map[string]string{
		"ffn_norm":            "pre_feedforward_layernorm",
		"post_attention_norm": "post_attention_layernorm",
		"post_ffw_norm":       "post_feedforward_layernorm",
	}}

// gemma3GGUFConfig: llama.cpp's gemma3 uses GeGLU; attention scaled by
// 1/√head_dim (by 1/√(hidden/heads) for the 62-layer 27B); the sliding
// layers' RoPE base rope.freq_base_swa (10,000 when absent; the converter
// does not write it) without rope scaling (HF's too); every 6th layer full.
func gemma3GGUFConfig(md GGUFMetadata, key func(string) string, cfg map[string]any) error {
	delete(cfg, "hidden_act")
	cfg["hidden_activation"] = "gelu_pytorch_tanh"
	cfg["query_pre_attn_scalar"] = cfg["head_dim"]
	if cfg["num_hidden_layers"].(uint64) == 62 {
		cfg["query_pre_attn_scalar"] = cfg["hidden_size"].(uint64) / cfg["num_attention_heads"].(uint64)
	}
	cfg["rope_local_base_freq"] = 10000.0
	if b, ok := md.Float(key("rope.freq_base_swa")); ok {
		cfg["rope_local_base_freq"] = b
	}
	if err := ggufSlidingLayers(md, key, cfg, 6); err != nil {
		return err
	}
	if c, ok := md.Float(key("final_logit_softcapping")); ok && c != 0 {
		cfg["final_logit_softcapping"] = c // refused by name by Prepare
	}
	return nil
}

// gemma3Defaults are HF Gemma3TextConfig's defaults: real configs (the
// text_config of the multimodal checkpoints above all) leave out the keys
// that equal them.
var gemma3Defaults = map[string]any{
	"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
	"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
	"rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 256,
	"sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": true,
	"hidden_activation": "gelu_pytorch_tanh",
}

// gemma3Prepare rewrites a Gemma 3 config.json into the flat form
// ParseConfig reads: the multimodal checkpoints' text_config lifted to the
// top (with the top level's architectures and quantization), HF's defaults
// filled in, and transformers 5's per-layer-type rope_parameters split into
// rope_theta/rope_scaling (global) and rope_local_base_freq (sliding). Other
// configs come back unchanged. Settings the engine does not implement are
// refused by name.
func gemma3Prepare(data []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return data, nil // ParseConfig reports it
	}
	var archs []string
	if err := json.Unmarshal(top["architectures"], &archs); err != nil || len(archs) == 0 {
		return data, nil
	}
	m := top
	if archs[0] == "Gemma3ForConditionalGeneration" {
		m = map[string]json.RawMessage{}
		if tc, ok := top["text_config"]; ok {
			if err := json.Unmarshal(tc, &m); err != nil {
				return nil, cfgErr("text_config", "%v", err)
			}
		}
		for _, k := range []string{"architectures", "quantization", "quantization_config", "torch_dtype", "dtype", "tie_word_embeddings"} {
			if v, ok := top[k]; ok {
				if _, has := m[k]; !has || k == "architectures" {
					m[k] = v
				}
			}
		}
	}
	for k, v := range gemma3Defaults {
		if raw, ok := m[k]; !ok || string(raw) == "null" && k != "sliding_window" {
			m[k], _ = json.Marshal(v)
		}
	}
	for _, k := range []string{"final_logit_softcapping", "attn_logit_softcapping"} {
		if raw, ok := m[k]; ok && string(raw) != "null" {
			return nil, cfgErr(k, "logit soft-capping (Gemma 2) is not supported")
		}
	}
	if raw, ok := m["use_bidirectional_attention"]; ok && string(raw) == "true" {
		return nil, cfgErr("use_bidirectional_attention", "bidirectional attention is not supported")
	}
	var act string
	if err := json.Unmarshal(m["hidden_activation"], &act); err != nil || act != "gelu_pytorch_tanh" {
		return nil, cfgErr("hidden_activation", "unsupported %s (want gelu_pytorch_tanh)", m["hidden_activation"])
	}
	if raw, ok := m["rope_parameters"]; ok && string(raw) != "null" {
		var rp map[string]map[string]any
		if json.Unmarshal(raw, &rp) == nil && (rp["full_attention"] != nil || rp["sliding_attention"] != nil) {
			if full := rp["full_attention"]; full != nil {
				if th, ok := full["rope_theta"]; ok {
					m["rope_theta"], _ = json.Marshal(th)
				}
				delete(full, "rope_theta")
				m["rope_scaling"], _ = json.Marshal(full)
			}
			if sl := rp["sliding_attention"]; sl != nil {
				if th, ok := sl["rope_theta"]; ok {
					m["rope_local_base_freq"], _ = json.Marshal(th)
				}
				if t, _ := sl["rope_type"].(string); t != "" && t != "default" {
					return nil, cfgErr("rope_parameters.sliding_attention.rope_type", "unsupported %q (want default)", t)
				}
			}
			delete(m, "rope_parameters")
		}
	}
	return json.Marshal(m)
}

// parseGemma3 reads the Gemma 3 fields of a prepared config into c.
func parseGemma3(data []byte, c *Config) error {
	var r struct {
		QPAS      *float64 `json:"query_pre_attn_scalar"`
		Local     *float64 `json:"rope_local_base_freq"`
		Pattern   *int     `json:"sliding_window_pattern"`
		Types     []string `json:"layer_types"`
		AttnBias  bool     `json:"attention_bias"`
		SlidingW  *int     `json:"sliding_window"`
		RopeScale *struct {
			Type string `json:"rope_type"`
		} `json:"rope_scaling"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return cfgErr("config.json", "%v", err)
	}
	g := &gemma3Config{QueryPreAttnScalar: *r.QPAS, LocalBase: *r.Local}
	if g.QueryPreAttnScalar <= 0 {
		return cfgErr("query_pre_attn_scalar", "must be positive (got %v)", g.QueryPreAttnScalar)
	}
	if g.LocalBase <= 0 {
		return cfgErr("rope_local_base_freq", "must be positive (got %v)", g.LocalBase)
	}
	if r.AttnBias {
		return cfgErr("attention_bias", "Gemma 3 with attention biases is not supported")
	}
	switch {
	case r.Types != nil:
		if len(r.Types) != c.Layers {
			return cfgErr("layer_types", "%d entries for %d layers", len(r.Types), c.Layers)
		}
		for i, t := range r.Types {
			if t != "sliding_attention" && t != "full_attention" {
				return cfgErr("layer_types", "layer %d: unsupported %q (want sliding_attention or full_attention)", i, t)
			}
		}
		g.LayerTypes = slices.Clone(r.Types)
	default:
		p := 6
		if r.Pattern != nil {
			p = *r.Pattern
		}
		if p <= 0 {
			return cfgErr("sliding_window_pattern", "must be positive (got %d)", p)
		}
		for i := range c.Layers {
			t := "sliding_attention"
			if (i+1)%p == 0 {
				t = "full_attention"
			}
			g.LayerTypes = append(g.LayerTypes, t)
		}
	}
	if slices.Contains(g.LayerTypes, "sliding_attention") && c.SlidingWindow <= 0 {
		return cfgErr("sliding_window", "sliding layers need a positive window")
	}
	c.ext = g
	return nil
}

func gemma3Layers(c *Config) ([]LayerKind, error) {
	g, ok := c.ext.(*gemma3Config)
	if !ok {
		return nil, cfgErr("architectures", "%s without its Gemma 3 settings", c.Arch)
	}
	return typedKinds(g.LayerTypes, c.SlidingWindow), checkExperts(c, false)
}

// gemma3Fingerprint: the sliding layers' RoPE base.
func gemma3Fingerprint(c *Config, w *fpWriter) {
	w.str("gemma3 local rope base")
	w.f64(c.ext.(*gemma3Config).LocalBase)
}

// plusOne loads a norm weight [n] as 1 + w, rounded to its dtype (what
// mlx-lm's Gemma RMSNorm computes before every use).
func (l *loader) plusOne(name string, n int) (Array, error) {
	t, err := l.rawTensor(name, n)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(t.Data))
	for i := range n {
		switch t.DType {
		case F32:
			v := math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(1+v))
		case BF16:
			v := half.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToBF16(1+v))
		case F16:
			v := half.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToF16(1+v))
		default:
			return nil, fmt.Errorf("%s: dtype %v for a norm weight", name, t.DType)
		}
	}
	return l.keep(l.b.FromBytes(out, t.Shape, t.DType)), nil
}

// gemma3Embed loads the embedding, scaled by √D rounded to bf16 (mlx-lm:
// h *= mx.array(hidden_size**0.5, mx.bfloat16).astype(h.dtype)).
func gemma3Embed(l *loader, c *Config) (*embedding, error) {
	e, err := standardEmbed(l, c)
	if err != nil {
		return nil, err
	}
	s := half.BF16ToF32(half.F32ToBF16(float32(math.Sqrt(float64(c.Hidden)))))
	sv := make([]float32, c.Hidden)
	for i := range sv {
		sv[i] = s
	}
	e.scale = l.keep(l.b.FromFloat32(sv, c.Hidden))
	return e, nil
}

func gemma3Head(l *loader, c *Config, e *embedding) (*outputHead, error) {
	return l.head("model.norm.weight", "lm_head", c, e, l.plusOne)
}

// gemma3Block loads layer i: four (1 + w) norms around attention (per-head
// q/k norms, scale query_pre_attn_scalar^−½, the local RoPE base on sliding
// layers) and a GeGLU MLP.
func gemma3Block(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	g := c.ext.(*gemma3Config)
	p := layerPrefix(i)
	rope := &c.RoPE
	if k.Window > 0 {
		rope = &RoPE{Dims: c.HeadDim, Base: g.LocalBase}
	}
	sp := attentionSpec{H: c.Heads, Hkv: c.KVHeads, Dh: c.HeadDim, qkNorm: true, rope: rope, window: k.Window,
		scale: float32(math.Pow(g.QueryPreAttnScalar, -0.5))}
	d := &decoderLayer{eps: float32(c.RMSNormEps)}
	var err error
	if d.mix, err = l.attention(p+"self_attn.", c.Hidden, sp, d.eps, l.plusOne); err != nil {
		return nil, err
	}
	if d.ff, err = l.mlp(p+"mlp.", c.Hidden, c.Intermediate, activation{geglu: true}); err != nil {
		return nil, err
	}
	return d, d.norms(l.plusOne, c.Hidden, p+"input_layernorm.weight", p+"post_attention_layernorm.weight",
		p+"pre_feedforward_layernorm.weight", p+"post_feedforward_layernorm.weight")
}
