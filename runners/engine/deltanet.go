package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// Gated DeltaNet layers (Qwen3-Next), as mlx-lm's Qwen3NextGatedDeltaNet
// computes them: one projection gives q, k, v and the output gate z
// grouped per key head, another the write strength b and decay input a;
// q, k, v go through a depthwise causal convolution over the last K
// positions (its state: the previous K−1 rows of conv input) and SiLU; q
// and k are RMS-normalized (q scaled by 1/Dk, k by 1/√Dk: mlx-lm's
// normalize_qk); the gated delta rule (Backend.DeltaGates, GatedDelta)
// updates each value head's state [Dv, Dk] token by token; the output is
// RMSNorm(y)·SiLU(z), projected back to the model width.

// deltaBlock is one Gated DeltaNet layer's weights. Qwen3-Next projects
// q, k, v, z in one matrix grouped per key head (qkvz) and b, a in another
// (ba); Qwen3.5 has four plain projections (split: qkv, z, b, a).
type deltaBlock struct {
	prefix        string // "model.layers.N.linear_attn."
	Hk, Hv        int    // key and value heads
	Dk, Dv, K     int    // key and value head dims, conv kernel
	eps           float32
	qkvz, ba, out Linear  // [2·Kd + 2·Vd, D], [2·Hv, D], [D, Vd]
	split         bool    // Qwen3.5's projections below instead of qkvz and ba
	qkv, z, b, a  Linear  // [2·Kd + Vd, D], [Vd, D], [Hv, D], [Hv, D]
	taps          []Array // K conv taps, each [C]: tap j weighs input row t+j for output t
	aLog, dtBias  Array   // [Hv]
	norm          Array   // [Dv]: the gated RMSNorm's weight
	qScale        Array   // [Dk] of 1/Dk: normalize_qk's scale of q as an RMSNorm weight
	kScale        Array   // [Dk] of 1/√Dk
}

// deltaState is one Gated DeltaNet layer's cache state for one sequence.
type deltaState struct {
	conv Array // [K−1, C]: the last K−1 rows of conv input
	rec  Array // [Hv, Dv, Dk] float32
}

