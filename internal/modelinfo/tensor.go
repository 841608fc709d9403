package modelinfo

import (
	"fmt"
	"strings"
)

// noTensorSplit names the architectures whose layers cannot be split
// across tensor ranks, and why (the engine refuses them the same way).
var noTensorSplit = map[string]string{
	"Olmo2ForCausalLM": "its q/k norms span the whole projection, which a rank holds only a share of",
}

// splitSize is one count a tensor rank count must divide: value under its
// config.json key; with group > 0, each rank's share of the split input
// (value/n × unit) must also be whole quantization groups.
type splitSize struct {
	key         string
	value       int
	unit, group int
}

func (s splitSize) divides(n int) bool {
	if s.value%n != 0 {
		return false
	}
	return s.group == 0 || (s.value*s.unit)%s.group != 0 || (s.value/n*s.unit)%s.group == 0
}

func (f *Facts) splitSizes() []splitSize {
	s := []splitSize{
		{key: "num_attention_heads", value: f.Heads, unit: f.HeadDim, group: f.QuantGroup},
		{key: "num_key_value_heads", value: f.KVHeads},
	}
	if f.DenseMLP || !f.SparseMLP {
		s = append(s, splitSize{key: "intermediate_size", value: f.Intermediate, unit: 1, group: f.QuantGroup})
	}
	if f.SparseMLP {
		s = append(s, splitSize{key: "moe_intermediate_size", value: f.MoEIntermediate, unit: 1, group: f.QuantGroup})
		if f.SharedExpertIntermediate > 0 {
			s = append(s, splitSize{key: "shared_expert_intermediate_size", value: f.SharedExpertIntermediate, unit: 1, group: f.QuantGroup})
		}
	}
	if f.LinearKeyHeads > 0 {
		s = append(s, splitSize{key: "linear_num_key_heads", value: f.LinearKeyHeads},
			splitSize{key: "linear_num_value_heads", value: f.LinearValueHeads, unit: f.LinearValueDim, group: f.QuantGroup})
	}
	return s
}

// TensorCheck refuses a tensor-parallel group of n ranks that does not
// divide the model's attention heads, KV heads, MLP widths (dense, expert,
// shared expert) or DeltaNet heads — each named by its config.json key —
// or whose shares are not whole quantization groups, and lists the rank
// counts that would do. It follows the engine's own check, which it must
// not import.
func (f *Facts) TensorCheck(n int) error {
	if n <= 1 {
		return nil
	}
	if why := noTensorSplit[f.Arch]; why != "" {
		return fmt.Errorf("%s cannot be split across tensor ranks: %s", f.Arch, why)
	}
	sizes := f.splitSizes()
	var bad []string
	for _, s := range sizes {
		switch {
		case s.value%n != 0:
			bad = append(bad, fmt.Sprintf("%s %d is not divisible by %d", s.key, s.value, n))
		case !s.divides(n):
			bad = append(bad, fmt.Sprintf("%s %d over %d ranks leaves %d inputs per rank, not a multiple of the quantization group %d", s.key, s.value, n, s.value/n*s.unit, s.group))
		}
	}
	if bad == nil {
		return nil
	}
	var ok []string
	for k := 2; k <= 64; k++ {
		good := true
		for _, s := range sizes {
			good = good && s.divides(k)
		}
		if good {
			ok = append(ok, fmt.Sprint(k))
		}
	}
	msg := fmt.Sprintf("%d hosts: %s", n, strings.Join(bad, "; "))
	if ok == nil {
		return fmt.Errorf("%s; no host count from 2 to 64 divides them all", msg)
	}
	return fmt.Errorf("%s; host counts that would: %s", msg, strings.Join(ok, ", "))
}
