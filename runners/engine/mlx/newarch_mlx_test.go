//go:build mlx && cgo && (linux || darwin)

package mlx

import "testing"

// TestSmolLM3AndOlmo2MatchMLXLMOnMLX runs the tiny SmolLM3 (NoPE layers,
// tied embeddings) and OLMo 2 (post-norms, q/k norms over the projection)
// models of ../testdata/reference on the MLX backend, f32 and mlx-lm's
// 4-bit quantization: mlx-lm's logits (cosine ≥ 0.9999) and 32-token greedy
// continuations, in one pass and in prefill chunks of 16.
func TestSmolLM3AndOlmo2MatchMLXLMOnMLX(t *testing.T) {
	b := newTestBackend(t)
	for _, name := range []string{"smollm3", "smollm3_q4", "olmo2", "olmo2_q4"} {
		t.Run(name, func(t *testing.T) { testQwen3NextMLX(t, b, name) })
	}
}
