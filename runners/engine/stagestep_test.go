package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestStageStepBatchEqualsWholeModel: several sequences run together
// through pipeline stages with StageStep — prompt chunks of different
// lengths in one step, then batched one-token decode steps, the hidden
// states handed on as float32 — give each sequence the whole model's
// logits bit for bit on the cpu backend (dense, MoE, sliding Gemma 3 and
// a Gated DeltaNet hybrid, 2 and 3 stages). A later stage refuses a step
// without hidden states and one with the wrong number, and a refused
// step leaves every cache where it was.
func TestStageStepBatchEqualsWholeModel(t *testing.T) {
	var dirs []string
	for _, s := range []testmodel.Spec{{Arch: "llama", Seed: 1, Layers: 3}, {Arch: "qwen3moe", Seed: 2, Layers: 3}, {Arch: "gemma3", Seed: 7, Layers: 4}} {
		d := t.TempDir()
		if err := testmodel.Write(d, s); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	dirs = append(dirs, filepath.Join("testdata", "reference", "qwen3_next"))
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompts := testmodel.SlidingPrompts()
	seqs := [][]int32{prompts[2], prompts[0], prompts[3]}
	steps := [][]int32{{5, 6, 7}, {9, 3, 2}, {1, 1, 4}} // steps[k][i]: sequence i's token at decode step k
	for _, dir := range dirs {
		whole, err := engine.Load(ctx, dir, b, engine.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		L := whole.Info().Layers
		want := make([][][]float32, len(seqs)) // want[i][k]: sequence i's logits after step k (0: the prompt)
		for i, p := range seqs {
			c := whole.NewCache()
			lg, err := whole.Forward(ctx, c, p)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], lg)
			for _, st := range steps {
				if lg, err = whole.Forward(ctx, c, st[i:i+1]); err != nil {
					t.Fatal(err)
				}
				want[i] = append(want[i], lg)
			}
			c.Free()
		}
		for _, cuts := range [][]int{{1}, {1, L - 1}} {
			bounds := append(append([]int{0}, cuts...), L)
			var stages []*engine.Model
			caches := make([][]engine.KVCache, len(bounds)-1) // caches[stage][seq]
			for si := range len(bounds) - 1 {
				m, err := engine.Load(ctx, dir, b, engine.LoadOptions{Layers: engine.LayerRange{Start: bounds[si], End: bounds[si+1]}})
				if err != nil {
					t.Fatal(err)
				}
				stages = append(stages, m)
				for range seqs {
					caches[si] = append(caches[si], m.NewCache())
				}
			}
			if _, _, err := stages[1].StageStep(ctx, caches[1], seqs, nil); !errors.Is(err, engine.ErrStage) {
				t.Fatalf("%s: a later stage without hidden states: %v", dir, err)
			}
			if _, _, err := stages[1].StageStep(ctx, caches[1], seqs, make([]float32, 3)); !errors.Is(err, engine.ErrStage) {
				t.Fatalf("%s: a later stage with 3 hidden values: %v", dir, err)
			}
			run := func(toks [][]int32) [][]float32 {
				var h []float32
				for si, m := range stages {
					out, lg, err := m.StageStep(ctx, caches[si], toks, h)
					if err != nil {
						t.Fatalf("%s stage %d: %v", dir, si, err)
					}
					if si == len(stages)-1 {
						if out != nil || len(lg) != len(toks) {
							t.Fatalf("%s: the last stage gave %d hidden values and %d logit rows", dir, len(out), len(lg))
						}
						return lg
					}
					if lg != nil {
						t.Fatalf("%s: stage %d gave logits", dir, si)
					}
					h = out
				}
				return nil
			}
			got := [][][]float32{run(seqs)}
			for _, st := range steps {
				toks := make([][]int32, len(seqs))
				for i := range seqs {
					toks[i] = st[i : i+1]
				}
				got = append(got, run(toks))
			}
			for k := range got {
				for i := range seqs {
					if !sameBits(got[k][i], want[i][k]) {
						t.Errorf("%s cut at %v: sequence %d step %d logits differ from the whole model's", dir, cuts, i, k)
					}
				}
			}
			for si, m := range stages {
				for i, c := range caches[si] {
					if c.Len() != len(seqs[i])+len(steps) {
						t.Errorf("%s stage %d sequence %d: cache holds %d positions", dir, si, i, c.Len())
					}
					c.Free()
				}
				m.Close()
			}
		}
		whole.Close()
	}
}
