package weights

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
	"strconv"
	"strings"
)

// Qwen3-Next as llama.cpp's converter writes it (general.architecture
// qwen3next), read as the engine's Qwen3NextForCausalLM in mlx-lm's layout:
//
//	blk.N.attn_qkv        linear_attn.in_proj_qkv  (q of every key head, then k, then v)
//	blk.N.attn_gate       linear_attn.in_proj_z
//	blk.N.ssm_ba          linear_attn.in_proj_b and in_proj_a (rows picked
//	                      out of the per-key-head groups [b…, a…])
//	blk.N.ssm_in          linear_attn.in_proj_qkvz (older files; ssm_ba
//	                      then stays in_proj_ba)
//	blk.N.ssm_conv1d      linear_attn.conv1d [C, K] → [C, K, 1]
//	blk.N.ssm_a           linear_attn.A_log = log(-ssm_a) (the file holds -exp(A_log))
//	blk.N.ssm_dt.bias     linear_attn.dt_bias
//	blk.N.ssm_norm        linear_attn.norm
//	blk.N.ssm_out         linear_attn.out_proj
//	blk.N.ffn_gate_inp_shexp  mlp.shared_expert_gate [D] → [1, D]
//
// The other norms are stored as the multipliers (the converter adds 1 to
// HF's zero-centred weights), which is what the engine reads from mlx-lm's
// layout. The attention layers' q_proj holds queries and gates per head as
// in HF.

//
// Qwen3.5 (qwen35, qwen35moe) is laid out the same way with Qwen3.5's
// separate projections (ssm_beta → in_proj_b, ssm_alpha → in_proj_a), and
// its value heads reordered by the converter from grouped by key head (HF:
// head g·r + j, r value heads per key head) to tiled (j·Hk + g) in every
// tensor that has them: the v rows of attn_qkv and of the conv kernel,
// attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, and the columns of
// ssm_out. They are put back by row and column-block selection.
// rope.dimension_sections (Qwen3.5's interleaved MRoPE) needs nothing: on
// text all three position components are the token's position, which is
// plain RoPE over rope.dimension_count dims.

// qwen3nextLayout is what the tensor mapping needs from the metadata.
type qwen3nextLayout struct {
	arch       string // qwen3next, qwen35 or qwen35moe
	lay        *engine.GGUFLayout
	tiled      bool   // value heads in tiled order (Qwen3.5)
	recurrent  []bool // per layer: Gated DeltaNet (true) or attention
	keyHeads   int    // ssm.group_count
	valueHeads int    // ssm.time_step_rank
	keyDim     int    // ssm.state_size
	valueDim   int    // ssm.inner_size / valueHeads
	legacy     map[string]bool
}

func newQwen3nextLayout(g *GGUF, lay *engine.GGUFLayout) (*qwen3nextLayout, error) {
	arch, tiled := lay.Name, lay.TiledValueHeads
	layers, ok := g.Uint(arch + ".block_count")
	if !ok || layers == 0 || layers > 1<<16 {
		return nil, fmt.Errorf("metadata %s.block_count missing or out of range", arch)
	}
	l := &qwen3nextLayout{arch: arch, lay: lay, tiled: tiled, legacy: map[string]bool{}}
	var inner int
	for _, k := range []struct {
		key string
		dst *int
	}{{"ssm.group_count", &l.keyHeads}, {"ssm.time_step_rank", &l.valueHeads}, {"ssm.state_size", &l.keyDim},
		{"ssm.inner_size", &inner}} {
		v, ok := g.Uint(arch + "." + k.key)
		if !ok || v == 0 || v > 1<<20 {
			return nil, fmt.Errorf("metadata %s.%s missing or out of range", arch, k.key)
		}
		*k.dst = int(v)
	}
	if inner%l.valueHeads != 0 {
		return nil, fmt.Errorf("metadata %s.ssm.inner_size %d is not a multiple of ssm.time_step_rank %d", arch, inner, l.valueHeads)
	}
	l.valueDim = inner / l.valueHeads
	if l.valueHeads%l.keyHeads != 0 {
		return nil, fmt.Errorf("metadata %s.ssm.time_step_rank %d is not a multiple of ssm.group_count %d", arch, l.valueHeads, l.keyHeads)
	}
	rk := arch + ".attention.recurrent_layers"
	if raw, ok := g.Meta(rk); ok {
		flags, ok := raw.([]bool)
		if !ok || len(flags) < int(layers) {
			return nil, fmt.Errorf("metadata %s: want a bool per layer (%d layers)", rk, layers)
		}
		l.recurrent = flags[:layers]
	} else {
		n := uint64(4)
		if v, ok := g.Uint(arch + ".full_attention_interval"); ok {
			n = v
		}
		if n == 0 {
			return nil, fmt.Errorf("metadata %s.full_attention_interval is 0", arch)
		}
		l.recurrent = make([]bool, layers)
		for i := range l.recurrent {
			l.recurrent[i] = uint64(i+1)%n != 0
		}
	}
	for _, t := range g.tensors {
		if num, ok := strings.CutSuffix(strings.TrimPrefix(t.Name, "blk."), ".ssm_in.weight"); ok && strings.HasPrefix(t.Name, "blk.") && !l.tiled {
			l.legacy[num] = true
		}
	}
	return l, nil
}

