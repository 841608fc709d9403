//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
)

// TestQwen3NextMatchesMLXLMOnMLX runs the tiny Qwen3-Next model of
// ../testdata/reference/qwen3_next on the MLX backend (Gated DeltaNet
// through DeltaGates/GatedDelta, gather_mm experts, gated partial-rotary
// attention): mlx-lm's logits (cosine ≥ 0.9999) and greedy continuations,
// in one pass and in prefill chunks of 16; f32 and mlx-lm's 4-bit
// quantization (gather_qmm); Qwen3.5 dense and MoE.
func TestQwen3NextMatchesMLXLMOnMLX(t *testing.T) {
	b := newTestBackend(t)
	for _, name := range []string{"qwen3_next", "qwen3_next_q4", "qwen3_5", "qwen3_5_moe"} {
		t.Run(name, func(t *testing.T) { testQwen3NextMLX(t, b, name) })
	}
}

func testQwen3NextMLX(t *testing.T, b *backend, name string) {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "reference", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Prompts []struct {
			Tokens []int32 `json:"tokens"`
			Logits string  `json:"logits_f32_b64"`
			Greedy []int32 `json:"greedy"`
		} `json:"prompts"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	m := load(t, filepath.Join("..", "testdata", "reference", name), b)
	for i, p := range fx.Prompts {
		want := fixture.F32FromBase64(t, p.Logits)
		for _, chunk := range []int{0, 16} {
			c := m.NewCache()
			var logits []float32
			if chunk == 0 || len(p.Tokens) == 1 {
				logits = forward(t, m, c, p.Tokens...)
			} else {
				if err := m.Prefill(context.Background(), c, p.Tokens[:len(p.Tokens)-1], chunk, nil); err != nil {
					t.Fatal(err)
				}
				logits = forward(t, m, c, p.Tokens[len(p.Tokens)-1])
			}
			cs := fixture.Cosine(logits, want)
			var greedy []int32
			for range p.Greedy {
				tok := argmax(logits)
				greedy = append(greedy, tok)
				logits = forward(t, m, c, tok)
			}
			t.Logf("prompt %d (%d tokens) chunk %d: cosine %.7f, greedy equal %v", i, len(p.Tokens), chunk, cs, slices.Equal(greedy, p.Greedy))
			if cs < 0.9999 || !slices.Equal(greedy, p.Greedy) {
				t.Errorf("prompt %d chunk %d: cosine %.7f, greedy %v, mlx-lm %v", i, chunk, cs, greedy, p.Greedy)
			}
			c.Free()
		}
	}
}

// TestHybridCacheKeepsNoGarbage: decoding with a hybrid cache on MLX pins
// a fixed number of arrays once decoding began: each step's new recurrent
// states replace the old ones (freed unless a mark or snapshot holds them),
// and a freed cache
// unpins all of its own.
func TestHybridCacheKeepsNoGarbage(t *testing.T) {
	b := newTestBackend(t)
	m := load(t, filepath.Join("..", "testdata", "reference", "qwen3_next"), b)
	pinned := func() (n int) {
		// The weights' transposed views (made at first use, released
		// with the weights) belong to the model, not the cache; the
		// RoPE tables (at most maxRopeTabs pairs) and the constants (at
		// most maxConsts) to the backend.
		b.do(func() { n = len(b.pinned) - len(b.wT) - 2*len(b.ropeTabs) - len(b.consts) })
		return n
	}
	base := pinned()
	c := m.NewCache()
	if err := m.Prefill(context.Background(), c, make([]int32, 100), 32, nil); err != nil {
		t.Fatal(err)
	}
	tok := argmax(forward(t, m, c, 1)) // the prompt's last token
	// The first decode step: from here on the states where the prefill
	// ended stay pinned by their snapshot (a next turn resumes there).
	tok = argmax(forward(t, m, c, tok))
	after := pinned()
	for range 40 {
		tok = argmax(forward(t, m, c, tok))
	}
	if got := pinned(); got != after {
		t.Fatalf("%d arrays pinned after 40 decode steps, %d before", got, after)
	}
	c.Free()
	if got := pinned(); got != base {
		t.Fatalf("%d arrays pinned after Free, %d before the cache", got, base)
	}
}

// TestQwen35BF16MatchesMLXLMOnMLX: the tiny Qwen3.5 with bfloat16 weights
// (../testdata/reference/qwen3_5_bf16) on MLX, which computes in bfloat16
// as mlx-lm does, the recurrent state and gates in float32 as mlx-lm
// 0.32 does: logits cosine ≥ 0.999 in one pass and after a chunked
// prefill, and, fed mlx-lm's greedy tokens, the same argmax at every step
// where mlx-lm's top two were ≥ 0.25 apart (8 bf16 steps of these logits).
func TestQwen35BF16MatchesMLXLMOnMLX(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "reference", "qwen3_5_bf16.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Prompts []struct {
			Tokens  []int32   `json:"tokens"`
			Logits  string    `json:"logits_f32_b64"`
			Greedy  []int32   `json:"greedy"`
			Margins []float64 `json:"margins"`
		} `json:"prompts"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Prompts) != 4 {
		t.Fatalf("%d prompts in the fixture", len(fx.Prompts))
	}
	b := newTestBackend(t)
	m := load(t, filepath.Join("..", "testdata", "reference", "qwen3_5_bf16"), b)
	const minCos, minMargin = 0.999, 0.25
	for i, p := range fx.Prompts {
		if len(p.Margins) != len(p.Greedy) {
			t.Fatalf("prompt %d: %d margins for %d greedy tokens", i, len(p.Margins), len(p.Greedy))
		}
		for _, chunk := range []int{0, 16} {
			c := m.NewCache()
			var logits []float32
			if chunk == 0 || len(p.Tokens) == 1 {
				logits = forward(t, m, c, p.Tokens...)
			} else {
				if err := m.Prefill(context.Background(), c, p.Tokens[:len(p.Tokens)-1], chunk, nil); err != nil {
					t.Fatal(err)
				}
				logits = forward(t, m, c, p.Tokens[len(p.Tokens)-1])
			}
			cs := fixture.Cosine(logits, fixture.F32FromBase64(t, p.Logits))
			checked, worst := 0, 0.0
			for s, want := range p.Greedy {
				if got := argmax(logits); got != want {
					worst = max(worst, p.Margins[s])
					if p.Margins[s] >= minMargin {
						t.Errorf("prompt %d chunk %d step %d: argmax %d, mlx-lm %d (its margin %.3f)", i, chunk, s, got, want, p.Margins[s])
					}
				}
				if p.Margins[s] >= minMargin {
					checked++
				}
				logits = forward(t, m, c, want)
			}
			c.Free()
			t.Logf("prompt %d (%d tokens) chunk %d: cosine %.6f, %d/%d steps checked, largest margin of a disagreement %.3f",
				i, len(p.Tokens), chunk, cs, checked, len(p.Greedy), worst)
			if cs < minCos {
				t.Errorf("prompt %d chunk %d: cosine %.6f < %g", i, chunk, cs, minCos)
			}
		}
	}
}
