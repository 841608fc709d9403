package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Config is the part of an HF config.json that the decoder-only models
// here read, after defaults are applied and validation has passed.
type Config struct {
	Arch             string // architectures[0], e.g. "LlamaForCausalLM"
	ModelType        string // model_type
	Hidden           int    // hidden_size
	Intermediate     int    // intermediate_size
	Layers           int    // num_hidden_layers
	Heads            int    // num_attention_heads
	KVHeads          int    // num_key_value_heads (default Heads)
	HeadDim          int    // head_dim (default Hidden/Heads)
	Vocab            int    // vocab_size
	MaxPositions     int    // max_position_embeddings
	RMSNormEps       float64
	RoPE             RoPE
	TieEmbeddings    bool      // tie_word_embeddings
	AttentionBias    bool      // attention_bias (Llama); Qwen2 always has QKV bias
	DType            DType     // torch_dtype (F32 when absent)
	DTypeSet         bool      // torch_dtype (or dtype) was present
	Quant            QuantSpec // quantization {bits, group_size}; zero when dense
	SlidingWindowUse bool      // use_sliding_window (Qwen2/Qwen3: layers from MaxWindowLayers slide)
	SlidingWindow    int       // sliding_window (0: none); see Arch.SlidingWindow
	MaxWindowLayers  int       // max_window_layers (default 28): Qwen's first sliding layer
	LayerTypes       []string  // layer_types ("sliding_attention" | "full_attention"), when given

	// Mixture of experts (Qwen3-MoE); Experts is 0 for dense models.
	Experts         int   // num_experts
	ExpertsPerToken int   // num_experts_per_tok
	MoEIntermediate int   // moe_intermediate_size
	NormTopKProb    bool  // norm_topk_prob: renormalize the chosen experts' weights
	SparseStep      int   // decoder_sparse_step (default 1): every n-th layer is sparse
	MLPOnlyLayers   []int // mlp_only_layers: layers that stay dense
	// shared_expert_intermediate_size (Qwen2-MoE): every sparse block also
	// runs one shared expert of this width, gated by sigmoid; 0: none.
	SharedExpertIntermediate int
	// ExpertGroup, when not 0, is the quantization group of the routed
	// experts where it is not Quant's (gpt-oss's released MXFP4 experts
	// in a checkpoint that is otherwise dense: 32); a tensor-parallel
	// split of their inputs must keep whole groups (CheckTensorSplit).
	ExpertGroup int

	// Gated DeltaNet hybrids (Qwen3-Next): every FullAttentionInterval-th
	// layer is gated full attention, the others Gated DeltaNet (linear
	// attention with a conv state and a recurrent state). 0: no such layers.
	FullAttentionInterval            int // full_attention_interval
	LinearKeyHeads, LinearValueHeads int // linear_num_key_heads, linear_num_value_heads
	LinearKeyDim, LinearValueDim     int // linear_key_head_dim, linear_value_head_dim
	LinearConvKernel                 int // linear_conv_kernel_dim

	// ext holds the architecture's own settings, parsed by its
	// Architecture.Parse (its arch_*.go file's type); nil when it has none.
	ext any
}

// IsLinearLayer reports whether layer i is a Gated DeltaNet layer.
func (c *Config) IsLinearLayer(i int) bool {
	return c.FullAttentionInterval > 0 && (i+1)%c.FullAttentionInterval != 0
}

// IsMoELayer reports whether layer i has a sparse MoE block.
func (c *Config) IsMoELayer(i int) bool {
	return c.Experts > 0 && !slices.Contains(c.MLPOnlyLayers, i) && (i+1)%c.SparseStep == 0
}

// ErrConfig is wrapped by every config.json validation error.
var ErrConfig = errors.New("engine: invalid config.json")

