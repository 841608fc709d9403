package engine_test

import "testing"

// TestSmolLM3MatchesMLXLM runs the tiny SmolLM3 models that
// scripts/reference/smollm3_olmo2_reference.py built with mlx-lm's own
// smollm3 classes (6 layers, NoPE on layers 1 and 4, tied embeddings; f32
// and mlx-lm's 4-bit quantization) through the engine and compares with
// mlx-lm's outputs as TestQwen3NextMatchesMLXLM does: cosine ≥ 0.9999 and
// identical 32-token greedy continuations, in one pass and in prefill
// chunks of 16.
func TestSmolLM3MatchesMLXLM(t *testing.T) {
	for _, name := range []string{"smollm3", "smollm3_q4"} {
		t.Run(name, func(t *testing.T) { testQwen3Next(t, name) })
	}
}

// TestOlmo2MatchesMLXLM: the same for OLMo 2 (mlx-lm's olmo2: norms after
// attention and after the MLP, q/k norms over the whole projection).
func TestOlmo2MatchesMLXLM(t *testing.T) {
	for _, name := range []string{"olmo2", "olmo2_q4"} {
		t.Run(name, func(t *testing.T) { testQwen3Next(t, name) })
	}
}
