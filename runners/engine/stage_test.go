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

// TestPipelineStagesEqualWholeModel: a model loaded as pipeline stages
// (LoadOptions.Layers) and run stage after stage through StageForward,
// the hidden states handed on as float32, gives the whole model's logits
// bit for bit on the cpu backend, for a prompt chunk and the decode steps
// after it: full attention, sliding layers (Gemma 3), NoPE layers and tied
// embeddings (SmolLM3, whose last stage loads the embedding as its head),
// post-norms (OLMo 2) and a Gated DeltaNet hybrid (recurrent state per
// stage). Each stage holds only its layers; whole-model calls on a stage
// and a stage's input of the wrong kind are refused. One stage of every
// layer (no cut) is the whole model, and StageForward returns its logits.
func TestPipelineStagesEqualWholeModel(t *testing.T) {
	gemma := t.TempDir()
	if err := testmodel.Write(gemma, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 4}); err != nil {
		t.Fatal(err)
	}
	llama := t.TempDir()
	if err := testmodel.Write(llama, testmodel.Spec{Arch: "llama", Seed: 1, Layers: 3}); err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join("testdata", "reference")
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, dir := range []string{llama, gemma, filepath.Join(ref, "smollm3"), filepath.Join(ref, "olmo2"), filepath.Join(ref, "qwen3_next")} {
		whole, err := engine.Load(ctx, dir, b, engine.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		L := whole.Info().Layers
		prompt := testmodel.SlidingPrompts()[2]
		wc := whole.NewCache()
		want := [][]float32{}
		lg, err := whole.Forward(ctx, wc, prompt)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, lg)
		for _, tok := range []int32{5, 6, 7} {
			if lg, err = whole.Forward(ctx, wc, []int32{tok}); err != nil {
				t.Fatal(err)
			}
			want = append(want, lg)
		}
		for _, cuts := range [][]int{{}, {1}, {L - 1}, {1, L - 1}} {
			bounds := append(append([]int{0}, cuts...), L)
			var stages []*engine.Model
			var caches []engine.KVCache
			for i := range len(bounds) - 1 {
				r := engine.LayerRange{Start: bounds[i], End: bounds[i+1]}
				m, err := engine.Load(ctx, dir, b, engine.LoadOptions{Layers: r})
				if err != nil {
					t.Fatalf("%s %v: %v", dir, r, err)
				}
				if len(m.Blocks()) != r.End-r.Start || m.Stage() != r || m.Fingerprint() != whole.Fingerprint() {
					t.Fatalf("%s %v: %d blocks, stage %v", dir, r, len(m.Blocks()), m.Stage())
				}
				stages = append(stages, m)
				caches = append(caches, m.NewCache())
			}
			if len(stages) > 1 {
				if _, err := stages[0].Forward(ctx, caches[0], prompt); !errors.Is(err, engine.ErrStage) {
					t.Fatalf("%s: Forward on a stage: %v", dir, err)
				}
				if _, err := stages[1].StageForward(ctx, caches[1], prompt, nil); !errors.Is(err, engine.ErrStage) {
					t.Fatalf("%s: a later stage without hidden states: %v", dir, err)
				}
			}
			run := func(toks []int32) []float32 {
				var h []float32
				for i, m := range stages {
					out, err := m.StageForward(ctx, caches[i], toks, h)
					if err != nil {
						t.Fatalf("%s stage %d: %v", dir, i, err)
					}
					h = out
				}
				return h
			}
			got := [][]float32{run(prompt)}
			for _, tok := range []int32{5, 6, 7} {
				got = append(got, run([]int32{tok}))
			}
			for i := range want {
				if !sameBits(got[i], want[i]) {
					t.Errorf("%s cut at %v: step %d logits differ from the whole model's", dir, cuts, i)
				}
			}
			for i, m := range stages {
				caches[i].Free()
				m.Close()
			}
		}
		wc.Free()
		whole.Close()
	}
}