// delta loads prefix ("model.layers.N.linear_attn.").
func (l *loader) delta(prefix string, cfg *Config) (*deltaBlock, error) {
	D := cfg.Hidden
	Hk, Hv, Dk, Dv, K := cfg.LinearKeyHeads, cfg.LinearValueHeads, cfg.LinearKeyDim, cfg.LinearValueDim, cfg.LinearConvKernel
	Kd, Vd := Hk*Dk, Hv*Dv
	C := 2*Kd + Vd
	d := &deltaBlock{prefix: prefix, Hk: Hk, Hv: Hv, Dk: Dk, Dv: Dv, K: K, eps: float32(cfg.RMSNormEps), split: l.has(prefix + "in_proj_qkv.weight")}
	// A tensor-parallel rank holds its key heads (Hk, Hv here are its
	// counts) and their value heads: qkvz and ba are grouped per key head
	// (one contiguous share each), Qwen3.5's qkv and the conv's channels
	// are q, k, v one after the other (a share of each part).
	n := l.ranks()
	qkvParts := []int{n * Kd, n * Kd, n * Vd}
	type proj struct {
		name    string
		out, in int
		dst     *Linear
		shard   Shard
		parts   []int
	}
	projs := []proj{{"in_proj_qkvz", 2*Kd + 2*Vd, D, &d.qkvz, SplitOutput, nil}, {"in_proj_ba", 2 * Hv, D, &d.ba, SplitOutput, nil}}
	if d.split {
		projs = []proj{{"in_proj_qkv", 2*Kd + Vd, D, &d.qkv, SplitOutput, qkvParts}, {"in_proj_z", Vd, D, &d.z, SplitOutput, nil},
			{"in_proj_b", Hv, D, &d.b, SplitOutput, nil}, {"in_proj_a", Hv, D, &d.a, SplitOutput, nil}}
	}
	for _, p := range append(projs, proj{"out_proj", D, Vd, &d.out, SplitInput, nil}) {
		lin, err := l.shardLinear(prefix+p.name, p.out, p.in, false, p.shard, p.parts...)
		if err != nil {
			return nil, err
		}
		*p.dst = *lin
	}
	var err error
	if d.aLog, err = l.shardTensor(prefix+"A_log", []int{Hv}, share{axis: 0}); err != nil {
		return nil, err
	}
	if d.dtBias, err = l.shardTensor(prefix+"dt_bias", []int{Hv}, share{axis: 0}); err != nil {
		return nil, err
	}
	if d.norm, err = l.vector(prefix+"norm.weight", Dv); err != nil {
		return nil, err
	}
	// conv1d.weight is [C, K, 1] (MLX) or [C, 1, K] (HF/PyTorch): the
	// same row-major order, weight (c, j) at c·K + j.
	name := prefix + "conv1d.weight"
	t, err := l.src.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	Cw := n * C // the whole model's channels
	if !slices.Equal(t.Shape, []int{Cw, K, 1}) && !slices.Equal(t.Shape, []int{Cw, 1, K}) {
		return nil, fmt.Errorf("%s: shape %v, want [%d, %d, 1] or [%d, 1, %d]", name, t.Shape, Cw, K, Cw, K)
	}
	if n > 1 {
		ranges, err := l.cut(Cw, qkvParts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		data, shape := take(t.Data, []int{Cw, K}, t.DType.Size(), 0, ranges)
		t = Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: data}
	}
	w, err := floats32(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	tap := make([]float32, C)
	for j := range K {
		for c := range C {
			tap[c] = w[c*K+j]
		}
		d.taps = append(d.taps, l.keep(l.b.AsType(l.b.FromFloat32(tap, C), cfg.DType)))
	}
	l.done += int64(len(t.Data) * n)
	scale := func(v float64) Array {
		s := make([]float32, Dk)
		for i := range s {
			s[i] = float32(v)
		}
		return l.keep(l.b.FromFloat32(s, Dk))
	}
	d.qScale, d.kScale = scale(1/float64(Dk)), scale(1/math.Sqrt(float64(Dk)))
	return d, nil
}

// keep pins a (made at load) with the weights.
func (l *loader) keep(a Array) Array {
	l.b.Keep(a)
	l.kept = append(l.kept, a)
	return a
}

// floats32 decodes a float tensor's data.
func floats32(t Tensor) ([]float32, error) {
	n := len(t.Data) / t.DType.Size()
	out := make([]float32, n)
	switch t.DType {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = half.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = half.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("dtype %v, want a float", t.DType)
	}
	return out, nil
}

// newDeltaState is the empty state of one layer: zeros.
func (m *Model) newDeltaState() deltaState {
	c := &m.rc // this rank's heads
	K, C := c.LinearConvKernel, 2*c.LinearKeyHeads*c.LinearKeyDim+c.LinearValueHeads*c.LinearValueDim
	return deltaState{
		conv: m.b.AsType(m.b.FromFloat32(make([]float32, (K-1)*C), K-1, C), m.actDType()),
		rec:  m.b.FromFloat32(make([]float32, c.LinearValueHeads*c.LinearValueDim*c.LinearKeyDim), c.LinearValueHeads, c.LinearValueDim, c.LinearKeyDim),
	}
}

// actDType is the dtype of the activations on this backend: the cpu
// backend computes in float32, MLX in the weights' dtype.
func (m *Model) actDType() DType {
	if m.b.Name() == "cpu" {
		return F32
	}
	return m.cacheDT
}

func (d *deltaBlock) kind() LayerKind { return LayerKind{Recurrent: true} }

func (d *deltaBlock) weights() []Weight {
	p := d.prefix
	// The projections are grouped per key head: they split by heads
	// (SplitOutput on head boundaries), out_proj by its input.
	w := []Weight{{p + "in_proj_qkvz", SplitOutput}, {p + "in_proj_ba", SplitOutput}}
	if d.split {
		w = []Weight{{p + "in_proj_qkv", SplitOutput}, {p + "in_proj_z", SplitOutput}, {p + "in_proj_b", SplitOutput}, {p + "in_proj_a", SplitOutput}}
	}
	return append(w, Weight{p + "conv1d.weight", SplitOutput}, Weight{p + "A_log", SplitHeads}, Weight{p + "dt_bias", SplitHeads},
		Weight{p + "norm.weight", Replicated}, Weight{p + "out_proj", SplitInput})
}

// forward runs every sequence's rows through the layer from the state in
// its cache (a hybridCache) and replaces the state.
func (d *deltaBlock) forward(s *step, slot int, h Array) Array {
	for i, c := range s.cs {
		hc := c.(*hybridCache)
		var st deltaState
		s.outs[i], st = d.run(s.m, s.rows(h, i), s.lens[i], hc.states[slot])
		hc.set(slot, st)
		s.eval = append(s.eval, st.conv, st.rec)
	}
	if s.tail {
		return nil
	}
	return s.allSum(s.join(s.outs))
}

// run runs one sequence's L rows h [L, D] through the layer from state st
// and returns the output [L, D] and the new state.
func (d *deltaBlock) run(m *Model, h Array, L int, st deltaState) (Array, deltaState) {
	b := m.b
	Hk, Hv, Dk, Dv, K := d.Hk, d.Hv, d.Dk, d.Dv, d.K
	r, Kd, Vd := Hv/Hk, Hk*Dk, Hv*Dv
	C := 2*Kd + Vd
	var mixed, z, beta, a Array // [L, C], [L, Hv, Dv], [L, Hv], [L, Hv]
	if d.split {
		mixed = b.Linear(h, &d.qkv)
		z = b.Reshape(b.Linear(h, &d.z), m.scr.dims(L, Hv, Dv)...)
		beta, a = b.Linear(h, &d.b), b.Linear(h, &d.a)
	} else {
		qkvz := b.Reshape(b.Linear(h, &d.qkvz), m.scr.dims(L, Hk, 2*Dk+2*r*Dv)...) // per key head: q, k, r·v, r·z
		q := b.Reshape(b.Slice(qkvz, 2, 0, Dk), m.scr.dims(L, Kd)...)
		k := b.Reshape(b.Slice(qkvz, 2, Dk, 2*Dk), m.scr.dims(L, Kd)...)
		v := b.Reshape(b.Slice(qkvz, 2, 2*Dk, 2*Dk+r*Dv), m.scr.dims(L, Vd)...)
		z = b.Reshape(b.Slice(qkvz, 2, 2*Dk+r*Dv, 2*Dk+2*r*Dv), m.scr.dims(L, Hv, Dv)...)
		ba := b.Reshape(b.Linear(h, &d.ba), m.scr.dims(L, Hk, 2*r)...) // per key head: r·b, r·a
		beta = b.Reshape(b.Slice(ba, 2, 0, r), m.scr.dims(L, Hv)...)
		a = b.Reshape(b.Slice(ba, 2, r, 2*r), m.scr.dims(L, Hv)...)
		mixed = b.Concat(1, m.scr.arrays(q, k, v)...)
	}

	in := b.Concat(0, m.scr.arrays(st.conv, mixed)...) // [K−1+L, C]
	next := deltaState{conv: b.Slice(in, 0, L, L+K-1)}
	var conv Array
	for j, tap := range d.taps {
		t := b.Mul(b.Slice(in, 0, j, j+L), tap)
		if conv == nil {
			conv = t
		} else {
			conv = b.Add(conv, t)
		}
	}
	conv = b.Mul(conv, b.Sigmoid(conv)) // SiLU
	eps := float32(1e-6 / float64(Dk))  // normalize_qk's eps, as mx.fast.rms_norm sees it
	qn := b.RMSNorm(b.Reshape(b.Slice(conv, 1, 0, Kd), m.scr.dims(L, Hk, Dk)...), d.qScale, eps)
	kn := b.RMSNorm(b.Reshape(b.Slice(conv, 1, Kd, 2*Kd), m.scr.dims(L, Hk, Dk)...), d.kScale, eps)
	vn := b.Reshape(b.Slice(conv, 1, 2*Kd, C), m.scr.dims(L, Hv, Dv)...)
	g, bt := b.DeltaGates(a, beta, d.aLog, d.dtBias)
	var y Array
	y, next.rec = b.GatedDelta(qn, kn, vn, g, bt, st.rec) // [L, Hv, Dv]
	o := b.Mul(b.RMSNorm(y, d.norm, d.eps), b.Mul(z, b.Sigmoid(z)))
	return b.Linear(b.Reshape(o, m.scr.dims(L, Vd)...), &d.out), next
}
