package engine

import (
	"fmt"
	"math"
)

// This file holds the shared blocks the architectures compose: the decoder
// layer (a mixer and a feed-forward part, each in a residual branch with
// optional norms around it), attention (full, sliding, with sinks, gated,
// with or without RoPE, q/k norms per head or over the projection) and the
// dense MLP (SwiGLU, GeGLU, clamped SwiGLU). The MoE feed-forward
// is in moe.go, the Gated DeltaNet mixer in deltanet.go.

// mixer is the token-mixing half of a decoder layer: attention or a
// recurrent layer. forward returns its output [n, D] for the step's rows h
// [n, D] (nil when s.tail: it then only fills the caches).
type mixer interface {
	kind() LayerKind
	forward(s *step, slot int, h Array) Array
	weights() []Weight
}

// feedForward is the channel-mixing half: a dense MLP or a MoE. x is the
// residual stream (which a host-routed MoE must keep alive), h the normed
// input; it returns the branch's output [n, D].
type feedForward interface {
	forward(s *step, x, h Array) (Array, error)
	weights() []Weight
}

// decoderLayer is x += post(mix(pre(x))); x += postFF(ff(preFF(x))),
// each norm optional (nil): Llama-style layers norm before each branch,
// Gemma 3 before and after, OLMo 2 after only.
type decoderLayer struct {
	mix               mixer
	ff                feedForward
	preMix, postMix   Array // [D] RMSNorm weights or nil
	preFF, postFF     Array
	eps               float32
	preMixN, postMixN string // the norms' tensor names (Weights)
	preFFN, postFFN   string
}

func (l *decoderLayer) Kind() LayerKind { return l.mix.kind() }

func (l *decoderLayer) Weights() []Weight {
	var w []Weight
	for _, n := range []string{l.preMixN, l.postMixN, l.preFFN, l.postFFN} {
		if n != "" {
			w = append(w, Weight{n, Replicated})
		}
	}
	w = append(w, l.mix.weights()...)
	return append(w, l.ff.weights()...)
}

func (l *decoderLayer) forward(s *step, slot int, x Array) (Array, error) {
	b := s.b
	h := x
	if l.preMix != nil {
		h = b.RMSNorm(x, l.preMix, l.eps)
	}
	a := l.mix.forward(s, slot, h)
	if s.tail {
		return nil, nil
	}
	if l.postMix != nil {
		a = b.RMSNorm(a, l.postMix, l.eps)
	}
	x = b.Add(x, a)
	h = x
	if l.preFF != nil {
		h = b.RMSNorm(x, l.preFF, l.eps)
	}
	y, err := l.ff.forward(s, x, h)
	if err != nil {
		return nil, err
	}
	if l.postFF != nil {
		y = b.RMSNorm(y, l.postFF, l.eps)
	}
	return b.Add(x, y), nil
}

// norms loads a decoder layer's norms by name ("" for a norm the layer
// does not have) with load (the loader's norm or a family's variant).
func (l *decoderLayer) norms(load func(name string, n int) (Array, error), D int, preMix, postMix, preFF, postFF string) error {
	for _, p := range []struct {
		name string
		dst  *Array
		dstN *string
	}{{preMix, &l.preMix, &l.preMixN}, {postMix, &l.postMix, &l.postMixN}, {preFF, &l.preFF, &l.preFFN}, {postFF, &l.postFF, &l.postFFN}} {
		if p.name == "" {
			continue
		}
		var err error
		if *p.dst, err = load(p.name, D); err != nil {
			return err
		}
		*p.dstN = p.name
	}
	return nil
}

// attention is grouped-query attention over the layer's cache: q/k/v
// projections (biases optional), optional q/k RMSNorms, RoPE (nil: none,
// SmolLM3's NoPE layers), the causal op (windowed and with sinks when the
// layer has them), an optional sigmoid output gate, and o_proj.
type attention struct {
	prefix     string // "model.layers.N.self_attn."
	q, k, v, o Linear
	H, Hkv, Dh int
	// qNorm, kNorm: RMSNorm weights over each head [Dh] (Qwen3) or, with
	// normWhole, over the whole projection [H·Dh] / [Hkv·Dh] (OLMo 2).
	qNorm, kNorm Array
	normWhole    bool
	// gated: q_proj gives queries and an output gate, interleaved per
	// head (Qwen3-Next): the output is multiplied by sigmoid(gate).
	gated  bool
	rope   *RoPE // nil: no rotary embedding
	window int   // 0: full attention
	sinks  Array // [H] attention sinks or nil
	scale  float32
	eps    float32
}

