package engine

import (
	"encoding/json"
	"fmt"
	"slices"
)

// This file is gpt-oss (HF GptOssForCausalLM, mlx-lm's gpt_oss layout) as a
// composition of the engine's blocks: sliding-window layers (window 128 in
// the released models) alternating with full ones, every layer with
// attention sinks and q/k/v/o biases, YaRN RoPE, and a sparse MoE on every
// layer whose router has a bias, whose top-k logits are softmaxed (the same
// weights as a softmax over all experts renormalized over the k), and whose
// experts have biases and gpt-oss's clamped SwiGLU (Backend.ClampedSwiGLU).
// The experts run on the MoE path every MoE takes (moe.go: routed inside
// the graph, one Eval per decode step); only the router, the biases and
// the activation differ. Expert weights may be dense or MXFP4, in mlx-lm's
// layout, the released checkpoints' (gate_up_proj_blocks, rows
// interleaving gate and up) or HF's dense one (gate_up_proj [E, D, 2F],
// columns interleaving gate and up).

// gptOssConfig holds gpt-oss's own config.json fields (Config.ext).
type gptOssConfig struct {
	SwiGLULimit float64  // swiglu_limit: the clamp of the expert activation
	LayerTypes  []string // layer_types (default: sliding, full, sliding, …)
}

// gptossAlpha is the sigmoid's slope in gpt-oss's SwiGLU (fixed, not in
// config.json).
const gptossAlpha = 1.702

func init() {
	Register("GptOssForCausalLM", &Architecture{KVFamily: "gpt_oss", Prepare: gptossPrepare, Parse: parseGptOss, Layers: gptossLayers, Block: gptossBlock,
		GGUF: &GGUFLayout{Name: "gpt-oss", ModelType: "gpt_oss", ExpertFFN: true, Config: gptossGGUFConfig,
			// The experts stacked, gate and up apart (the converter
			// splits HF's interleaved gate_up_proj), MXFP4 or dense,
			// with biases, in mlx-lm's gpt_oss layout.
			LayerNames: map[string]string{
				"post_attention_norm": "post_attention_layernorm",
				"attn_sinks":          "self_attn.sinks",
				"ffn_gate_inp":        "mlp.router",
				"ffn_gate_exps":       "mlp.experts.gate_proj",
				"ffn_up_exps":         "mlp.experts.up_proj",
				"ffn_down_exps":       "mlp.experts.down_proj",
			},
			TensorStems: map[string]bool{"attn_sinks": true}}})
}

// gptossGGUFConfig: llama.cpp's gpt-oss has every layer sparse, the top-k
// logits softmaxed, the experts' SwiGLU clamped at 7, every other layer
// (from the first) sliding, and one RoPE for all layers.
func gptossGGUFConfig(md GGUFMetadata, key func(string) string, cfg map[string]any) error {
	if err := ggufCopy(md, key, cfg, map[string]string{"num_local_experts": "expert_count",
		"num_experts_per_tok": "expert_used_count", "intermediate_size": "expert_feed_forward_length"}); err != nil {
		return err
	}
	cfg["swiglu_limit"] = 7.0
	if err := ggufSlidingLayers(md, key, cfg, 2); err != nil {
		return err
	}
	if b, ok := md.Float(key("rope.freq_base_swa")); ok && b != cfg["rope_theta"].(float64) {
		return fmt.Errorf("metadata %s: %g differs from rope.freq_base %g; a separate RoPE base for the sliding layers is not supported for gpt-oss", key("rope.freq_base_swa"), b, cfg["rope_theta"])
	}
	return nil
}

// gptossPrepare maps gpt-oss's names onto the MoE fields ParseConfig reads
// (num_local_experts → num_experts, intermediate_size → the experts' size,
// top-k weights renormalized); other configs come back unchanged.
func gptossPrepare(data []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return data, nil
	}
	if _, ok := m["num_experts"]; !ok {
		m["num_experts"] = m["num_local_experts"]
	}
	if _, ok := m["moe_intermediate_size"]; !ok {
		m["moe_intermediate_size"] = m["intermediate_size"]
	}
	m["norm_topk_prob"] = json.RawMessage("true")
	if raw, ok := m["quantization_config"]; ok {
		var q struct {
			Method string `json:"quant_method"`
		}
		if json.Unmarshal(raw, &q) == nil && q.Method == "mxfp4" {
			// The released checkpoints' MXFP4 experts (_blocks/_scales)
			// are read as they are (gptossMoE); the rest is dense.
			// parseGptOss notes the experts' group of 32 (ExpertGroup).
			delete(m, "quantization_config")
			m[gptossMXFP4Key] = json.RawMessage("true")
		}
	}
	if _, ok := m["attention_bias"]; !ok {
		m["attention_bias"] = json.RawMessage("true")
	}
	return json.Marshal(m)
}

