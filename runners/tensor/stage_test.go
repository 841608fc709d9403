package tensor

import (
	"context"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestStageStepTwoStagesOfTwoRanks: a pipeline of two stages, each a
// group of two ranks over real links (stage calls: the followers compute
// their shares from rank 0's tokens and hidden rows), gives the whole
// model's logits for a prompt and then for a batched decode step of two
// sequences; a follower's caches follow rank 0's truncations.
func TestStageStepTwoStagesOfTwoRanks(t *testing.T) {
	for _, spec := range []testmodel.Spec{
		{Arch: "llama", Heads: 4, KVHeads: 2, Layers: 4, Seed: 3},
		{Arch: "qwen3moe", Heads: 4, KVHeads: 2, Layers: 4, Seed: 3},
	} {
		t.Run(spec.Arch, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, spec); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			whole := load(t, dir, nil)
			s0 := startGroupWith(t, dir, 2, nil, engine.LoadOptions{Layers: engine.LayerRange{Start: 0, End: 2}})
			s1 := startGroupWith(t, dir, 2, []byte("k"), engine.LoadOptions{Layers: engine.LayerRange{Start: 2, End: 4}})
			s0.waitWhole()
			s1.waitWhole()
			p1, p2 := []int32{5, 17, 99, 3, 250, 41, 7}, []int32{8, 300, 12}
			step := func(c0, c1 []engine.KVCache, toks [][]int32) [][]float32 {
				t.Helper()
				h, lg, err := s0.model.StageStep(ctx, c0, toks, nil)
				if err != nil || lg != nil {
					t.Fatalf("stage 0: %v (logits %v)", err, lg != nil)
				}
				out, lg, err := s1.model.StageStep(ctx, c1, toks, h)
				if err != nil || out != nil {
					t.Fatalf("stage 1: %v (hidden %v)", err, out != nil)
				}
				return lg
			}
			a0, a1, b0, b1 := s0.model.NewCache(), s1.model.NewCache(), s0.model.NewCache(), s1.model.NewCache()
			wa, wb := whole.NewCache(), whole.NewCache()
			got := step([]engine.KVCache{a0, b0}, []engine.KVCache{a1, b1}, [][]int32{p1, p2})
			for i, w := range [][]int32{p1, p2} {
				c := []engine.KVCache{wa, wb}[i]
				want, err := whole.Forward(ctx, c, w)
				if err != nil {
					t.Fatal(err)
				}
				if cs := cosine(got[i], want); cs < 0.99999 || argmax(got[i]) != argmax(want) {
					t.Fatalf("prompt %d: cosine %v, argmax %d, whole %d", i, cs, argmax(got[i]), argmax(want))
				}
			}
			// Back one position on every rank of both stages, then a
			// batched step of one token each.
			for _, c := range []engine.KVCache{a0, a1, wa} {
				c.Truncate(len(p1) - 1)
			}
			toks := [][]int32{{p1[len(p1)-1]}, {42}}
			got = step([]engine.KVCache{a0, b0}, []engine.KVCache{a1, b1}, toks)
			want, err := whole.ForwardBatch(ctx, []engine.KVCache{wa, wb}, []int32{toks[0][0], toks[1][0]})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if cs := cosine(got[i], want[i]); cs < 0.99999 || argmax(got[i]) != argmax(want[i]) {
					t.Fatalf("batched step, sequence %d: cosine %v", i, cs)
				}
			}
			for _, c := range []engine.KVCache{a0, a1, b0, b1} {
				c.Free()
			}
		})
	}
}
