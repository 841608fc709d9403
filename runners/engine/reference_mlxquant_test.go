package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// TestMatchesMLXQuantizedReference runs models that MLX itself quantized
// (mlx_lm.convert; committed under testdata/reference/mlx_quantized by
// scripts/reference/mlx_quantized.py) and compares with mlx-lm's logits
// and greedy tokens: 4-bit group 32 with f32 scales (cosine ≥ 0.9999,
// identical greedy continuations) and 8-bit group 64 with bf16 scales
// (cosine ≥ 0.999; mlx-lm computes in bf16 there).
func TestMatchesMLXQuantizedReference(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "reference", "mlx_quantized.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Steps   int       `json:"steps"`
		Prompts [][]int32 `json:"prompts"`
		Models  []struct {
			Name    string `json:"name"`
			DType   string `json:"dtype"`
			Results []struct {
				Logits string  `json:"logits_f32_b64"`
				Greedy []int32 `json:"greedy"`
			} `json:"results"`
		} `json:"models"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Models) != 2 {
		t.Fatalf("%d models in fixture", len(fx.Models))
	}
	ctx := context.Background()
	for _, fm := range fx.Models {
		t.Run(fm.Name, func(t *testing.T) {
			src, err := weights.Open(filepath.Join("testdata", "reference", "mlx_quantized", fm.Name))
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			m, err := engine.LoadSource(ctx, src, cpu.New(0), engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			exact := fm.DType == "f32"
			minCos := 0.999
			if exact {
				minCos = 0.9999
			}
			for i, res := range fm.Results {
				want := fixture.F32FromBase64(t, res.Logits)
				c := m.NewCache()
				logits, err := m.Forward(ctx, c, fx.Prompts[i])
				if err != nil {
					t.Fatal(err)
				}
				cs := fixture.Cosine(logits, want)
				greedy := greedyFrom(t, m, c, logits, len(res.Greedy))
				same := 0
				for same < len(greedy) && greedy[same] == res.Greedy[same] {
					same++
				}
				t.Logf("prompt %d: cosine %.7f, greedy agrees for %d/%d tokens", i, cs, same, len(greedy))
				if cs < minCos {
					t.Errorf("prompt %d: logits cosine %.7f < %v", i, cs, minCos)
				}
				if exact && !slices.Equal(greedy, res.Greedy) {
					t.Errorf("prompt %d: greedy %v, mlx-lm %v", i, greedy, res.Greedy)
				}
			}
		})
	}
}
