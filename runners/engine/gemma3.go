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

// Gemma3Config holds the Gemma 3 fields of config.json.
type Gemma3Config struct {
	QueryPreAttnScalar float64  // query_pre_attn_scalar: attention scale is its -1/2 power
	LocalBase          float64  // rope_local_base_freq: the sliding layers' RoPE base
	LayerTypes         []string // layer_types, or from sliding_window_pattern
}

func init() {
	RegisterArch("Gemma3ForCausalLM", Arch{Family: "gemma3", QKNorm: true, Windows: gemma3Windows})
	RegisterArch("Gemma3ForConditionalGeneration", Arch{Family: "gemma3", QKNorm: true, Windows: gemma3Windows})
}

func isGemma3(arch string) bool {
	return arch == "Gemma3ForCausalLM" || arch == "Gemma3ForConditionalGeneration"
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
	if err := json.Unmarshal(top["architectures"], &archs); err != nil || len(archs) == 0 || !isGemma3(archs[0]) {
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
	g := &Gemma3Config{QueryPreAttnScalar: *r.QPAS, LocalBase: *r.Local}
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
	c.Gemma3 = g
	return nil
}

// gemma3Windows: sliding_attention layers slide over sliding_window.
func gemma3Windows(c *Config) ([]int, error) {
	if c.Gemma3 == nil {
		return nil, cfgErr("architectures", "%s without its Gemma 3 settings", c.Arch)
	}
	w := make([]int, c.Layers)
	for i, t := range c.Gemma3.LayerTypes {
		if t == "sliding_attention" {
			w[i] = c.SlidingWindow
		}
	}
	return w, nil
}

// gemma3Prefix finds where the text model's weights live: "model." for
// Gemma3ForCausalLM; for the multimodal checkpoints "language_model.model."
// (original and mlx-community layouts) or "model.language_model."
// (transformers 5). The vision tower's weights are not read.
func (l *loader) gemma3Prefix() (string, error) {
	for _, p := range []string{"model.", "language_model.model.", "model.language_model."} {
		if l.has(p + "embed_tokens.weight") {
			return p, nil
		}
	}
	return "", fmt.Errorf("embed_tokens.weight under model., language_model.model. or model.language_model.: %w", ErrNotFound)
}

// plusOne loads a norm weight [n] as 1 + w, rounded to its dtype (what
// mlx-lm's Gemma RMSNorm computes before every use).
func (l *loader) plusOne(name string, n int) (Array, error) {
	t, err := l.src.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !slices.Equal(t.Shape, []int{n}) {
		return nil, fmt.Errorf("%s: shape %v, want [%d]", name, t.Shape, n)
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
	a := l.b.FromBytes(out, t.Shape, t.DType)
	l.b.Keep(a)
	l.kept = append(l.kept, a)
	l.done += int64(len(t.Data))
	return a, nil
}

// gemma3 loads the whole text model into m.
func (l *loader) gemma3(m *Model, cfg *Config) error {
	pfx, err := l.gemma3Prefix()
	if err != nil {
		return err
	}
	D, H, Hkv, Dh, F, V := cfg.Hidden, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.Intermediate, cfg.Vocab
	if m.embed, err = l.linear(pfx+"embed_tokens", V, D, false); err != nil {
		return err
	}
	m.lmHead = m.embed
	head := "lm_head"
	if pfx == "language_model.model." {
		head = "language_model.lm_head"
	}
	if l.has(head + ".weight") {
		if m.lmHead, err = l.linear(head, V, D, false); err != nil {
			return err
		}
	} else if !cfg.TieEmbeddings {
		return fmt.Errorf("engine: %s.weight: %w (and tie_word_embeddings is false)", head, ErrNotFound)
	}
	if m.norm, err = l.plusOne(pfx+"norm.weight", D); err != nil {
		return err
	}
	// mlx-lm: h *= mx.array(hidden_size**0.5, mx.bfloat16).astype(h.dtype)
	s := half.BF16ToF32(half.F32ToBF16(float32(math.Sqrt(float64(D)))))
	sv := make([]float32, D)
	for i := range sv {
		sv[i] = s
	}
	m.embedScale = l.b.FromFloat32(sv, D)
	l.b.Keep(m.embedScale)
	l.kept = append(l.kept, m.embedScale)
	m.attnScale = float32(math.Pow(cfg.Gemma3.QueryPreAttnScalar, -0.5))
	local := &RoPE{Dims: cfg.HeadDim, Base: cfg.Gemma3.LocalBase}
	m.layers = make([]block, cfg.Layers)
	for i := range m.layers {
		if err := l.ctx.Err(); err != nil {
			return err
		}
		b := &m.layers[i]
		p := fmt.Sprintf("%slayers.%d.", pfx, i)
		lin := func(dst *Linear, name string, out, in int) error {
			x, err := l.linear(p+name, out, in, false)
			if err != nil {
				return fmt.Errorf("engine: load layer %d: %w", i, err)
			}
			*dst = *x
			return nil
		}
		norm := func(dst *Array, name string, n int) error {
			var err error
			if *dst, err = l.plusOne(p+name, n); err != nil {
				return fmt.Errorf("engine: load layer %d: %w", i, err)
			}
			return nil
		}
		for _, e := range []error{
			lin(&b.q, "self_attn.q_proj", H*Dh, D), lin(&b.k, "self_attn.k_proj", Hkv*Dh, D),
			lin(&b.v, "self_attn.v_proj", Hkv*Dh, D), lin(&b.o, "self_attn.o_proj", D, H*Dh),
			lin(&b.gate, "mlp.gate_proj", F, D), lin(&b.up, "mlp.up_proj", F, D), lin(&b.down, "mlp.down_proj", D, F),
			norm(&b.inNorm, "input_layernorm.weight", D), norm(&b.postNorm, "post_attention_layernorm.weight", D),
			norm(&b.preFFNorm, "pre_feedforward_layernorm.weight", D), norm(&b.postFFNorm, "post_feedforward_layernorm.weight", D),
			norm(&b.qNorm, "self_attn.q_norm.weight", Dh), norm(&b.kNorm, "self_attn.k_norm.weight", Dh),
		} {
			if e != nil {
				return e
			}
		}
		if m.window(i) > 0 {
			b.rope = local
		}
	}
	return nil
}

// gemma3Residual finishes a Gemma 3 layer after attention (a [L, H·Dh]):
// x + post_attention_norm(o_proj(a)), then the GeGLU MLP between its pre-
// and post-feedforward norms, added to the residual.
func (m *Model) gemma3Residual(ly *block, x, a Array) Array {
	b := m.b
	x = b.Add(x, b.RMSNorm(b.Linear(a, &ly.o), ly.postNorm, m.eps))
	h := b.RMSNorm(x, ly.preFFNorm, m.eps)
	g := b.GeGLU(b.Linear(h, &ly.gate), b.Linear(h, &ly.up))
	return b.Add(x, b.RMSNorm(b.Linear(g, &ly.down), ly.postFFNorm, m.eps))
}
