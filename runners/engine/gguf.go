package engine

import (
	"fmt"
	"sort"
)

// GGUFMetadata is what an architecture's GGUF mapping reads of a GGUF file
// (engine/weights implements it over the file's header).
type GGUFMetadata interface {
	// Uint is a key's value of any integer type that is not negative.
	Uint(key string) (uint64, bool)
	Float(key string) (float64, bool)
	// Meta is a key's raw value (arrays as Go slices).
	Meta(key string) (any, bool)
	// HasTensor reports whether the file holds the named GGUF tensor.
	HasTensor(name string) bool
	// RecurrentLayers is the per-layer recurrent flags of a file whose
	// layout has DeltaNetTensors (nil otherwise).
	RecurrentLayers() []bool
}

// GGUFLayout is how llama.cpp's converter writes one architecture
// (general.architecture Name): what engine/weights needs to present the
// file as the HF checkpoint the Architecture loads. The tensor
// conversions it names are engine/weights' (format work shared by every
// layout that sets them); the names and the config are the architecture's.
type GGUFLayout struct {
	Name      string // general.architecture, e.g. "llama"
	ModelType string // the config.json model_type synthesized
	// LayerNames maps the block stems whose HF module differs from the
	// common ones ("ffn_norm" → "pre_feedforward_layernorm"); a stem
	// mapped to a tensor, not a module (attention sinks), ends in a name
	// without a .weight suffix in HF and is listed in TensorStems.
	LayerNames  map[string]string
	TensorStems map[string]bool
	// NormsPlusOne: the converter stored every norm weight as 1 + w (it
	// is read back as w, float32 only).
	NormsPlusOne bool
	// PermutedQK: q/k rows are permuted into llama.cpp's interleaved
	// RoPE order (undone per head on read).
	PermutedQK bool
	// ExpertFFN: feed_forward_length may be absent (no dense layer uses
	// it): expert_feed_forward_length stands in.
	ExpertFFN bool
	// DeltaNetTensors: Gated DeltaNet tensors in llama.cpp's qwen3next
	// layout (engine/weights' gguf_qwen3next.go); TiledValueHeads: with
	// the value heads reordered to tiled order (Qwen3.5).
	DeltaNetTensors, TiledValueHeads bool
	// Config, when set, adds the architecture's own config.json fields to
	// cfg, which holds the common ones already (numbers as uint64 and
	// float64); key(k) is the metadata key Name + "." + k.
	Config func(md GGUFMetadata, key func(string) string, cfg map[string]any) error
}

// GGUFArchitecture returns the HF architecture name and layout registered
// for a GGUF general.architecture.
func GGUFArchitecture(name string) (string, *GGUFLayout, bool) {
	archRegistry.RLock()
	defer archRegistry.RUnlock()
	for hf, a := range archRegistry.m {
		if a.GGUF != nil && a.GGUF.Name == name {
			return hf, a.GGUF, true
		}
	}
	return "", nil, false
}

// GGUFArchitectures lists the GGUF general.architecture names registered.
func GGUFArchitectures() []string {
	archRegistry.RLock()
	defer archRegistry.RUnlock()
	var names []string
	for _, a := range archRegistry.m {
		if a.GGUF != nil {
			names = append(names, a.GGUF.Name)
		}
	}
	sort.Strings(names)
	return names
}

// ggufNeed reads a required unsigned metadata key.
func ggufNeed(md GGUFMetadata, key string) (uint64, error) {
	v, ok := md.Uint(key)
	if !ok {
		return 0, fmt.Errorf("metadata %s missing", key)
	}
	return v, nil
}

// ggufCopy sets cfg[hf] from each required metadata key k (hf → k).
func ggufCopy(md GGUFMetadata, key func(string) string, cfg map[string]any, keys map[string]string) error {
	for hf, k := range keys {
		v, err := ggufNeed(md, key(k))
		if err != nil {
			return err
		}
		cfg[hf] = v
	}
	return nil
}

// ggufSlidingLayers sets HF layer_types and sliding_window from llama.cpp's
// sliding-window metadata: no (or a zero) attention.sliding_window makes
// every layer full; otherwise attention.sliding_window_pattern says which
// layers slide, as a bool per layer or as a period n (layer i slides unless
// i%n == n-1; n = 0: all slide), defaulting to the architecture's period.
func ggufSlidingLayers(md GGUFMetadata, key func(string) string, cfg map[string]any, defPattern int) error {
	layers := int(cfg["num_hidden_layers"].(uint64))
	types := make([]string, layers)
	for i := range types {
		types[i] = "full_attention"
	}
	cfg["layer_types"] = types
	w, ok := md.Uint(key("attention.sliding_window"))
	if !ok || w == 0 {
		return nil
	}
	pk := key("attention.sliding_window_pattern")
	raw, present := md.Meta(pk)
	flags := make([]bool, layers)
	switch v := raw.(type) {
	case []bool:
		if len(v) != layers {
			return fmt.Errorf("metadata %s: %d entries for %d layers", pk, len(v), layers)
		}
		copy(flags, v)
	default:
		n := uint64(defPattern)
		if present {
			if n, ok = md.Uint(pk); !ok {
				return fmt.Errorf("metadata %s: %v is neither a period nor a bool per layer", pk, raw)
			}
		}
		for i := range flags {
			flags[i] = n == 0 || uint64(i)%n < n-1
		}
	}
	for i, f := range flags {
		if f {
			types[i] = "sliding_attention"
		}
	}
	cfg["sliding_window"] = w
	return nil
}

// ggufMoE copies llama.cpp's expert counts and marks every layer sparse
// with the chosen experts' weights renormalized (llama.cpp's MoE layouts).
func ggufMoE(md GGUFMetadata, key func(string) string, cfg map[string]any) error {
	err := ggufCopy(md, key, cfg, map[string]string{"num_experts": "expert_count",
		"num_experts_per_tok": "expert_used_count", "moe_intermediate_size": "expert_feed_forward_length"})
	cfg["norm_topk_prob"], cfg["decoder_sparse_step"], cfg["mlp_only_layers"] = true, 1, []int{}
	return err
}
