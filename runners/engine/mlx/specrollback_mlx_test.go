//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestSpeculativeRollbackMatchesRecompute: on MLX, a speculative decoder's
// cache — each round one forward of what it lacks, a token and up to six
// drafts, truncated past the rejected drafts — can always go back within
// its last forward (a sliding layer's ring keeps its window; a Gated
// DeltaNet cache returns to where the forward began) and, after many
// rounds past the sliding windows' slabs, gives the next logits of a cache
// that ran the same forwards without the rejected drafts (cosine ≥ 0.9999,
// same argmax). The cpu backend's test of the same name checks the bytes.
func TestSpeculativeRollbackMatchesRecompute(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	gen := func(spec testmodel.Spec) string { return testmodel.Dir(t, spec) }
	for _, c := range []struct{ name, dir string }{
		{"mistral", gen(testmodel.Spec{Arch: "mistral", Seed: 3, SlidingWindow: 8})},
		{"gemma3", gen(testmodel.Spec{Arch: "gemma3", Seed: 3, Layers: 3})},
		{"gptoss", gen(testmodel.Spec{Arch: "gptoss", Seed: 3})},
		{"qwen3_next", filepath.Join("..", "testdata", "reference", "qwen3_next")},
		{"qwen3_5", filepath.Join("..", "testdata", "reference", "qwen3_5")},
		{"qwen3_5_moe", filepath.Join("..", "testdata", "reference", "qwen3_5_moe")},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := load(t, c.dir, b)
			info := m.Info()
			vocab := min(info.Vocab, 500)
			rng := rand.New(rand.NewPCG(5, 7))
			tok := func() int32 { return int32(10 + rng.IntN(vocab-10)) }
			var hist []int32
			for range 70 {
				hist = append(hist, tok())
			}
			spec, re := m.NewCache(), m.NewCache()
			defer spec.Free()
			defer re.Free()
			forward(t, m, spec, hist...)
			forward(t, m, re, hist...)
			for round := range 50 {
				pre := append([]int32(nil), hist[spec.Len():]...)
				feed := append(append(pre, tok()), make([]int32, 1+rng.IntN(6))...)
				for i := len(pre) + 1; i < len(feed); i++ {
					feed[i] = tok()
				}
				start := spec.Len()
				if _, err := m.ForwardAllInto(ctx, spec, feed, nil); err != nil {
					t.Fatal(err)
				}
				keep := len(pre) + 1 + rng.IntN(len(feed)-len(pre))
				hist = append(hist, feed[len(pre):keep]...)
				if !spec.CanTruncate(start + keep) {
					t.Fatalf("round %d: cannot go back to %d after a forward from %d to %d", round, start+keep, start, spec.Len())
				}
				spec.Truncate(start + keep)
				if kept := spec.Len() - start; kept > 0 {
					forward(t, m, re, feed[:kept]...)
				}
				if spec.Len() != re.Len() {
					t.Fatalf("round %d: %d positions, recomputed %d", round, spec.Len(), re.Len())
				}
			}
			last := append(append([]int32(nil), hist[spec.Len():]...), tok())
			got := append([]float32(nil), forward(t, m, spec, last...)...)
			want := forward(t, m, re, last...)
			if cs := fixture.Cosine(got, want); cs < 0.9999 || argmax(got) != argmax(want) {
				t.Fatalf("next logits after rollbacks: cosine %v, argmax %d, recomputed %d", cs, argmax(got), argmax(want))
			}
		})
	}
}
