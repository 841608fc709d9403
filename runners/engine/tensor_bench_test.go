package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestTensorAllSumsPerStep counts, with the engine's own in-process
// ranks, the all_sums of one decode step and of one prefill chunk for
// stacks with the layer structure of Llama-3.1-8B (32 dense layers) and
// Qwen3-235B-A22B (94 sparse layers), and scales the payload to their
// width (4096) in bf16, MLX's activation dtype. The structure, not the
// tiny widths, decides the count: two all_sums per layer (one after
// attention, one after the MLP or the whole MoE, routed and shared
// experts together). Run with -v for the table in docs/BENCHMARKS.md.
func TestTensorAllSumsPerStep(t *testing.T) {
	if testing.Short() {
		t.Skip("loads a 94-layer stack at 2 and 4 ranks")
	}
	const realD, bf16, chunk = 4096, 2, 512
	stacks := []struct {
		name string
		spec testmodel.Spec
	}{
		{"Llama-3.1-8B (32 dense layers)", testmodel.Spec{Arch: "llama", Layers: 32, Hidden: 64, Heads: 8, KVHeads: 4, HeadDim: 8, Intermediate: 64, Vocab: 300}},
		{"Qwen3-235B-A22B (94 MoE layers)", testmodel.Spec{Arch: "qwen3moe", AllSparse: true, Layers: 94, Hidden: 64, Heads: 8, KVHeads: 4, HeadDim: 8,
			Intermediate: 64, Experts: 8, ExpertsPerToken: 2, MoEIntermediate: 32, Vocab: 300}},
	}
	t.Logf("| stack | ranks | all_sums per decode step | bytes per all_sum (bf16, D = %d) | bytes summed per decode step | sent per rank per step: ring 2(n−1)/n, mesh n−1 | all_sums × bytes per %d-token prefill chunk |", realD, chunk)
	t.Logf("|---|---|---|---|---|---|---|")
	for _, st := range stacks {
		dir := t.TempDir()
		if err := testmodel.Write(dir, st.spec); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{2, 4} {
			tg := loadTP(t, dir, n, engine.LoadOptions{})
			prompt := tpPrompt(9, st.spec.Vocab)
			tg.prefill(t, prompt, 0)
			before := tg.g.Stats(0)
			tg.forward(t, []int32{5})
			after := tg.g.Stats(0)
			calls, bytes := after.Calls-before.Calls, after.Bytes-before.Bytes
			if want := int64(2 * st.spec.Layers); calls != want {
				t.Fatalf("%s over %d ranks: %d all_sums per decode step, want %d (two per layer)", st.name, n, calls, want)
			}
			if want := calls * int64(st.spec.Hidden) * 4; bytes != want { // the cpu backend sums float32 rows [1, D]
				t.Fatalf("%s: %d bytes summed per step, want %d", st.name, bytes, want)
			}
			// A prefill chunk sums the same count of [chunk, D] arrays.
			b0 := tg.g.Stats(0)
			tg.prefill(t, tpPrompt(16, st.spec.Vocab), 16) // the count does not depend on the chunk's length
			pc := tg.g.Stats(0).Calls - b0.Calls
			// The last layer of a chunk without logits only fills its
			// cache: its two all_sums are skipped.
			if want := int64(2*st.spec.Layers - 2); pc != want {
				t.Fatalf("%s: %d all_sums per prefill chunk, want %d", st.name, pc, want)
			}
			per := int64(realD * bf16)
			step := calls * per
			t.Logf("| %s | %d | %d | %s | %s | %s, %s | %d × %s |", st.name, n, calls, kib(per), kib(step),
				kib(step*2*int64(n-1)/int64(n)), kib(step*int64(n-1)), pc, kib(per*chunk))
		}
	}
}

func kib(b int64) string {
	if b >= 1<<20 {
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}

// BenchmarkTensorDecodeStep is one decode step of a small Llama-shaped
// model (8 layers, width 512, 8 heads / 4 KV heads, MLP 1536, 4-bit) on
// the cpu backend: the whole model on one rank with one thread against
// the same model split over 2 in-process ranks with one thread each
// (LocalGroup: the all_sums cross goroutines through the host). The
// ratio of the two is what splitting buys on two cores before any
// network:
//
//	go test -run '^$' -bench TensorDecodeStep -benchtime 200x -count 5 ./runners/engine/
func BenchmarkTensorDecodeStep(b *testing.B) {
	dir := b.TempDir()
	spec := testmodel.Spec{Arch: "llama", Layers: 8, Hidden: 512, Heads: 8, KVHeads: 4, Intermediate: 1536, Vocab: 512, QuantBits: 4, GroupSize: 32, MaxPositions: 4096}
	if err := testmodel.Write(dir, spec); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			tg := loadTP(b, dir, n, engine.LoadOptions{})
			prompt := tpPrompt(32, spec.Vocab)
			tg.prefill(b, prompt, 0)
			errs := make([]error, n)
			dsts := make([][]float32, n)
			done := make(chan int, n)
			tok := []int32{7}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%256 == 255 { // keep the context short: back to the prompt
					for _, c := range tg.cs {
						c.Truncate(len(prompt))
					}
				}
				for r := range n {
					go func() {
						dsts[r], errs[r] = tg.ms[r].ForwardInto(context.Background(), tg.cs[r], tok, dsts[r])
						if errs[r] != nil {
							tg.g.Abort(errs[r])
						}
						done <- r
					}()
				}
				for range n {
					<-done
				}
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