type rawConfig struct {
	Architectures      []string         `json:"architectures"`
	ModelType          string           `json:"model_type"`
	HiddenSize         *int             `json:"hidden_size"`
	IntermediateSize   *int             `json:"intermediate_size"`
	NumHiddenLayers    *int             `json:"num_hidden_layers"`
	NumAttentionHeads  *int             `json:"num_attention_heads"`
	NumKeyValueHeads   *int             `json:"num_key_value_heads"`
	HeadDim            *int             `json:"head_dim"`
	VocabSize          *int             `json:"vocab_size"`
	MaxPositions       *int             `json:"max_position_embeddings"`
	RMSNormEps         *float64         `json:"rms_norm_eps"`
	RopeTheta          *float64         `json:"rope_theta"`
	RopeScaling        *json.RawMessage `json:"rope_scaling"`
	RopeParameters     *json.RawMessage `json:"rope_parameters"`
	PartialRotary      *float64         `json:"partial_rotary_factor"`
	TieWordEmbeddings  *bool            `json:"tie_word_embeddings"`
	AttentionBias      *bool            `json:"attention_bias"`
	TorchDType         string           `json:"torch_dtype"`
	DType              string           `json:"dtype"`
	Quantization       *json.RawMessage `json:"quantization"`
	QuantizationConfig *json.RawMessage `json:"quantization_config"`
	UseSlidingWindow   *bool            `json:"use_sliding_window"`
	SlidingWindow      *int             `json:"sliding_window"`
	MaxWindowLayers    *int             `json:"max_window_layers"`
	LayerTypes         []string         `json:"layer_types"`
	NumExperts         *int             `json:"num_experts"`
	NumExpertsPerTok   *int             `json:"num_experts_per_tok"`
	MoEIntermediate    *int             `json:"moe_intermediate_size"`
	NormTopKProb       *bool            `json:"norm_topk_prob"`
	DecoderSparseStep  *int             `json:"decoder_sparse_step"`
	MLPOnlyLayers      []int            `json:"mlp_only_layers"`
	SharedExpert       *int             `json:"shared_expert_intermediate_size"`
	FullAttnInterval   *int             `json:"full_attention_interval"`
	LinearKeyHeads     *int             `json:"linear_num_key_heads"`
	LinearValueHeads   *int             `json:"linear_num_value_heads"`
	LinearKeyDim       *int             `json:"linear_key_head_dim"`
	LinearValueDim     *int             `json:"linear_value_head_dim"`
	LinearConvKernel   *int             `json:"linear_conv_kernel_dim"`
}

type rawRoPE struct {
	Type                 string   `json:"type"`
	RopeType             string   `json:"rope_type"`
	RopeTheta            *float64 `json:"rope_theta"`
	Factor               *float64 `json:"factor"`
	LowFreqFactor        *float64 `json:"low_freq_factor"`
	HighFreqFactor       *float64 `json:"high_freq_factor"`
	OriginalMaxPositions *int     `json:"original_max_position_embeddings"`
	BetaFast             *float64 `json:"beta_fast"`
	BetaSlow             *float64 `json:"beta_slow"`
	MScale               *float64 `json:"mscale"`
	MScaleAllDim         *float64 `json:"mscale_all_dim"`
	AttentionFactor      *float64 `json:"attention_factor"`
	Truncate             *bool    `json:"truncate"`
}

func cfgErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

func positive(field string, v *int, def int) (int, error) {
	if v == nil {
		if def > 0 {
			return def, nil
		}
		return 0, cfgErr(field, "missing")
	}
	if *v <= 0 {
		return 0, cfgErr(field, "must be positive (got %d)", *v)
	}
	return *v, nil
}