// gptossMXFP4Key marks, in the prepared config, a checkpoint whose experts
// are MXFP4 (its quantization_config, which Prepare removes, said so).
const gptossMXFP4Key = "exo_gpt_oss_mxfp4_experts"

func parseGptOss(data []byte, c *Config) error {
	var r struct {
		MXFP4 bool     `json:"exo_gpt_oss_mxfp4_experts"`
		Limit *float64 `json:"swiglu_limit"`
		Types []string `json:"layer_types"`
		Bias  bool     `json:"attention_bias"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return cfgErr("config.json", "%v", err)
	}
	if r.MXFP4 {
		c.ExpertGroup = 32
	}
	g := &gptOssConfig{SwiGLULimit: 7}
	if r.Limit != nil {
		g.SwiGLULimit = *r.Limit
	}
	if g.SwiGLULimit <= 0 {
		return cfgErr("swiglu_limit", "must be positive (got %v)", g.SwiGLULimit)
	}
	if !r.Bias {
		return cfgErr("attention_bias", "gpt-oss without attention biases is not supported")
	}
	if c.Experts == 0 {
		return cfgErr("num_local_experts", "missing")
	}
	if r.Types == nil {
		for i := range c.Layers {
			r.Types = append(r.Types, []string{"sliding_attention", "full_attention"}[i%2])
		}
	}
	if len(r.Types) != c.Layers {
		return cfgErr("layer_types", "%d entries for %d layers", len(r.Types), c.Layers)
	}
	for i, t := range r.Types {
		if t != "sliding_attention" && t != "full_attention" {
			return cfgErr("layer_types", "layer %d: unsupported %q", i, t)
		}
	}
	if slices.Contains(r.Types, "sliding_attention") && c.SlidingWindow <= 0 {
		return cfgErr("sliding_window", "sliding layers need a positive window")
	}
	g.LayerTypes = r.Types
	c.ext = g
	return nil
}

func gptossLayers(c *Config) ([]LayerKind, error) {
	g, ok := c.ext.(*gptOssConfig)
	if !ok {
		return nil, cfgErr("architectures", "%s without its gpt-oss settings", c.Arch)
	}
	return typedKinds(g.LayerTypes, c.SlidingWindow), checkExperts(c, true)
}

// gptossBlock loads layer i: attention with q/k/v/o biases and sinks, the
// MoE on every layer.
func gptossBlock(l *loader, c *Config, i int, k LayerKind) (Block, error) {
	sp := llamaAttention(c, k)
	sp.sinks = true
	ff := func(p string) (feedForward, error) { return l.gptossMoE(p+"mlp.", i, c) }
	return l.preNormLayer(c, i, l.selfAttention(c, sp), ff)
}

// gptossMoE loads a gpt-oss MoE block: prefix+"router" (weight and bias)
// and the experts stacked [E, out, in] with biases [E, out], from mlx-lm's
// layout (prefix+"experts.{gate,up,down}_proj", dense or quantized, MXFP4
// included), the released checkpoints' MXFP4 blocks
// (gate_up_proj_blocks, gptossBlocks) or HF's dense layout (gate_up_proj
// [E, D, 2F], gptossDense). The experts run in the graph like every MoE's
// (moe.go: switchGLU).
func (l *loader) gptossMoE(prefix string, layer int, cfg *Config) (*moeBlock, error) {
	D, F, E := cfg.Hidden, cfg.MoEIntermediate, cfg.Experts
	mb := &moeBlock{prefix: prefix, layer: layer, numExperts: E, topK: cfg.ExpertsPerToken, norm: true, D: D,
		act:        activation{alpha: gptossAlpha, limit: float32(cfg.ext.(*gptOssConfig).SwiGLULimit)},
		routerName: prefix + "router", gateName: prefix + "experts.gate_proj", upName: prefix + "experts.up_proj", downName: prefix + "experts.down_proj"}
	r, err := l.linear(prefix+"router", E, D, true)
	if err != nil {
		return nil, err
	}
	mb.router = *r
	switch {
	case l.has(prefix + "experts.gate_up_proj_blocks"):
		return mb, l.gptossBlocks(prefix+"experts.", mb, D, F, E)
	case l.has(prefix + "experts.gate_up_proj"):
		return mb, l.gptossDense(prefix+"experts.", mb, D, F, E)
	}
	for _, p := range []struct {
		name    string
		out, in int
		dst     *Linear
		shard   Shard
	}{
		{"gate_proj", F, D, &mb.gate, SplitOutput},
		{"up_proj", F, D, &mb.up, SplitOutput},
		{"down_proj", D, F, &mb.down, SplitInput},
	} {
		name := prefix + "experts." + p.name
		lin, err := l.stackedLinear(func(int) string { return name }, true, E, p.out, p.in, p.shard)
		if err != nil {
			return nil, err
		}
		// gate/up biases split with their rows; down's is added once,
		// after the all_sum (rank 0's).
		sp := share{axis: 1}
		if p.shard == SplitInput {
			sp = share{axis: -1, first: true}
		}
		if lin.Bias, err = l.shardTensor(name+".bias", []int{E, p.out}, sp); err != nil {
			return nil, err
		}
		*p.dst = *lin
	}
	return mb, nil
}

// gptossDense loads HF's dense expert layout (GptOssExperts):
// gate_up_proj [E, D, 2F] whose even columns are the gate and odd columns
// the up projection, gate_up_proj_bias [E, 2F] interleaved alike,
// down_proj [E, F, D] and down_proj_bias [E, D]; the matrices are stored
// input-major (x · W), so they are transposed into the engine's [E, out,
// in] here, once, at load.
func (l *loader) gptossDense(prefix string, mb *moeBlock, D, F, E int) error {
	F *= l.ranks() // the whole model's width; each rank keeps its share (gptossShare)
	gu, err := l.rawTensor(prefix+"gate_up_proj", E, D, 2*F)
	if err != nil {
		return err
	}
	gub, err := l.rawTensor(prefix+"gate_up_proj_bias", E, 2*F)
	if err != nil {
		return err
	}
	dn, err := l.rawTensor(prefix+"down_proj", E, F, D)
	if err != nil {
		return err
	}
	dnb, err := l.rawTensor(prefix+"down_proj_bias", E, D)
	if err != nil {
		return err
	}
	if gu.DType != dn.DType {
		return fmt.Errorf("%sgate_up_proj is %v, down_proj %v", prefix, gu.DType, dn.DType)
	}
	sz := gu.DType.Size()
	// pick returns [E, out, in] with out[e][o][i] = t[e][i][first+o*step].
	pick := func(t Tensor, in, cols, first, step, out int) []byte {
		dst := make([]byte, E*out*in*sz)
		for e := range E {
			for o := range out {
				c := first + o*step
				for i := range in {
					src := ((e*in+i)*cols + c) * sz
					d := ((e*out+o)*in + i) * sz
					copy(dst[d:d+sz], t.Data[src:src+sz])
				}
			}
		}
		return dst
	}
	bsz := gub.DType.Size()
	biasRows := func(first int) []byte {
		dst := make([]byte, 0, E*F*bsz)
		for e := range E {
			for o := range F {
				c := (e*2*F + first + 2*o) * bsz
				dst = append(dst, gub.Data[c:c+bsz]...)
			}
		}
		return dst
	}
	var err2 error
	up := func(data []byte, shape []int, dt DType, sh Shard) Array {
		if err2 != nil {
			return nil
		}
		var d []byte
		var s []int
		if d, s, err2 = l.gptossShare(data, shape, dt, sh); err2 != nil || d == nil {
			return nil
		}
		return l.keep(l.b.FromBytes(d, s, dt))
	}
	mb.gate = Linear{W: up(pick(gu, D, 2*F, 0, 2, F), []int{E, F, D}, gu.DType, SplitOutput),
		Bias: up(biasRows(0), []int{E, F}, gub.DType, SplitOutput)}
	mb.up = Linear{W: up(pick(gu, D, 2*F, 1, 2, F), []int{E, F, D}, gu.DType, SplitOutput),
		Bias: up(biasRows(1), []int{E, F}, gub.DType, SplitOutput)}
	mb.down = Linear{W: up(pick(dn, F, D, 0, 1, D), []int{E, D, F}, dn.DType, SplitInput),
		Bias: up(dnb.Data, []int{E, D}, dnb.DType, Replicated)}
	if err2 != nil {
		return fmt.Errorf("%s: %w", prefix, err2)
	}
	if r := l.ranks(); r > 1 && l.tp.Rank() != 0 {
		mb.down.Bias = nil // added once, after the all_sum (rank 0's)
	}
	return nil
}

// gptossShare cuts a converted expert tensor (the whole model's, [E, out,
// in] or a bias [E, out]) to this rank's share: rows for SplitOutput (a
// bias's last axis), input columns for SplitInput; Replicated keeps it.
func (l *loader) gptossShare(data []byte, shape []int, dt DType, sh Shard) ([]byte, []int, error) {
	if len(shape) == 2 && sh == SplitOutput { // a bias [E, out]: its rows are the last axis
		ranges, err := l.cutIf(shape[1])
		if err != nil || ranges == nil {
			return data, shape, err
		}
		d, s := take(data, shape, dt.Size(), 1, ranges)
		return d, s, nil
	}
	return l.shardStacked(data, shape, dt.Size(), sh)
}

// gptossBlocks loads the released checkpoints' MXFP4 experts:
// gate_up_proj_blocks [E, 2F, D/32, 16] (uint8, two E2M1 values a byte, low
// nibble first: MLX's packing) with gate_up_proj_scales [E, 2F, D/32] (E8M0)
// and gate_up_proj_bias [E, 2F], whose even rows are the gate and odd rows
// the up projection; down_proj_blocks/_scales/_bias likewise for [E, D, F].
func (l *loader) gptossBlocks(prefix string, mb *moeBlock, D, F, E int) error {
	for _, p := range []struct {
		name    string
		out, in int
		fused   bool
	}{{"gate_up_proj", 2 * F, D, true}, {"down_proj", D, F, false}} {
		if p.in%32 != 0 {
			return fmt.Errorf("%s%s: %d inputs not a multiple of 32", prefix, p.name, p.in)
		}
		// A tensor-parallel rank reads the whole model's tensors (its
		// share of F times the ranks) and keeps its rows of gate/up and
		// its whole 32-input blocks of down.
		sh := SplitOutput
		if p.fused {
			p.out *= l.ranks()
		} else {
			sh = SplitInput
			p.in *= l.ranks()
		}
		blocks, err := l.rawTensor(prefix+p.name+"_blocks", E, p.out, p.in/32, 16)
		if err != nil {
			return err
		}
		scales, err := l.rawTensor(prefix+p.name+"_scales", E, p.out, p.in/32)
		if err != nil {
			return err
		}
		bias, err := l.rawTensor(prefix+p.name+"_bias", E, p.out)
		if err != nil {
			return err
		}
		if blocks.DType != U8 || scales.DType != U8 {
			return fmt.Errorf("%s%s: blocks %v, scales %v (want uint8)", prefix, p.name, blocks.DType, scales.DType)
		}
		// rows takes rows first, first+step, … of every expert of a
		// [E, R, ...] tensor whose rows are rowBytes long.
		rows := func(t Tensor, R, rowBytes, first, step int) []byte {
			var out []byte
			for e := range E {
				base := e * R * rowBytes
				for r := first; r < R; r += step {
					out = append(out, t.Data[base+r*rowBytes:base+(r+1)*rowBytes]...)
				}
			}
			return out
		}
		bs := bias.DType.Size()
		type part struct {
			dst        *Linear
			first, cnt int
		}
		parts := []part{{&mb.down, 0, p.out}}
		step := 1
		if p.fused {
			parts, step = []part{{&mb.gate, 0, p.out / 2}, {&mb.up, 1, p.out / 2}}, 2
		}
		for _, q := range parts {
			w, ws, err := l.shardStacked(rows(blocks, p.out, p.in/2, q.first, step), []int{E, q.cnt, p.in / 8}, 4, sh)
			if err != nil {
				return fmt.Errorf("%s%s: %w", prefix, p.name, err)
			}
			sc, ss, err := l.shardStacked(rows(scales, p.out, p.in/32, q.first, step), []int{E, q.cnt, p.in / 32}, 1, sh)
			if err != nil {
				return fmt.Errorf("%s%s: %w", prefix, p.name, err)
			}
			bsp := sh // gate/up biases split with their rows; down's stays whole (rank 0's, below)
			if sh == SplitInput {
				bsp = Replicated
			}
			bd, bsh, err := l.gptossShare(rows(bias, p.out, bs, q.first, step), []int{E, q.cnt}, bias.DType, bsp)
			if err != nil {
				return fmt.Errorf("%s%s: %w", prefix, p.name, err)
			}
			*q.dst = Linear{Bits: 4, GroupSize: 32, Mode: "mxfp4", W: l.keep(l.b.FromBytes(w, ws, U32)), Scales: l.keep(l.b.FromBytes(sc, ss, U8))}
			if sh == SplitOutput || l.ranks() == 1 || l.tp.Rank() == 0 {
				q.dst.Bias = l.keep(l.b.FromBytes(bd, bsh, bias.DType))
			}
		}
	}
	return nil
}
