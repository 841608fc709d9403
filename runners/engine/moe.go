package engine

import (
	"fmt"
	"math"
	"slices"
)

// Mixture of experts (Qwen3-MoE): a router Linear [E, D] scores the experts
// for each token; softmax over all E, the top k experts run their SwiGLU
// MLP on the token, and their outputs are summed weighted by the softmax
// probabilities (renormalized over the k when norm_topk_prob is set), as
// mlx-lm's Qwen3MoeSparseMoeBlock does.
//
// Routing runs inside the graph, as mlx-lm's SwitchGLU does: TopK picks
// each token's experts, TakeAlongAxis their scores, and GatherLinear runs
// each (token, expert) row through that expert's slice of the stacked
// weights [E, out, in]. Nothing is read back, so a decode step is one Eval
// however many sparse layers the model has. When a step routes at least
// moeSortMin (token, expert) pairs (a prefill chunk, mlx-lm's threshold),
// the pairs are first sorted by expert so that each expert's weights are
// read once per chunk, and put back in token order afterwards. Each row's
// result is computed the same way whichever path it takes, so (on the cpu
// backend) a token's output does not depend on the chunking, bit for bit.
//
// Renormalized scores are the softmax of the k chosen logits, which equals
// the k probabilities divided by their sum (one op fewer; equal up to
// rounding).

// moeSortMin is the number of routed (token, expert) pairs from which a
// step sorts them by expert (mlx-lm's SwitchGLU uses 64).
const moeSortMin = 64

// moeBlock is one sparse layer's router and stacked experts, and its
// shared expert when the model has one (Qwen2-MoE: every token also runs
// a dense SwiGLU MLP whose output is scaled by sigmoid(sharedGate · x)).
// Experts may also carry biases [E, out], be MXFP4 and use a clamped
// SwiGLU (act), as an architecture's loader sets them.
type moeBlock struct {
	prefix         string // "model.layers.N.mlp."
	layer          int    // the model's layer index (RouteObserver)
	router         Linear // [E, D]
	gate, up, down Linear // stacked: [E, F, D], [E, F, D], [E, D, F]
	numExperts     int
	topK           int
	norm           bool
	D              int
	shared         *sharedExpert
	act            activation // the experts' (SwiGLU, or clamped)
	// names of the router and the experts' tensors (Weights)
	routerName, gateName, upName, downName string
}

func (mb *moeBlock) weights() []Weight {
	w := []Weight{{mb.routerName, Replicated}, {mb.gateName, SplitOutput}, {mb.upName, SplitOutput}, {mb.downName, SplitInput}}
	if mb.shared != nil {
		p := mb.prefix
		w = append(w, Weight{p + "shared_expert.gate_proj", SplitOutput}, Weight{p + "shared_expert.up_proj", SplitOutput},
			Weight{p + "shared_expert.down_proj", SplitInput}, Weight{p + "shared_expert_gate", Replicated})
	}
	return w
}

func (mb *moeBlock) forward(s *step, x, h Array) (Array, error) {
	y, err := s.m.moeForward(mb, x, h, s.n, s.m.hostRouting)
	if err != nil {
		return nil, err
	}
	return s.allSum(y), nil // the routed and shared experts' partial sums at once
}

type sharedExpert struct {
	gate, up, down Linear // [Fs, D], [Fs, D], [D, Fs]
	scale          Linear // [1, D]: the sigmoid gate
}

