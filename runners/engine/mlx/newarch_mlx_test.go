//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
)

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

// TestPipelineStagesOnMLX: the tiny OLMo 2, SmolLM3 and Qwen3-Next models
// loaded as two pipeline stages (LoadOptions.Layers) on the MLX backend and
// chained through StageForward give the whole model's logits (cosine ≥
// 0.99999) for a prompt and the decode steps after it.
func TestPipelineStagesOnMLX(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	for _, name := range []string{"olmo2", "smollm3", "qwen3_next"} {
		dir := filepath.Join("..", "testdata", "reference", name)
		whole := load(t, dir, b)
		L := whole.Info().Layers
		var stages []*engine.Model
		var caches []engine.KVCache
		for _, r := range []engine.LayerRange{{Start: 0, End: L / 2}, {Start: L / 2, End: L}} {
			m, err := engine.Load(ctx, dir, b, engine.LoadOptions{Layers: r})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			stages = append(stages, m)
			caches = append(caches, m.NewCache())
		}
		wc := whole.NewCache()
		for step, toks := range [][]int32{{3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43}, {5}, {6}} {
			want := forward(t, whole, wc, toks...)
			var h []float32
			for i, m := range stages {
				out, err := m.StageForward(ctx, caches[i], toks, h)
				if err != nil {
					t.Fatalf("%s stage %d: %v", name, i, err)
				}
				h = out
			}
			if cs := fixture.Cosine(h, want); cs < 0.99999 {
				t.Errorf("%s step %d: stages' logits cosine %.7f to the whole model's", name, step, cs)
			}
		}
		wc.Free()
		for _, c := range caches {
			c.Free()
		}
	}
}
