package testmodel

import "github.com/exo-pd/exo-pd/runners/engine"

// Reference is one model of the reference-numerics set: the models that
// scripts/reference/mlx_reference.py runs through mlx-lm and that
// runners/engine's reference test runs through the engine.
type Reference struct {
	Name string // directory name, e.g. "llama-f32"
	Spec Spec
}

// ReferenceSet returns the reference models: llama, qwen2, qwen3 and
// qwen3moe (3 layers) and qwen2moe (2 layers, both sparse, with a shared expert) in f32, bf16 (not the MoE models) and MLX 4-bit (bf16 scales, group 64), all with seed 4 (chosen among seeds 1-8 for the largest top-1/top-2 logit margin in f32 greedy decoding, ≥ 0.003).
func ReferenceSet() []Reference {
	var out []Reference
	for _, arch := range []string{"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe"} {
		layers := 0 // default
		if arch == "qwen3moe" {
			layers = 3 // one dense layer, two sparse
		}
		out = append(out, Reference{arch + "-f32", Spec{Arch: arch, DType: engine.F32, Seed: 4, Layers: layers}})
		moe := arch == "qwen3moe" || arch == "qwen2moe"
		if !moe {
			// MLX's CPU backend runs the dense gather_mm of mlx-lm's
			// SwitchGLU in float32 only, so mlx-lm cannot give a bf16 MoE
			// reference here.
			out = append(out, Reference{arch + "-bf16", Spec{Arch: arch, DType: engine.BF16, Seed: 4, Layers: layers}})
		}
		q4 := Spec{Arch: arch, DType: engine.BF16, QuantBits: 4, GroupSize: 64, Seed: 4, Layers: layers}
		if moe {
			// float32 scales, so mlx-lm computes in float32 too: in bf16 a
			// near-tie between two experts' router probabilities can pick
			// a different expert, which no tolerance on logits absorbs.
			q4.DType = engine.F32
		}
		out = append(out, Reference{arch + "-q4", q4})
	}
	return out
}

// SlidingSet returns the sliding-window reference models (fixture
// testdata/reference/mlx_lm_sliding.json): Gemma 3 text models of 4 layers
// (window 8, every third layer global) in f32, MLX 4-bit with f32 scales,
// and with tied embeddings, and a 4-layer gpt-oss (window 8, alternating,
// sinks, YaRN, 8 experts top-2) in f32 and with MXFP4 experts, all with
// seed 4.
func SlidingSet() []Reference {
	g := Spec{Arch: "gemma3", Seed: 4, Layers: 4}
	q4, tied := g, g
	q4.QuantBits, q4.GroupSize = 4, 64
	tied.Tied = true
	return []Reference{{"gemma3-f32", g}, {"gemma3-q4", q4}, {"gemma3-tied-f32", tied},
		{"gptoss-f32", Spec{Arch: "gptoss", Seed: 4, Layers: 4}},
		{"gptoss-mxfp4", Spec{Arch: "gptoss", Seed: 4, Layers: 4, MXFP4: true}}}
}

// SlidingPrompts are the prompts of the sliding-window fixtures: one
// shorter than the window, the rest 3 to 6 windows of 8 long.
func SlidingPrompts() [][]int32 {
	out := [][]int32{ReferencePrompts()[1], ReferencePrompts()[4]}
	for _, n := range []int{24, 40} {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((i*37 + 11) % 500)
		}
		out = append(out, p)
	}
	return out
}

// ReferencePrompts are the fixed prompt token sequences of the reference
// fixtures (ids valid for the default vocabulary of 512).
func ReferencePrompts() [][]int32 {
	return [][]int32{
		{EndOfTextID(DefaultVocab)},
		{ImStartID(DefaultVocab), 300, 301, 302, 10, 84, 104, 101, 32, 109},
		{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20},
		{400, 17, 400, 17, 400, 17, 256, 257, 258, 259, 260, 261},
		{104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 32, 72, 111, 119, 32, 97, 114, 101,
			32, 121, 111, 117, 63, 32, 73, 39, 109, 32, 102, 105, 110, 101, 44, 32, 116, 104, 97, 110,
			107, 115, 46, 32, 501, 480, 333, 444, 255, 0, 128},
	}
}