// moe loads prefix+"gate" (the router) and the experts, either stacked
// [E, out, in] as mlx-lm (and our GGUF reader) store them
// (prefix+"switch_mlp.gate_proj") or one Linear per expert as HF stores
// them (prefix+"experts.N.gate_proj"), which are stacked here.
func (l *loader) moe(prefix string, layer int, cfg *Config) (*moeBlock, error) {
	D, F, E := cfg.Hidden, cfg.MoEIntermediate, cfg.Experts
	if cfg.ExpertsPerToken < 1 || cfg.ExpertsPerToken > E {
		return nil, cfgErr("num_experts_per_tok", "%d of %d experts", cfg.ExpertsPerToken, E)
	}
	mb := &moeBlock{prefix: prefix, layer: layer, numExperts: E, topK: cfg.ExpertsPerToken, norm: cfg.NormTopKProb, D: D,
		routerName: prefix + "gate", gateName: prefix + "switch_mlp.gate_proj", upName: prefix + "switch_mlp.up_proj", downName: prefix + "switch_mlp.down_proj"}
	r, err := l.linear(prefix+"gate", E, D, false)
	if err != nil {
		return nil, err
	}
	mb.router = *r
	projs := []struct {
		name    string
		out, in int
		dst     *Linear
		shard   Shard
	}{
		{"gate_proj", F, D, &mb.gate, SplitOutput},
		{"up_proj", F, D, &mb.up, SplitOutput},
		{"down_proj", D, F, &mb.down, SplitInput},
	}
	if l.has(prefix + "experts.gate_up_proj") {
		// Hugging Face's fused experts (Qwen3.5-MoE): gate_up_proj
		// [E, 2F, D] (gate rows, then up rows) and down_proj [E, D, F].
		if err := l.fusedExperts(prefix+"experts.", mb, E, F, D); err != nil {
			return nil, err
		}
		projs = nil
	}
	stacked := l.has(prefix + "switch_mlp.gate_proj.weight")
	for _, p := range projs {
		name := func(int) string { return prefix + "switch_mlp." + p.name }
		if !stacked {
			name = func(e int) string { return fmt.Sprintf("%sexperts.%d.%s", prefix, e, p.name) }
		}
		lin, err := l.stackedLinear(name, stacked, E, p.out, p.in, p.shard)
		if err != nil {
			return nil, err
		}
		*p.dst = *lin
	}
	if Fs := cfg.SharedExpertIntermediate; Fs > 0 {
		se := &sharedExpert{}
		for _, p := range []struct {
			name    string
			out, in int
			dst     *Linear
			shard   Shard
		}{
			{"shared_expert.gate_proj", Fs, D, &se.gate, SplitOutput},
			{"shared_expert.up_proj", Fs, D, &se.up, SplitOutput},
			{"shared_expert.down_proj", D, Fs, &se.down, SplitInput},
			{"shared_expert_gate", 1, D, &se.scale, Replicated},
		} {
			lin, err := l.shardLinear(prefix+p.name, p.out, p.in, false, p.shard)
			if err != nil {
				return nil, err
			}
			*p.dst = *lin
		}
		mb.shared = se
	}
	return mb, nil
}

// fusedExperts loads Hugging Face's fused expert tensors (dense only).
func (l *loader) fusedExperts(prefix string, mb *moeBlock, E, F, D int) error {
	F *= l.ranks() // the whole model's width; each rank keeps its share below
	gu, err := l.rawTensor(prefix+"gate_up_proj", E, 2*F, D)
	if err != nil {
		return err
	}
	dn, err := l.rawTensor(prefix+"down_proj", E, D, F)
	if err != nil {
		return err
	}
	half := F * D * gu.DType.Size() // one expert's gate (or up) rows
	gate, up := make([]byte, 0, E*half), make([]byte, 0, E*half)
	for e := range E {
		slab := gu.Data[e*2*half : (e+1)*2*half]
		gate, up = append(gate, slab[:half]...), append(up, slab[half:]...)
	}
	for _, p := range []struct {
		data  []byte
		shape []int
		dt    DType
		shard Shard
		dst   *Array
	}{{gate, []int{E, F, D}, gu.DType, SplitOutput, &mb.gate.W}, {up, []int{E, F, D}, gu.DType, SplitOutput, &mb.up.W},
		{dn.Data, []int{E, D, F}, dn.DType, SplitInput, &mb.down.W}} {
		data, shape, err := l.shardStacked(p.data, p.shape, p.dt.Size(), p.shard)
		if err != nil {
			return fmt.Errorf("%s: %w", prefix, err)
		}
		*p.dst = l.keep(l.b.FromBytes(data, shape, p.dt))
	}
	return nil
}

