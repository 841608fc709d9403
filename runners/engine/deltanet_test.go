package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
)

type qwen3NextFixture struct {
	Prompts []struct {
		Tokens    []int32 `json:"tokens"`
		Logits    string  `json:"logits_f32_b64"`
		Greedy    []int32 `json:"greedy"`
		MinMargin float64 `json:"min_margin"`
	} `json:"prompts"`
}

func loadQwen3NextFixture(t *testing.T) qwen3NextFixture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "reference", "qwen3_next.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx qwen3NextFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Prompts) != 4 {
		t.Fatalf("%d prompts in the fixture", len(fx.Prompts))
	}
	return fx
}

// TestQwen3NextMatchesMLXLM runs the tiny Qwen3-Next model that
// scripts/reference/qwen3_next_reference.py built with mlx-lm's own classes
// (4 layers: Gated DeltaNet, gated attention with partial rotary, twice;
// a dense MLP, then routed experts with a shared expert) and compares with
// mlx-lm's outputs: last-position logits cosine ≥ 0.9999 and identical
// 32-token greedy continuations, for prompts of 1 to 150 tokens, in one
// pass and in prefill chunks of 16 (the 150-token prompt spans 10 chunks,
// so conv and recurrent states cross chunk boundaries).
func TestQwen3NextMatchesMLXLM(t *testing.T) {
	fx := loadQwen3NextFixture(t)
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", "qwen3_next"), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, p := range fx.Prompts {
		want := f32FromBase64(t, p.Logits)
		for _, chunk := range []int{0, 16} {
			c := m.NewCache()
			var logits []float32
			if chunk == 0 {
				logits, err = m.Forward(ctx, c, p.Tokens)
			} else {
				if len(p.Tokens) > 1 {
					if err := m.Prefill(ctx, c, p.Tokens[:len(p.Tokens)-1], chunk, nil); err != nil {
						t.Fatal(err)
					}
				}
				logits, err = m.Forward(ctx, c, p.Tokens[len(p.Tokens)-1:])
			}
			if err != nil {
				t.Fatal(err)
			}
			cs := cosine32(logits, want)
			greedy := greedyFrom(t, m, c, logits, len(p.Greedy))
			t.Logf("prompt %d (%d tokens), chunk %d: cosine %.7f, greedy equal %v", i, len(p.Tokens), chunk, cs, slices.Equal(greedy, p.Greedy))
			if cs < 0.9999 {
				t.Errorf("prompt %d chunk %d: cosine %.7f < 0.9999", i, chunk, cs)
			}
			if !slices.Equal(greedy, p.Greedy) {
				t.Errorf("prompt %d chunk %d: greedy %v, mlx-lm %v", i, chunk, greedy, p.Greedy)
			}
			c.Free()
		}
	}
}
