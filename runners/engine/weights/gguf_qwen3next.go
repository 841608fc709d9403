package weights

import (
	"fmt"
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

// qwen3nextLayout is what the tensor mapping needs from the metadata.
type qwen3nextLayout struct {
	recurrent  []bool // per layer: Gated DeltaNet (true) or attention
	keyHeads   int    // ssm.group_count
	valueHeads int    // ssm.time_step_rank
	legacy     map[string]bool
}

func newQwen3nextLayout(g *GGUF) (*qwen3nextLayout, error) {
	layers, ok := g.Uint("qwen3next.block_count")
	if !ok || layers == 0 || layers > 1<<16 {
		return nil, fmt.Errorf("metadata qwen3next.block_count missing or out of range")
	}
	l := &qwen3nextLayout{legacy: map[string]bool{}}
	for _, k := range []struct {
		key string
		dst *int
	}{{"ssm.group_count", &l.keyHeads}, {"ssm.time_step_rank", &l.valueHeads}} {
		v, ok := g.Uint("qwen3next." + k.key)
		if !ok || v == 0 || v > 1<<16 {
			return nil, fmt.Errorf("metadata qwen3next.%s missing or out of range", k.key)
		}
		*k.dst = int(v)
	}
	if l.valueHeads%l.keyHeads != 0 {
		return nil, fmt.Errorf("metadata qwen3next.ssm.time_step_rank %d is not a multiple of ssm.group_count %d", l.valueHeads, l.keyHeads)
	}
	rk := "qwen3next.attention.recurrent_layers"
	if raw, ok := g.Meta(rk); ok {
		flags, ok := raw.([]bool)
		if !ok || len(flags) < int(layers) {
			return nil, fmt.Errorf("metadata %s: want a bool per layer (%d layers)", rk, layers)
		}
		l.recurrent = flags[:layers]
	} else {
		n := uint64(4)
		if v, ok := g.Uint("qwen3next.full_attention_interval"); ok {
			n = v
		}
		if n == 0 {
			return nil, fmt.Errorf("metadata qwen3next.full_attention_interval is 0")
		}
		l.recurrent = make([]bool, layers)
		for i := range l.recurrent {
			l.recurrent[i] = uint64(i+1)%n != 0
		}
	}
	for _, t := range g.tensors {
		if num, ok := strings.CutSuffix(strings.TrimPrefix(t.Name, "blk."), ".ssm_in.weight"); ok && strings.HasPrefix(t.Name, "blk.") {
			l.legacy[num] = true
		}
	}
	return l, nil
}

// interval is the full_attention_interval that gives l.recurrent (0 when
// none does).
func (l *qwen3nextLayout) interval() int {
	for n := 1; n <= len(l.recurrent); n++ {
		ok := true
		for i, r := range l.recurrent {
			if r != ((i+1)%n != 0) {
				ok = false
				break
			}
		}
		if ok {
			return n
		}
	}
	return 0
}

// targets maps one GGUF tensor to its HF-named tensors.
func (l *qwen3nextLayout) targets(t TensorInfo) ([]ggufTarget, error) {
	e := ggufEntry{src: t.Name}
	rest, ok := strings.CutPrefix(t.Name, "blk.")
	if !ok {
		return []ggufTarget{{hfNameArch("qwen3next", t.Name), e}}, nil
	}
	num, stem, _ := strings.Cut(rest, ".")
	i, err := strconv.Atoi(num)
	if err != nil || i < 0 || i >= len(l.recurrent) {
		return []ggufTarget{{hfNameArch("qwen3next", t.Name), e}}, nil
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
		"ssm_dt.bias", "ssm_norm.weight", "ssm_out.weight":
		if !l.recurrent[i] {
			return nil, fmt.Errorf("tensor %s in full-attention layer %d (a fused attention QKV is not supported)", t.Name, i)
		}
	case "ffn_gate_up_exps.weight":
		return nil, fmt.Errorf("tensor %s: fused gate/up experts are not supported", t.Name)
	}
	switch stem {
	case "attn_qkv.weight":
		return []ggufTarget{{la + "in_proj_qkv.weight", e}}, nil
	case "attn_gate.weight":
		return []ggufTarget{{la + "in_proj_z.weight", e}}, nil
	case "ssm_in.weight":
		return []ggufTarget{{la + "in_proj_qkvz.weight", e}}, nil
	case "ssm_out.weight":
		return []ggufTarget{{la + "out_proj.weight", e}}, nil
	case "ssm_norm.weight":
		return []ggufTarget{{la + "norm.weight", e}}, nil
	case "ssm_dt.bias":
		return []ggufTarget{{la + "dt_bias", e}}, nil
	case "ssm_a":
		if t.Type != TypeF32 {
			return nil, fmt.Errorf("tensor %s: type %s (want F32)", t.Name, t.Type)
		}
		e.negLog = true
		return []ggufTarget{{la + "A_log", e}}, nil
	case "ssm_conv1d.weight":
		if err := dims(2); err != nil {
			return nil, err
		}
		e.shape = []int{int(t.Dims[1]), int(t.Dims[0]), 1}
		return []ggufTarget{{la + "conv1d.weight", e}}, nil
	case "ffn_gate_inp_shexp.weight":
		if err := dims(1); err != nil {
			return nil, err
		}
		e.shape = []int{1, int(t.Dims[0])}
		return []ggufTarget{{p + "mlp.shared_expert_gate.weight", e}}, nil
	case "ssm_ba.weight":
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
		r := l.valueHeads / l.keyHeads
		b, a := e, e
		for h := range l.valueHeads {
			g, j := h/r, h%r
			b.rows = append(b.rows, 2*r*g+j)
			a.rows = append(a.rows, 2*r*g+r+j)
		}
		return []ggufTarget{{la + "in_proj_b.weight", b}, {la + "in_proj_a.weight", a}}, nil
	}
	return []ggufTarget{{hfNameArch("qwen3next", t.Name), e}}, nil
}
