//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestMoEMatchesMLXLMOnMLX runs the MoE models (Qwen3-MoE, Qwen2-MoE with
// its shared expert) of the mlx-lm
// fixture (../testdata/reference/mlx_lm.json) on the MLX backend, where
// the experts go through gather_mm / gather_qmm (the 51-token prompt's
// 102 (token, expert) pairs sorted by expert, the shorter ones unsorted,
// decode with one shared row): f32 logits cosine ≥ 0.9999 and identical
// greedy continuations, 4-bit cosine ≥ 0.999.
func TestMoEMatchesMLXLMOnMLX(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "reference", "mlx_lm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Prompts [][]int32 `json:"prompts"`
		Models  []struct {
			Name    string `json:"name"`
			Results []struct {
				Logits    string  `json:"logits_f32_b64"`
				Greedy    []int32 `json:"greedy"`
				MinMargin float64 `json:"min_margin"`
			} `json:"results"`
		} `json:"models"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	specs := map[string]testmodel.Spec{}
	for _, r := range testmodel.ReferenceSet() {
		specs[r.Name] = r.Spec
	}
	b := newTestBackend(t)
	ran := 0
	for _, fm := range fx.Models {
		if !strings.Contains(fm.Name, "moe") {
			continue
		}
		ran++
		t.Run(fm.Name, func(t *testing.T) {
			spec := specs[fm.Name]
			dir := t.TempDir()
			if err := testmodel.Write(dir, spec); err != nil {
				t.Fatal(err)
			}
			m := load(t, dir, b)
			f32 := spec.QuantBits == 0
			minCos := 0.999
			if f32 {
				minCos = 0.9999
			}
			for i, res := range fm.Results {
				want := fixture.F32FromBase64(t, res.Logits)
				c := m.NewCache()
				logits := forward(t, m, c, fx.Prompts[i]...)
				cs := fixture.Cosine(logits, want)
				var greedy []int32
				for range res.Greedy {
					tok := argmax(logits)
					greedy = append(greedy, tok)
					logits = forward(t, m, c, tok)
				}
				t.Logf("prompt %d (%d tokens): cosine %.7f, greedy equal: %v", i, len(fx.Prompts[i]), cs, slices.Equal(greedy, res.Greedy))
				if cs < minCos {
					t.Errorf("prompt %d: cosine %.7f < %v", i, cs, minCos)
				}
				if f32 && !slices.Equal(greedy, res.Greedy) {
					t.Errorf("prompt %d: greedy %v, mlx-lm %v", i, greedy, res.Greedy)
				}
				c.Free()
			}
		})
	}
	if ran != 4 {
		t.Fatalf("%d MoE models in the fixture, want 4", ran)
	}
}