// attentionSpec says which parts an attention block has.
type attentionSpec struct {
	H, Hkv, Dh int
	qkvBias    bool // q/k/v biases
	oBias      bool // o_proj bias
	qkNorm     bool // q_norm / k_norm
	normWhole  bool // the q/k norms span the projection, not each head
	gated      bool
	sinks      bool
	rope       *RoPE
	window     int
	scale      float32 // 0: 1/√Dh
}

// attention loads an attention block under prefix ("model.layers.N.self_attn.")
// with norms read by norm.
func (l *loader) attention(prefix string, D int, sp attentionSpec, eps float32, norm func(string, int) (Array, error)) (*attention, error) {
	a := &attention{prefix: prefix, H: sp.H, Hkv: sp.Hkv, Dh: sp.Dh, normWhole: sp.normWhole, gated: sp.gated,
		rope: sp.rope, window: sp.window, scale: sp.scale, eps: eps}
	if a.scale == 0 {
		a.scale = float32(1 / math.Sqrt(float64(sp.Dh)))
	}
	qOut := sp.H * sp.Dh
	if sp.gated {
		qOut *= 2 // queries and the output gate
	}
	if sp.normWhole && l.ranks() > 1 {
		return nil, fmt.Errorf("%sq_norm: %w: a norm over the whole projection needs every rank's share", prefix, ErrTensorSplit)
	}
	// A tensor-parallel rank loads its heads' rows of q/k/v (H and Hkv
	// are its own counts: q_proj's rows are grouped per head, queries
	// and gate together when gated) and their columns of o_proj.
	for _, p := range []struct {
		name    string
		out, in int
		bias    bool
		dst     *Linear
		shard   Shard
	}{
		{"q_proj", qOut, D, sp.qkvBias, &a.q, SplitOutput},
		{"k_proj", sp.Hkv * sp.Dh, D, sp.qkvBias, &a.k, SplitOutput},
		{"v_proj", sp.Hkv * sp.Dh, D, sp.qkvBias, &a.v, SplitOutput},
		{"o_proj", D, sp.H * sp.Dh, sp.oBias, &a.o, SplitInput},
	} {
		lin, err := l.shardLinear(prefix+p.name, p.out, p.in, p.bias, p.shard)
		if err != nil {
			return nil, err
		}
		*p.dst = *lin
	}
	var err error
	if sp.sinks {
		if a.sinks, err = l.shardTensor(prefix+"sinks", []int{sp.H}, share{axis: 0}); err != nil {
			return nil, err
		}
	}
	if sp.qkNorm {
		qn, kn := sp.Dh, sp.Dh
		if sp.normWhole {
			qn, kn = sp.H*sp.Dh, sp.Hkv*sp.Dh
		}
		if a.qNorm, err = norm(prefix+"q_norm.weight", qn); err != nil {
			return nil, err
		}
		if a.kNorm, err = norm(prefix+"k_norm.weight", kn); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *attention) kind() LayerKind { return LayerKind{Window: a.window} }

func (a *attention) weights() []Weight {
	p := a.prefix
	w := []Weight{{p + "q_proj", SplitOutput}, {p + "k_proj", SplitOutput}, {p + "v_proj", SplitOutput}, {p + "o_proj", SplitInput}}
	if a.qNorm != nil {
		// Per-head norms are the same on every rank; norms over the
		// whole projection need the full row (an all_gather first).
		w = append(w, Weight{p + "q_norm.weight", Replicated}, Weight{p + "k_norm.weight", Replicated})
	}
	if a.sinks != nil {
		w = append(w, Weight{p + "sinks", SplitHeads})
	}
	return w
}

func (a *attention) forward(s *step, slot int, h Array) Array {
	b, n := s.b, s.n
	H, Hkv, Dh := a.H, a.Hkv, a.Dh
	q := b.Linear(h, &a.q)
	var gate Array // [n, H·Dh]
	if a.gated {
		qg := b.Reshape(q, s.dims(n, H, 2*Dh)...)
		q, gate = b.Slice(qg, 2, 0, Dh), b.Reshape(b.Slice(qg, 2, Dh, 2*Dh), s.dims(n, H*Dh)...)
	}
	k, v := b.Linear(h, &a.k), b.Linear(h, &a.v)
	if a.normWhole && a.qNorm != nil {
		q, k = b.RMSNorm(q, a.qNorm, a.eps), b.RMSNorm(k, a.kNorm, a.eps)
	}
	q = b.Reshape(q, s.dims(n, H, Dh)...) // [n, H, Dh]
	k = b.Reshape(k, s.dims(n, Hkv, Dh)...)
	v = b.Reshape(v, s.dims(n, Hkv, Dh)...)
	if !a.normWhole && a.qNorm != nil {
		q, k = b.RMSNorm(q, a.qNorm, a.eps), b.RMSNorm(k, a.kNorm, a.eps)
	}
	if s.decode && !s.tail {
		// A decode step of several sequences: RoPE, the cache appends and
		// attention are one op each over all the rows, so the graph of a
		// layer does not grow with the batch (the backend may still loop
		// where a cache cannot take the padded layout: the mlx backend's
		// ring caches of sliding-window models). Prefill chunks and
		// verification rows (several rows a sequence) take the loop below.
		if a.rope != nil {
			q, k = b.RoPERows(q, s.offsets, a.rope), b.RoPERows(k, s.offsets, a.rope)
		}
		o := b.Reshape(b.BatchAttention(s.cs, slot, q, k, v, a.scale, a.window, a.sinks), s.dims(n, H*Dh)...)
		if gate != nil {
			o = b.Mul(o, b.Sigmoid(gate))
		}
		return s.allSum(b.Linear(o, &a.o))
	}
	outs := s.outs
	for i, c := range s.cs {
		L := s.lens[i]
		ks := b.Transpose(s.rows(k, i), perm102...) // [Hkv, L, Dh]
		if a.rope != nil {
			ks = b.RoPE(ks, s.offsets[i], a.rope)
		}
		vs := b.Transpose(s.rows(v, i), perm102...)
		kAll, vAll := c.Append(slot, ks, vs) // [Hkv, T, Dh]
		if s.tail {
			s.eval = append(s.eval, kAll, vAll)
			continue
		}
		qs := b.Transpose(s.rows(q, i), perm102...) // [H, L, Dh]
		if a.rope != nil {
			qs = b.RoPE(qs, s.offsets[i], a.rope)
		}
		var o Array // [H, L, Dh]
		if a.window == 0 && a.sinks == nil {
			o = b.Attention(qs, kAll, vAll, a.scale)
		} else {
			o = b.WindowedAttention(qs, kAll, vAll, a.scale, a.window, a.sinks)
		}
		outs[i] = b.Reshape(b.Transpose(o, perm102...), s.dims(L, H*Dh)...) // [L, H·Dh]
	}
	if s.tail {
		return nil
	}
	o := s.join(outs)
	if gate != nil {
		o = b.Mul(o, b.Sigmoid(gate))
	}
	return s.allSum(b.Linear(o, &a.o))
}

// activation is a gated MLP's activation.
type activation struct {
	// geglu: GELU (tanh approximation) of the gate (Gemma 3); otherwise
	// SiLU, clamped when limit > 0 (Backend.ClampedSwiGLU).
	geglu        bool
	alpha, limit float32
}

func (act activation) apply(b Backend, gate, up Array) Array {
	switch {
	case act.geglu:
		return b.GeGLU(gate, up)
	case act.limit > 0:
		return b.ClampedSwiGLU(gate, up, act.alpha, act.limit)
	}
	return b.SwiGLU(gate, up)
}

// mlp is a dense gated MLP: down(act(gate(h), up(h))).
type mlp struct {
	prefix         string // "model.layers.N.mlp."
	gate, up, down Linear
	act            activation
}

// mlp loads gate_proj, up_proj and down_proj under prefix.
func (l *loader) mlp(prefix string, D, F int, act activation) (*mlp, error) {
	m := &mlp{prefix: prefix, act: act}
	for _, p := range []struct {
		name    string
		out, in int
		dst     *Linear
		shard   Shard
	}{{"gate_proj", F, D, &m.gate, SplitOutput}, {"up_proj", F, D, &m.up, SplitOutput}, {"down_proj", D, F, &m.down, SplitInput}} {
		lin, err := l.shardLinear(prefix+p.name, p.out, p.in, false, p.shard)
		if err != nil {
			return nil, err
		}
		*p.dst = *lin
	}
	return m, nil
}

func (m *mlp) forward(s *step, _, h Array) (Array, error) {
	b := s.b
	return s.allSum(b.Linear(m.act.apply(b, b.Linear(h, &m.gate), b.Linear(h, &m.up)), &m.down)), nil
}

func (m *mlp) weights() []Weight {
	return []Weight{{m.prefix + "gate_proj", SplitOutput}, {m.prefix + "up_proj", SplitOutput}, {m.prefix + "down_proj", SplitInput}}
}

// layerPrefix is layer i's HF module path.
func layerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// preNormLayer loads the Llama layout of layer i: input_layernorm before
// the mixer, post_attention_layernorm before the feed-forward part, each
// loaded by mix and ff from the layer's prefix.
func (l *loader) preNormLayer(c *Config, i int, mix func(p string) (mixer, error), ff func(p string) (feedForward, error)) (Block, error) {
	p := layerPrefix(i)
	d := &decoderLayer{eps: float32(c.RMSNormEps)}
	if err := d.norms(l.norm, c.Hidden, p+"input_layernorm.weight", "", p+"post_attention_layernorm.weight", ""); err != nil {
		return nil, err
	}
	var err error
	if d.mix, err = mix(p); err != nil {
		return nil, err
	}
	if d.ff, err = ff(p); err != nil {
		return nil, err
	}
	return d, nil
}

// llamaAttention is the attention of the Llama family for a layer of kind
// k: attention_bias on q/k/v/o, the model's RoPE, the kind's window.
func llamaAttention(c *Config, k LayerKind) attentionSpec {
	return attentionSpec{H: c.Heads, Hkv: c.KVHeads, Dh: c.HeadDim, qkvBias: c.AttentionBias, oBias: c.AttentionBias, rope: &c.RoPE, window: k.Window}
}

// selfAttention returns a mixer loader for sp under the layer's self_attn.
func (l *loader) selfAttention(c *Config, sp attentionSpec) func(p string) (mixer, error) {
	return func(p string) (mixer, error) {
		return l.attention(p+"self_attn.", c.Hidden, sp, float32(c.RMSNormEps), l.norm)
	}
}

// denseMLP returns a feed-forward loader for the layer's SwiGLU mlp.
func (l *loader) denseMLP(c *Config) func(p string) (feedForward, error) {
	return func(p string) (feedForward, error) { return l.mlp(p+"mlp.", c.Hidden, c.Intermediate, activation{}) }
}

// sparseOrDense returns a feed-forward loader for layer i: the routed
// experts (and shared expert) where c makes layer i sparse, the dense
// SwiGLU mlp elsewhere.
func (l *loader) sparseOrDense(c *Config, i int) func(p string) (feedForward, error) {
	if !c.IsMoELayer(i) {
		return l.denseMLP(c)
	}
	return func(p string) (feedForward, error) { return l.moe(p+"mlp.", i, c) }
}

// checkExperts refuses num_experts on a dense architecture and its absence
// on a sparse one.
func checkExperts(c *Config, sparse bool) error {
	if sparse != (c.Experts > 0) {
		return cfgErr("num_experts", "%d experts for architecture %s", c.Experts, c.Arch)
	}
	return nil
}

// fullAttentionOnly refuses use_sliding_window for an architecture whose
// layers are all full attention.
func fullAttentionOnly(c *Config) error {
	if c.SlidingWindowUse {
		return cfgErr("use_sliding_window", "sliding-window attention is not supported for %s", c.Arch)
	}
	return nil
}