// targets maps one GGUF tensor to its HF-named tensors.
func (l *qwen3nextLayout) targets(t TensorInfo) ([]ggufTarget, error) {
	e := ggufEntry{src: t.Name}
	rest, ok := strings.CutPrefix(t.Name, "blk.")
	if !ok {
		return []ggufTarget{{hfNameArch(l.lay, t.Name), e}}, nil
	}
	num, stem, _ := strings.Cut(rest, ".")
	i, err := strconv.Atoi(num)
	if err != nil || i < 0 || i >= len(l.recurrent) {
		return []ggufTarget{{hfNameArch(l.lay, t.Name), e}}, nil
	}
	p := "model.layers." + num + "."
	la := p + "linear_attn."
	dims := func(want int) error {
		if len(t.Dims) != want {
			return fmt.Errorf("tensor %s: %d dims, want %d", t.Name, len(t.Dims), want)
		}
		return nil
	}
	switch stem {
	case "attn_qkv.weight", "attn_gate.weight", "ssm_in.weight", "ssm_ba.weight", "ssm_conv1d.weight", "ssm_a",
		"ssm_dt.bias", "ssm_norm.weight", "ssm_out.weight", "ssm_beta.weight", "ssm_alpha.weight":
		if !l.recurrent[i] {
			return nil, fmt.Errorf("tensor %s in full-attention layer %d (a fused attention QKV is not supported)", t.Name, i)
		}
	case "ffn_gate_up_exps.weight":
		return nil, fmt.Errorf("tensor %s: fused gate/up experts are not supported", t.Name)
	}
	// heads(n, w) selects, for a run of n value heads of w rows each
	// starting at row `from` (rows before it kept), HF's grouped order
	// out of the tiled one.
	r := l.valueHeads / l.keyHeads
	untile := func(from, w int) []int {
		var rows []int
		for i := range from {
			rows = append(rows, i)
		}
		for h := range l.valueHeads {
			src := (h%r)*l.keyHeads + h/r
			for i := range w {
				rows = append(rows, from+src*w+i)
			}
		}
		return rows
	}
	tile := func(e ggufEntry, from, w int) ggufEntry {
		if l.tiled && r > 1 {
			e.rows = untile(from, w)
		}
		return e
	}
	Kd := l.keyHeads * l.keyDim
	switch stem {
	case "attn_qkv.weight":
		return []ggufTarget{{la + "in_proj_qkv.weight", tile(e, 2*Kd, l.valueDim)}}, nil
	case "attn_gate.weight":
		return []ggufTarget{{la + "in_proj_z.weight", tile(e, 0, l.valueDim)}}, nil
	case "ssm_beta.weight":
		return []ggufTarget{{la + "in_proj_b.weight", tile(e, 0, 1)}}, nil
	case "ssm_alpha.weight":
		return []ggufTarget{{la + "in_proj_a.weight", tile(e, 0, 1)}}, nil
	case "ssm_in.weight":
		if l.tiled {
			return nil, fmt.Errorf("tensor %s: a fused in_proj_qkvz in %s is not supported", t.Name, l.arch)
		}
		return []ggufTarget{{la + "in_proj_qkvz.weight", e}}, nil
	case "ssm_out.weight":
		if l.tiled && r > 1 {
			for h := range l.valueHeads {
				e.colBlocks = append(e.colBlocks, (h%r)*l.keyHeads+h/r)
			}
		}
		return []ggufTarget{{la + "out_proj.weight", e}}, nil
	case "ssm_norm.weight":
		return []ggufTarget{{la + "norm.weight", e}}, nil
	case "ssm_dt.bias":
		return []ggufTarget{{la + "dt_bias", tile(e, 0, 1)}}, nil
	case "ssm_a":
		if t.Type != TypeF32 {
			return nil, fmt.Errorf("tensor %s: type %s (want F32)", t.Name, t.Type)
		}
		e.negLog = true
		return []ggufTarget{{la + "A_log", tile(e, 0, 1)}}, nil
	case "ssm_conv1d.weight":
		if err := dims(2); err != nil {
			return nil, err
		}
		e.shape = []int{int(t.Dims[1]), int(t.Dims[0]), 1}
		return []ggufTarget{{la + "conv1d.weight", tile(e, 2*Kd, l.valueDim)}}, nil
	case "ffn_gate_inp_shexp.weight":
		if err := dims(1); err != nil {
			return nil, err
		}
		e.shape = []int{1, int(t.Dims[0])}
		return []ggufTarget{{p + "mlp.shared_expert_gate.weight", e}}, nil
	case "ssm_ba.weight":
		if l.tiled {
			return nil, fmt.Errorf("tensor %s: a fused ssm_ba in %s is not supported", t.Name, l.arch)
		}
		if l.legacy[num] {
			return []ggufTarget{{la + "in_proj_ba.weight", e}}, nil
		}
		if err := dims(2); err != nil {
			return nil, err
		}
		if t.Dims[1] != uint64(2*l.valueHeads) {
			return nil, fmt.Errorf("tensor %s: %d rows, want %d (2 per value head)", t.Name, t.Dims[1], 2*l.valueHeads)
		}
		// Rows grouped per key head g: [b of its r value heads, a of
		// them]; value head h = g·r + j.
		b, a := e, e
		for h := range l.valueHeads {
			g, j := h/r, h%r
			b.rows = append(b.rows, 2*r*g+j)
			a.rows = append(a.rows, 2*r*g+r+j)
		}
		return []ggufTarget{{la + "in_proj_b.weight", b}, {la + "in_proj_a.weight", a}}, nil
	}
	return []ggufTarget{{hfNameArch(l.lay, t.Name), e}}, nil
}