// stackedLinear loads E matrices [out, in] (dense or MLX-quantized) as one
// stacked Linear [E, out, in]: from one tensor per part (name(0).weight,
// and .scales/.biases when quantized) when stacked, else from one tensor
// per expert (name(e).weight, …), concatenated on the host.
//
// out and in are a tensor-parallel rank's sizes: sh says which of them
// its share cuts (the experts' rows for SplitOutput, their input columns
// on whole quantization groups for SplitInput) of the whole tensors.
func (l *loader) stackedLinear(name func(e int) string, stacked bool, E, out, in int, sh Shard) (*Linear, error) {
	q := l.src.Quant(name(0))
	if q.Bits != 0 && (q.GroupSize <= 0 || in%q.GroupSize != 0 || (in*q.Bits)%32 != 0) {
		if sh == SplitInput && l.ranks() > 1 {
			return nil, fmt.Errorf("%s: %w: %d ranks leave %d inputs each, not whole %d-bit groups of %d", name(0), ErrTensorSplit, l.ranks(), in, q.Bits, q.GroupSize)
		}
		return nil, fmt.Errorf("%s: %d-bit group %d does not fit %d inputs", name(0), q.Bits, q.GroupSize, in)
	}
	switch {
	case l.ranks() == 1:
	case sh == SplitOutput:
		out *= l.ranks()
	case sh == SplitInput:
		in *= l.ranks()
	}
	type part struct {
		suffix string
		cols   int
		dst    *Array
	}
	lin := &Linear{Bits: q.Bits, GroupSize: q.GroupSize, Mode: q.Mode}
	parts := []part{{".weight", in, &lin.W}}
	if q.Bits != 0 {
		parts = []part{{".weight", in * q.Bits / 32, &lin.W}, {".scales", in / q.GroupSize, &lin.Scales}, {".biases", in / q.GroupSize, &lin.Biases}}
		if q.Mode == "mxfp4" {
			parts = parts[:2] // E8M0 scales, no biases
		}
	}
	for _, p := range parts {
		var data []byte
		var dt DType
		if stacked {
			t, err := l.src.Tensor(name(0) + p.suffix)
			if err != nil {
				return nil, fmt.Errorf("%s%s: %w", name(0), p.suffix, err)
			}
			if want := []int{E, out, p.cols}; !slices.Equal(t.Shape, want) {
				return nil, fmt.Errorf("%s%s: shape %v, want %v", name(0), p.suffix, t.Shape, want)
			}
			data, dt = t.Data, t.DType
		} else {
			for e := range E {
				if eq := l.src.Quant(name(e)); eq != q {
					return nil, fmt.Errorf("%s: quantized %+v, expert 0 %+v (experts must share one format)", name(e), eq, q)
				}
				t, err := l.src.Tensor(name(e) + p.suffix)
				if err != nil {
					return nil, fmt.Errorf("%s%s: %w", name(e), p.suffix, err)
				}
				if want := []int{out, p.cols}; !slices.Equal(t.Shape, want) {
					return nil, fmt.Errorf("%s%s: shape %v, want %v", name(e), p.suffix, t.Shape, want)
				}
				if e == 0 {
					dt = t.DType
					data = make([]byte, 0, E*len(t.Data))
				} else if t.DType != dt {
					return nil, fmt.Errorf("%s%s: dtype %v, expert 0 %v", name(e), p.suffix, t.DType, dt)
				}
				data = append(data, t.Data...)
			}
		}
		l.done += int64(len(data))
		shape := []int{E, out, p.cols}
		data, shape, err := l.shardStacked(data, shape, dt.Size(), sh)
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", name(0), p.suffix, err)
		}
		a := l.b.FromBytes(data, shape, dt)
		l.b.Keep(a)
		l.kept = append(l.kept, a)
		*p.dst = a
		if l.progress != nil {
			l.progress(min(l.done, l.total-1), l.total)
		}
	}
	return lin, nil
}

// route returns, for each of the L rows of router logits, the chosen
// experts (highest probability first, ties to the lower index) and their
// weights.
func route(logits []float32, L, E, k int, norm bool) (experts [][]int, weights [][]float64) {
	experts, weights = make([][]int, L), make([][]float64, L)
	idx := make([]int, E)
	for t := range L {
		row := logits[t*E : (t+1)*E]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = max(mx, float64(v))
		}
		p := make([]float64, E)
		sum := 0.0
		for i, v := range row {
			p[i] = math.Exp(float64(v) - mx)
			sum += p[i]
		}
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case p[a] > p[b]:
				return -1
			case p[a] < p[b]:
				return 1
			}
			return 0
		})
		experts[t] = slices.Clone(idx[:k])
		w := make([]float64, k)
		tot := 0.0
		for j, e := range experts[t] {
			w[j] = p[e] / sum
			tot += w[j]
		}
		if norm {
			for j := range w {
				w[j] /= tot
			}
		}
		weights[t] = w
	}
	return experts, weights
}

