package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestDecodeStepAllocatesNothing: once warm, a decode step on the cpu
// backend (ForwardInto with a reused logits buffer, and ForwardBatchInto)
// makes no heap allocation: temporaries live in the backend's step arena,
// the model's host-side bookkeeping in its scratch. The logits must still
// equal plain Forward's, bit for bit. Runs on tiny generated models of
// each weight kind the cpu backend multiplies differently (f32, MLX 4-bit,
// MLX 8-bit, MXFP4), each cache dtype (f32, bf16, f16), each layer kind
// (full and sliding attention with sinks, MoE with and without a shared
// expert; not the Gated DeltaNet hybrids, see below), 16-bit weights and
// on SmolLM2 when it is installed (two threads).
//
// With one thread the count must be exactly 0. With two, the worker
// goroutine parks when the step pauses for over a millisecond (the test's
// goroutine descheduled on a loaded machine), and after a GC cycle the
// runtime may allocate a fresh waiter record for that: at most one
// allocation over all the steps is tolerated then (an allocation per step
// would show as at least runs).
func TestDecodeStepAllocatesNothing(t *testing.T) {
	for _, threads := range []int{1, 2} {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			decodeAllocs(t, threads)
		})
	}
	t.Run("smollm2", func(t *testing.T) {
		s := loadSmol(t)
		checkDecodeAllocs(t, s.m, s.promptIDs(t, "What is the capital of France?"), 4, 1)
	})
}

func decodeAllocs(t *testing.T, threads int) {
	b, err := backend.Open("cpu", backend.Options{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, v := range []struct {
		spec  testmodel.Spec
		cache engine.DType
		dir   string // a reference model instead of spec
	}{
		{spec: testmodel.Spec{Arch: "llama"}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "qwen3", QuantBits: 4, GroupSize: 32}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "qwen2", QuantBits: 8, GroupSize: 32}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "llama"}, cache: engine.BF16},
		{spec: testmodel.Spec{Arch: "llama"}, cache: engine.F16},
		{spec: testmodel.Spec{Arch: "qwen3moe"}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "qwen2moe"}, cache: engine.BF16},
		{spec: testmodel.Spec{Arch: "mistral"}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "gemma3"}, cache: engine.BF16},
		{spec: testmodel.Spec{Arch: "gptoss"}, cache: engine.F32},
		{spec: testmodel.Spec{Arch: "gptoss", DType: engine.BF16, MXFP4: true}, cache: engine.BF16},
		{spec: testmodel.Spec{Arch: "qwen3", DType: engine.BF16}, cache: engine.BF16},
		// Not the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): each step
		// keeps its new recurrent and conv states (Backend.Keep copies them
		// off the arena); TestHybridDecodeAllocationsBounded bounds them.
	} {
		name := fmt.Sprintf("%s-q%d-mxfp4=%v-cache=%v", v.spec.Arch, v.spec.QuantBits, v.spec.MXFP4, v.cache)
		if v.dir != "" {
			name = filepath.Base(v.dir) + "-cache=" + v.cache.String()
		}
		t.Run(name, func(t *testing.T) {
			dir := v.dir
			if dir == "" {
				dir = t.TempDir()
				spec := v.spec
				spec.Seed = 5
				if spec.DType == 0 {
					spec.DType = engine.F32
				}
				if err := testmodel.Write(dir, spec); err != nil {
					t.Fatal(err)
				}
			}
			m, err := engine.Load(ctx, dir, b, engine.LoadOptions{CacheDType: v.cache})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			checkDecodeAllocs(t, m, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 20, threads-1)
		})
	}
}

