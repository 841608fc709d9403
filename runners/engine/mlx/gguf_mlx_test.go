//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
)

// The GGUF reference files (Gemma 3 f32/Q8_0/Q4_0, gpt-oss f32/MXFP4,
// Qwen3-Next f32/Q8_0, Qwen3.5 dense and MoE Q4_0;
// scripts/reference/gguf_llamacpp.py) on MLX follow
// the cpu backend (which the engine tests hold to llama.cpp) through a
// chunked prefill of 5 windows and 32 greedy steps.
func TestGGUFReferenceFilesMatchCPU(t *testing.T) {
	mb := newTestBackend(t)
	dir := filepath.Join("..", "testdata", "reference", "gguf")
	for _, f := range []string{"gemma3_f32", "gemma3_q8_0", "gemma3_q4_0", "gptoss_f32", "gptoss_mxfp4",
		"qwen3next_f32", "qwen3next_q8_0", "qwen35_q4_0", "qwen35moe_q4_0"} {
		t.Run(f, func(t *testing.T) {
			path := filepath.Join(dir, f+".gguf")
			mm, cm := load(t, path, mb), load(t, path, cpu.New(0))
			mc, cc := mm.NewCache(), cm.NewCache()
			prompt := make([]int32, 40)
			for i := range prompt {
				prompt[i] = int32((i*53 + 11) % 290)
			}
			for _, x := range []struct {
				m *engine.Model
				c engine.KVCache
			}{{mm, mc}, {cm, cc}} {
				if err := x.m.Prefill(t.Context(), x.c, prompt[:len(prompt)-1], 7, nil); err != nil {
					t.Fatal(err)
				}
			}
			tok := prompt[len(prompt)-1]
			worst := 1.0
			for step := range 32 {
				ml, cl := forward(t, mm, mc, tok), forward(t, cm, cc, tok)
				c := fixture.Cosine(ml, cl)
				worst = min(worst, c)
				if c < 0.999 {
					t.Fatalf("step %d: cosine %v", step, c)
				}
				tok = argmax(cl)
			}
			t.Logf("lowest cosine over 32 steps: %.6f", worst)
		})
	}
}