// ParseConfig parses and validates config.json bytes, applying HF defaults
// and the registered architecture's own preparation and validation.
func ParseConfig(data []byte) (*Config, error) {
	var peek struct {
		Architectures []string `json:"architectures"`
	}
	var arch *Architecture
	if json.Unmarshal(data, &peek) == nil && len(peek.Architectures) > 0 {
		arch = registered(peek.Architectures[0])
	}
	var err error
	if arch != nil && arch.Prepare != nil {
		if data, err = arch.Prepare(data); err != nil {
			return nil, err
		}
	}
	var r rawConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c := &Config{ModelType: r.ModelType}
	if len(r.Architectures) == 0 || r.Architectures[0] == "" {
		return nil, cfgErr("architectures", "missing (want e.g. [\"LlamaForCausalLM\"])")
	}
	c.Arch = r.Architectures[0]
	if c.Hidden, err = positive("hidden_size", r.HiddenSize, 0); err != nil {
		return nil, err
	}
	if c.Intermediate, err = positive("intermediate_size", r.IntermediateSize, 0); err != nil {
		return nil, err
	}
	if c.Layers, err = positive("num_hidden_layers", r.NumHiddenLayers, 0); err != nil {
		return nil, err
	}
	if c.Heads, err = positive("num_attention_heads", r.NumAttentionHeads, 0); err != nil {
		return nil, err
	}
	if c.KVHeads, err = positive("num_key_value_heads", r.NumKeyValueHeads, c.Heads); err != nil {
		return nil, err
	}
	if c.Heads%c.KVHeads != 0 {
		return nil, cfgErr("num_key_value_heads", "%d does not divide num_attention_heads %d", c.KVHeads, c.Heads)
	}
	defHead := 0
	if c.Hidden%c.Heads == 0 {
		defHead = c.Hidden / c.Heads
	}
	if c.HeadDim, err = positive("head_dim", r.HeadDim, defHead); err != nil {
		return nil, fmt.Errorf("%w (hidden_size %d is not a multiple of num_attention_heads %d)", err, c.Hidden, c.Heads)
	}
	if c.HeadDim%2 != 0 {
		return nil, cfgErr("head_dim", "must be even for RoPE (got %d)", c.HeadDim)
	}
	if c.Vocab, err = positive("vocab_size", r.VocabSize, 0); err != nil {
		return nil, err
	}
	if c.MaxPositions, err = positive("max_position_embeddings", r.MaxPositions, 2048); err != nil {
		return nil, err
	}
	c.RMSNormEps = 1e-6
	if r.RMSNormEps != nil {
		if *r.RMSNormEps <= 0 || *r.RMSNormEps > 0.1 {
			return nil, cfgErr("rms_norm_eps", "out of range (got %v)", *r.RMSNormEps)
		}
		c.RMSNormEps = *r.RMSNormEps
	}
	if r.TieWordEmbeddings != nil {
		c.TieEmbeddings = *r.TieWordEmbeddings
	}
	if r.AttentionBias != nil {
		c.AttentionBias = *r.AttentionBias
	}
	if r.UseSlidingWindow != nil {
		c.SlidingWindowUse = *r.UseSlidingWindow
	}
	if r.SlidingWindow != nil && *r.SlidingWindow > 0 {
		c.SlidingWindow = *r.SlidingWindow
	}
	c.MaxWindowLayers = 28
	if r.MaxWindowLayers != nil {
		c.MaxWindowLayers = *r.MaxWindowLayers
	}
	if r.LayerTypes != nil {
		if len(r.LayerTypes) != c.Layers {
			return nil, cfgErr("layer_types", "%d entries for %d layers", len(r.LayerTypes), c.Layers)
		}
		for i, t := range r.LayerTypes {
			if t != "sliding_attention" && t != "full_attention" {
				return nil, cfgErr("layer_types", "layer %d: unsupported %q (want sliding_attention or full_attention)", i, t)
			}
		}
		c.LayerTypes = slices.Clone(r.LayerTypes)
	}
	c.DType = F32
	dt := r.TorchDType
	if dt == "" {
		dt = r.DType
	}
	if dt != "" {
		d, err := ParseDType(dt)
		if err != nil || (d != F32 && d != F16 && d != BF16) {
			return nil, cfgErr("torch_dtype", "unsupported %q (want float32, float16 or bfloat16)", dt)
		}
		c.DType, c.DTypeSet = d, true
	}
	if err := parseRoPE(&r, c); err != nil {
		return nil, err
	}
	for _, parse := range []func(*rawConfig, *Config) error{parseMoE, parseLinearAttention, parseQuantization} {
		if err := parse(&r, c); err != nil {
			return nil, err
		}
	}
	if arch != nil && arch.Parse != nil {
		if err := arch.Parse(data, c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func parseRoPE(r *rawConfig, c *Config) error {
	theta := 10000.0
	if r.RopeTheta != nil {
		theta = *r.RopeTheta
	}
	var rr rawRoPE
	field := "rope_scaling"
	raw := r.RopeScaling
	if r.RopeParameters != nil && string(*r.RopeParameters) != "null" {
		raw, field = r.RopeParameters, "rope_parameters"
	}
	if raw != nil && string(*raw) != "null" {
		if err := json.Unmarshal(*raw, &rr); err != nil {
			return cfgErr(field, "%v", err)
		}
		if rr.RopeTheta != nil {
			theta = *rr.RopeTheta
		}
	}
	if theta <= 0 || math.IsInf(theta, 0) || math.IsNaN(theta) {
		return cfgErr("rope_theta", "must be positive (got %v)", theta)
	}
	dims := c.HeadDim
	if r.PartialRotary != nil {
		if *r.PartialRotary <= 0 || *r.PartialRotary > 1 {
			return cfgErr("partial_rotary_factor", "out of range (got %v)", *r.PartialRotary)
		}
		dims = int(float64(c.HeadDim) * *r.PartialRotary)
		dims -= dims % 2
	}
	c.RoPE = RoPE{Dims: dims, Base: theta}
	typ := rr.RopeType
	if typ == "" {
		typ = rr.Type
	}
	f := func(p *float64, def float64) float64 {
		if p == nil {
			return def
		}
		return *p
	}
	s := RoPEScaling{}
	if rr.Truncate != nil && typ != "yarn" {
		return cfgErr(field+".truncate", "applies to yarn scaling only (rope type %q)", typ)
	}
	switch typ {
	case "", "default":
	case "linear":
		s = RoPEScaling{Type: "linear", Factor: f(rr.Factor, 0)}
		if s.Factor <= 0 {
			return cfgErr(field+".factor", "must be positive for linear scaling (got %v)", s.Factor)
		}
	case "llama3":
		s = RoPEScaling{Type: "llama3", Factor: f(rr.Factor, 0), LowFreqFactor: f(rr.LowFreqFactor, 1), HighFreqFactor: f(rr.HighFreqFactor, 4)}
		if rr.OriginalMaxPositions != nil {
			s.OriginalMaxPositions = *rr.OriginalMaxPositions
		}
		switch {
		case s.Factor <= 0:
			return cfgErr(field+".factor", "must be positive for llama3 scaling (got %v)", s.Factor)
		case s.OriginalMaxPositions <= 0:
			return cfgErr(field+".original_max_position_embeddings", "required for llama3 scaling")
		case s.HighFreqFactor <= s.LowFreqFactor:
			return cfgErr(field+".high_freq_factor", "must exceed low_freq_factor (%v ≤ %v)", s.HighFreqFactor, s.LowFreqFactor)
		}
	case "yarn":
		s = RoPEScaling{Type: "yarn", Factor: f(rr.Factor, 0), BetaFast: f(rr.BetaFast, 32), BetaSlow: f(rr.BetaSlow, 1),
			MScale: f(rr.MScale, 0), MScaleAllDim: f(rr.MScaleAllDim, 0), NoTruncate: rr.Truncate != nil && !*rr.Truncate}
		s.OriginalMaxPositions = c.MaxPositions
		if rr.OriginalMaxPositions != nil {
			s.OriginalMaxPositions = *rr.OriginalMaxPositions
		}
		if s.Factor <= 0 {
			return cfgErr(field+".factor", "must be positive for yarn scaling (got %v)", s.Factor)
		}
		if rr.AttentionFactor != nil {
			return cfgErr(field+".attention_factor", "explicit attention_factor is not supported")
		}
	default:
		return cfgErr(field+".rope_type", "unsupported %q (want default, linear, llama3 or yarn)", typ)
	}
	c.RoPE.Scale = s
	return nil
}

// parseMoE reads the mixture-of-experts fields (num_experts > 0).
func parseMoE(r *rawConfig, c *Config) (err error) {
	if r.NumExperts != nil && *r.NumExperts > 0 {
		c.Experts = *r.NumExperts
		if c.ExpertsPerToken, err = positive("num_experts_per_tok", r.NumExpertsPerTok, 0); err != nil {
			return err
		}
		if c.ExpertsPerToken > c.Experts {
			return cfgErr("num_experts_per_tok", "%d exceeds num_experts %d", c.ExpertsPerToken, c.Experts)
		}
		if c.MoEIntermediate, err = positive("moe_intermediate_size", r.MoEIntermediate, 0); err != nil {
			return err
		}
		if c.SparseStep, err = positive("decoder_sparse_step", r.DecoderSparseStep, 1); err != nil {
			return err
		}
		if r.NormTopKProb != nil {
			c.NormTopKProb = *r.NormTopKProb
		}
		for _, l := range r.MLPOnlyLayers {
			if l < 0 || l >= c.Layers {
				return cfgErr("mlp_only_layers", "layer %d out of range [0, %d)", l, c.Layers)
			}
		}
		c.MLPOnlyLayers = slices.Clone(r.MLPOnlyLayers)
		if r.SharedExpert != nil {
			if c.SharedExpertIntermediate, err = positive("shared_expert_intermediate_size", r.SharedExpert, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseLinearAttention reads the Gated DeltaNet fields (linear_* and
// full_attention_interval).
func parseLinearAttention(r *rawConfig, c *Config) (err error) {
	if r.LinearKeyHeads != nil || r.FullAttnInterval != nil {
		for _, f := range []struct {
			name string
			raw  *int
			def  int
			dst  *int
		}{
			{"full_attention_interval", r.FullAttnInterval, 4, &c.FullAttentionInterval},
			{"linear_num_key_heads", r.LinearKeyHeads, 0, &c.LinearKeyHeads},
			{"linear_num_value_heads", r.LinearValueHeads, 0, &c.LinearValueHeads},
			{"linear_key_head_dim", r.LinearKeyDim, 0, &c.LinearKeyDim},
			{"linear_value_head_dim", r.LinearValueDim, 0, &c.LinearValueDim},
			{"linear_conv_kernel_dim", r.LinearConvKernel, 0, &c.LinearConvKernel},
		} {
			if *f.dst, err = positive(f.name, f.raw, f.def); err != nil {
				return err
			}
		}
		if c.LinearValueHeads%c.LinearKeyHeads != 0 {
			return cfgErr("linear_num_value_heads", "%d is not a multiple of linear_num_key_heads %d", c.LinearValueHeads, c.LinearKeyHeads)
		}
	}
	return nil
}

// parseQuantization reads quantization (or quantization_config).
func parseQuantization(r *rawConfig, c *Config) error {
	q := r.Quantization
	if q == nil {
		q = r.QuantizationConfig
	}
	if q != nil && string(*q) != "null" {
		var rq struct {
			Bits      int `json:"bits"`
			GroupSize int `json:"group_size"`
		}
		if err := json.Unmarshal(*q, &rq); err != nil {
			return cfgErr("quantization", "%v", err)
		}
		switch rq.Bits {
		case 2, 4, 8:
		default:
			return cfgErr("quantization.bits", "unsupported %d (want 2, 4 or 8)", rq.Bits)
		}
		switch rq.GroupSize {
		case 32, 64, 128:
		default:
			return cfgErr("quantization.group_size", "unsupported %d (want 32, 64 or 128)", rq.GroupSize)
		}
		c.Quant = QuantSpec{Bits: rq.Bits, GroupSize: rq.GroupSize}
	}
	return nil
}