func checkDecodeAllocs(t *testing.T, m *engine.Model, prompt []int32, runs, slack int) {
	t.Helper()
	ctx := context.Background()
	const B = 3
	caches := make([]engine.KVCache, B)
	toks := make([]int32, B)
	for i := range caches {
		caches[i] = m.NewCache()
		defer caches[i].Free()
		if err := m.Prefill(ctx, caches[i], prompt[:len(prompt)-i], 0, nil); err != nil {
			t.Fatal(err)
		}
		toks[i] = prompt[len(prompt)-1-i]
	}
	n0 := caches[0].Len()
	// The reference: plain Forward on a copy of the sequence's cache state.
	ref := m.NewCache()
	defer ref.Free()
	if err := m.Prefill(ctx, ref, prompt, 0, nil); err != nil {
		t.Fatal(err)
	}
	want, err := m.Forward(ctx, ref, []int32{toks[0]})
	if err != nil {
		t.Fatal(err)
	}

	var buf []float32
	tok := toks[0]
	single := func() {
		if caches[0].Len() > n0+40 {
			caches[0].Truncate(n0)
		}
		var err error
		if buf, err = m.ForwardInto(ctx, caches[0], []int32{tok}, buf); err != nil {
			t.Fatal(err)
		}
	}
	single() // warm: the arena and scratch take their size
	if !sameBits(buf, want) {
		t.Fatal("ForwardInto's logits differ from Forward's")
	}
	if a := allocsPerStep(runs, single); a > float64(slack) {
		t.Errorf("ForwardInto: %v allocations in %d decode steps, want 0", a, runs)
	}

	flat := make([]float32, 0, B*len(want))
	batch := func() {
		if caches[1].Len() > n0+40 {
			for _, c := range caches {
				c.Truncate(c.Len() - 20)
			}
		}
		if _, err := m.ForwardBatchInto(ctx, caches, toks, flat); err != nil {
			t.Fatal(err)
		}
	}
	batch()
	if a := allocsPerStep(runs, batch); a > float64(slack) {
		t.Errorf("ForwardBatchInto: %v allocations in %d decode steps, want 0", a, runs)
	}

	// A batch verifying drafts (ForwardBatchAllInto): chunks of 4, 1 and
	// 3 tokens, every row's logits, then the drafts rejected (each cache
	// back to its length before the step).
	chunks := [][]int32{{toks[0], 1, 2, 3}, {toks[1]}, {toks[2], 4, 5}}
	lens := make([]int, B)
	rows := make([]float32, 0, 8*len(want))
	verify := func() {
		for i, c := range caches {
			lens[i] = c.Len()
		}
		if _, err := m.ForwardBatchAllInto(ctx, caches, chunks, rows); err != nil {
			t.Fatal(err)
		}
		for i, c := range caches {
			c.Truncate(lens[i] + 1)
		}
		if caches[1].Len() > n0+40 {
			for _, c := range caches {
				c.Truncate(c.Len() - 20)
			}
		}
	}
	verify()
	if a := allocsPerStep(runs, verify); a > float64(slack) {
		t.Errorf("ForwardBatchAllInto: %v allocations in %d verifying steps, want 0", a, runs)
	}
}

// allocsPerStep is the total of testing.AllocsPerRun(1, f) over runs
// calls: AllocsPerRun divides by its run count and truncates, so one
// allocation in several runs would read as 0.
//
// AllocsPerRun counts the whole process's mallocs, so a stray runtime
// allocation elsewhere (seen once in CI under load: 1 in 20 steps with one
// thread) can land in a window. The least of three windows is returned: an
// allocation the step itself makes shows in every window (at least runs),
// a stray one does not.
func allocsPerStep(runs int, f func()) float64 {
	least := -1.0
	for range 3 {
		var n float64
		for range runs {
			n += testing.AllocsPerRun(1, f)
		}
		if least < 0 || n < least {
			least = n
		}
		if least == 0 {
			break
		}
	}
	return least
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(a[i] != a[i] && b[i] != b[i]) {
			return false
		}
	}
	return true
}

// TestHybridDecodeAllocationsBounded: the Gated DeltaNet hybrids (mlx-lm's
// tiny Qwen3-Next and Qwen3.5) are not yet allocation-free, but a decode
// step stays within a small budget: at most 16 allocations per step and
// sequence (measured 15 on both; 78 and 62 before the step's shapes and
// argument lists moved to scratch and the gates to the arena).
func TestHybridDecodeAllocationsBounded(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"qwen3_next", "qwen3_5"} {
		t.Run(name, func(t *testing.T) {
			m, err := engine.Load(ctx, filepath.Join("testdata", "reference", name), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c := m.NewCache()
			defer c.Free()
			logits, err := m.Forward(ctx, c, []int32{1, 2, 3, 4, 5, 6, 7, 8})
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]float32, 0, len(logits))
			tok := []int32{9}
			step := func() {
				if c.Len() > 60 {
					c.Truncate(40)
				}
				if buf, err = m.ForwardInto(ctx, c, tok, buf); err != nil {
					t.Fatal(err)
				}
			}
			step()
			const runs, budget = 20, 16
			if a := allocsPerStep(runs, step); a > runs*budget {
				t.Errorf("%v allocations in %d decode steps, want at most %d per step", a, runs, budget)
			} else {
				t.Logf("%v allocations in %d decode steps", a, runs)
			}
		})
	}
}
