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
// Routing is decided on the host: the router logits come back with
// Float32 (one synchronization per sparse layer and step), then each
// chosen expert runs on the rows routed to it, gathered and scattered with
// one-hot matrices through MatMul. That keeps the array API free of
// gather/scatter ops, runs only the experts some token chose, and gives
// every token the same bits whatever the chunking (each output row is one
// product per expert plus exact zeros).

// moeBlock is one sparse layer's router and experts.
type moeBlock struct {
	router  Linear // [E, D]
	experts []expert
	topK    int
	norm    bool
	limit   float32 // gpt-oss: the clamp of its SwiGLU (gptoss.go); 0: plain SwiGLU
}

type expert struct{ gate, up, down Linear }

// moe loads prefix+"gate" (the router) and the experts, either one Linear
// per expert as HF stores them (prefix+"experts.N.gate_proj", …) or
// stacked [E, out, in] as mlx-lm stores them (prefix+"switch_mlp.gate_proj").
func (l *loader) moe(prefix string, cfg *Config) (*moeBlock, error) {
	D, F, E := cfg.Hidden, cfg.MoEIntermediate, cfg.Experts
	mb := &moeBlock{experts: make([]expert, E), topK: cfg.ExpertsPerToken, norm: cfg.NormTopKProb}
	r, err := l.linear(prefix+"gate", E, D, false)
	if err != nil {
		return nil, err
	}
	mb.router = *r
	projs := []struct {
		name    string
		out, in int
		dst     func(e *expert) *Linear
	}{
		{"gate_proj", F, D, func(e *expert) *Linear { return &e.gate }},
		{"up_proj", F, D, func(e *expert) *Linear { return &e.up }},
		{"down_proj", D, F, func(e *expert) *Linear { return &e.down }},
	}
	stacked := l.has(prefix + "switch_mlp.gate_proj.weight")
	for _, p := range projs {
		if stacked {
			lins, err := l.stackedLinears(prefix+"switch_mlp."+p.name, E, p.out, p.in)
			if err != nil {
				return nil, err
			}
			for e := range mb.experts {
				*p.dst(&mb.experts[e]) = *lins[e]
			}
			continue
		}
		for e := range mb.experts {
			lin, err := l.linear(fmt.Sprintf("%sexperts.%d.%s", prefix, e, p.name), p.out, p.in, false)
			if err != nil {
				return nil, err
			}
			*p.dst(&mb.experts[e]) = *lin
		}
	}
	return mb, nil
}

// stackedLinears loads prefix.weight [E, out, in] (and, quantized,
// prefix.scales and prefix.biases) and splits it into E Linears.
func (l *loader) stackedLinears(prefix string, E, out, in int) ([]*Linear, error) {
	q := l.src.Quant(prefix)
	parts := []struct {
		suffix string
		cols   int
	}{{".weight", in}}
	if q.Bits != 0 {
		if q.GroupSize <= 0 || in%q.GroupSize != 0 || (in*q.Bits)%32 != 0 {
			return nil, fmt.Errorf("%s: %d-bit group %d does not fit %d inputs", prefix, q.Bits, q.GroupSize, in)
		}
		parts = []struct {
			suffix string
			cols   int
		}{{".weight", in * q.Bits / 32}, {".scales", in / q.GroupSize}, {".biases", in / q.GroupSize}}
		if q.Mode == "mxfp4" {
			parts = parts[:2] // no biases
		}
	}
	lins := make([]*Linear, E)
	for e := range lins {
		lins[e] = &Linear{Bits: q.Bits, GroupSize: q.GroupSize, Mode: q.Mode}
	}
	for _, part := range parts {
		t, err := l.src.Tensor(prefix + part.suffix)
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", prefix, part.suffix, err)
		}
		if want := []int{E, out, part.cols}; !slices.Equal(t.Shape, want) {
			return nil, fmt.Errorf("%s%s: shape %v, want %v", prefix, part.suffix, t.Shape, want)
		}
		per := len(t.Data) / E
		for e, lin := range lins {
			a := l.b.FromBytes(t.Data[e*per:(e+1)*per], []int{out, part.cols}, t.DType)
			l.b.Keep(a)
			l.kept = append(l.kept, a)
			switch part.suffix {
			case ".weight":
				lin.W = a
			case ".scales":
				lin.Scales = a
			case ".biases":
				lin.Biases = a
			}
		}
		l.done += int64(len(t.Data))
		if l.progress != nil {
			l.progress(min(l.done, l.total-1), l.total)
		}
	}
	return lins, nil
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

// moeForward returns the sparse block's output for h [L, D] (x, the
// residual stream, is kept alive across the routing read-back).
func (m *Model) moeForward(mb *moeBlock, x, h Array) (Array, error) {
	b := m.b
	E := len(mb.experts)
	logits := b.Linear(h, &mb.router) // [L, E]
	// The read-back below is the step's only mid-graph synchronization:
	// Eval releases the layer's spent temporaries first (x and h survive).
	if err := b.Eval(logits, x, h); err != nil {
		return nil, err
	}
	lv, err := b.Float32(logits)
	if err != nil {
		return nil, err
	}
	shape := h.Shape()
	L := shape[0]
	dt := h.DType()
	experts, weights := route(lv, L, E, mb.topK, mb.norm)
	rows := make([][]int, E)     // tokens routed to each expert
	rowW := make([][]float64, E) // and their weights
	for t := range L {
		for j, e := range experts[t] {
			rows[e] = append(rows[e], t)
			rowW[e] = append(rowW[e], weights[t][j])
		}
	}
	var out Array
	for e, toks := range rows {
		if len(toks) == 0 {
			continue
		}
		n := len(toks)
		xe := h
		if L > 1 {
			sel := make([]float32, n*L) // [n, L] one-hot: gathers the rows
			for i, t := range toks {
				sel[i*L+t] = 1
			}
			xe = b.MatMul(b.AsType(b.FromFloat32(sel, n, L), dt), h)
		}
		ex := &mb.experts[e]
		ye := b.Linear(mb.act(b, b.Linear(xe, &ex.gate), b.Linear(xe, &ex.up)), &ex.down) // [n, D]
		scatter := make([]float32, L*n)                                                   // [L, n]: weights back to the rows
		for i, t := range toks {
			scatter[t*n+i] = float32(rowW[e][i])
		}
		c := b.MatMul(b.AsType(b.FromFloat32(scatter, L, n), dt), ye)
		if out == nil {
			out = c
		} else {
			out = b.Add(out, c)
		}
	}
	return out, nil
}