// moeForward returns the sparse block's output for h [n, D], routing
// inside the graph. With host set it instead reads the router logits back
// and routes on the host (one synchronization per sparse layer and step):
// the path in-graph routing replaced, kept as the benchmarks' baseline. x
// (the residual stream) must survive that read-back.
func (m *Model) moeForward(mb *moeBlock, x, h Array, n int, host bool) (Array, error) {
	b := m.b
	k := mb.topK
	logits := b.Linear(h, &mb.router) // [n, E]
	var inds, scores Array            // [n, k]
	if host {
		if err := b.Eval(logits, x, h); err != nil {
			return nil, err
		}
		lv, err := b.Float32(logits)
		if err != nil {
			return nil, err
		}
		experts, weights := route(lv, n, mb.numExperts, k, mb.norm)
		ei, wf := make([]int32, 0, n*k), make([]float32, 0, n*k)
		for t := range n {
			for j, e := range experts[t] {
				ei = append(ei, int32(e))
				wf = append(wf, float32(weights[t][j]))
			}
		}
		inds, scores = b.FromInt32(ei, n, k), b.FromFloat32(wf, n, k)
	} else {
		inds = b.TopK(logits, k)
		if m.routeObs != nil {
			if err := m.observeRoute(mb, inds, n, k); err != nil {
				return nil, err
			}
		}
		if mb.norm {
			scores = b.Softmax(b.TakeAlongAxis(logits, inds))
		} else {
			scores = b.TakeAlongAxis(b.Softmax(logits), inds)
		}
	}
	y := m.switchGLU(mb, h, n, inds, scores)
	if se := mb.shared; se != nil {
		s := b.Linear(b.SwiGLU(b.Linear(h, &se.gate), b.Linear(h, &se.up)), &se.down) // [n, D]
		g := b.Sigmoid(b.Linear(h, &se.scale))                                        // [n, 1]
		// g·s row by row as a batched matmul [n, 1, 1] @ [n, 1, D] (the
		// elementwise ops broadcast only over leading axes).
		gs := b.MatMul(b.Reshape(g, m.scr.dims(n, 1, 1)...), b.Reshape(s, m.scr.dims(n, 1, mb.D)...))
		y = b.Add(y, b.Reshape(gs, m.scr.dims(n, mb.D)...))
	}
	return y, nil
}

// switchGLU runs each token of h [n, D] through its k experts inds [n, k]
// and sums their outputs weighted by scores [n, k] → [n, D].
func (m *Model) switchGLU(mb *moeBlock, h Array, n int, inds, scores Array) Array {
	b, scr := m.b, &m.scr
	k, D := mb.topK, mb.D
	N := n * k
	flat := b.Reshape(inds, scr.dims(N)...) // pair i is (token i/k, slot i%k)
	mlp := func(xs, experts Array, sorted bool) Array {
		g := mb.act.apply(b, b.GatherLinear(xs, &mb.gate, experts, sorted), b.GatherLinear(xs, &mb.up, experts, sorted))
		return b.GatherLinear(g, &mb.down, experts, sorted) // [N, D]
	}
	var y Array
	switch {
	case N >= moeSortMin:
		order := b.Argsort(flat)                           // pairs in expert order
		xs := b.Take(h, b.Take(m.pairTokens(n, k), order)) // [N, D]
		ys := mlp(xs, b.Take(flat, order), true)
		y = b.Take(ys, b.Argsort(order)) // back to pair order
	case n == 1:
		y = mlp(h, flat, false) // the one row is shared by its k pairs
	default:
		y = mlp(b.Take(h, m.pairTokens(n, k)), flat, false)
	}
	w := b.Reshape(b.AsType(scores, h.DType()), scr.dims(n, 1, k)...)
	return b.Reshape(b.MatMul(w, b.Reshape(y, scr.dims(n, k, D)...)), scr.dims(n, D)...) // Σ_j w_j · y_j
}

// pairTokens is [n·k] I32 with entry i = i/k: the token of each pair.
func (m *Model) pairTokens(n, k int) Array {
	t := grow(&m.scr.pairs, n*k)
	for i := range t {
		t[i] = int32(i / k)
	}
	return m.b.FromInt32(t, m.scr.dims(n*k)...)
}

// observeRoute reads the chosen experts inds [n, k] back and hands them to
// the RouteObserver with the layer's index (a diagnostic: one
// synchronization, nothing computed differently).
func (m *Model) observeRoute(mb *moeBlock, inds Array, n, k int) error {
	if err := m.b.Eval(inds); err != nil {
		return err
	}
	v, err := m.b.Float32(inds)
	if err != nil {
		return fmt.Errorf("route observer: %w", err)
	}
	experts := make([][]int32, n)
	for t := range experts {
		experts[t] = make([]int32, k)
		for j := range k {
			experts[t][j] = int32(v[t*k+j])
		}
	}
	m.routeObs(mb.layer, experts)
	return nil
}
