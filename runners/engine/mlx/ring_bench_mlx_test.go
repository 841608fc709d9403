//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// envRingBench turns on TestRingBench (a measurement, not a check: it
// only logs).
const envRingBench = "EXO_MLX_BENCH_RING"

// ringBenchSpec is the model of the engine's BenchmarkTensorDecodeStep: 8
// Llama layers of width 512, 8 heads over 4 KV heads, MLP 1536, 4-bit
// groups of 32.
var ringBenchSpec = testmodel.Spec{Arch: "llama", Layers: 8, Hidden: 512, Heads: 8, KVHeads: 4, Intermediate: 1536, Vocab: 512,
	QuantBits: 4, GroupSize: 32, MaxPositions: 4096, Seed: 1}

const (
	ringChain = 64  // dependent all_sums per evaluation
	ringReps  = 20  // evaluations per size
	ringSteps = 200 // decode steps timed
)

// ringBench is what one rank measured.
type ringBench struct {
	// PerAllSum is µs per all_sum for each size, one value per evaluation
	// of a chain of ringChain dependent all_sums.
	PerAllSum map[string][]float64
	// StepMS is ms per decode step of ringBenchSpec split over the ranks.
	StepMS float64
}

// decodeSteps times ringSteps greedy-free decode steps (token 7, the
// context cut back to the prompt every 64 steps) after a 32-token prompt.
func decodeSteps(t *testing.T, m *engine.Model) float64 {
	t.Helper()
	ctx := context.Background()
	c := m.NewCache()
	defer c.Free()
	prompt := make([]int32, 32)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % (m.Info().Vocab - 8))
	}
	if err := m.Prefill(ctx, c, prompt, 0, nil); err != nil {
		t.Fatal(err)
	}
	var dst []float32
	var err error
	start := time.Now()
	for i := range ringSteps {
		if i%64 == 63 {
			c.Truncate(len(prompt))
		}
		if dst, err = m.ForwardInto(ctx, c, []int32{7}, dst); err != nil {
			t.Fatal(err)
		}
	}
	return float64(time.Since(start).Microseconds()) / 1000 / ringSteps
}

// Measured by hand (EXO_MLX_BENCH_RING=1): the cost of one all_sum on MLX's
// ring backend over loopback inside a lazy graph, as the engine's tensor
// ranks use it, and a decode step of BenchmarkTensorDecodeStep's model on
// MLX, whole in this process against split over two ring processes.
func TestRingBench(t *testing.T) {
	if rankOut() != "" {
		t.Skip("not a rank test")
	}
	if os.Getenv(envRingBench) == "" {
		t.Skipf("a measurement: set %s=1 to run it", envRingBench)
	}
	b := newTestBackend(t)
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, ringBenchSpec); err != nil {
		t.Fatal(err)
	}
	whole := decodeSteps(t, load(t, dir, b))
	outs := runRanks(t, 2, "TestRingBenchRank", envRingBench+"="+dir)
	for r, raw := range outs {
		var got ringBench
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		for _, k := range slices.Sorted(maps.Keys(got.PerAllSum)) {
			v := slices.Sorted(slices.Values(got.PerAllSum[k]))
			t.Logf("rank %d: all_sum of %s in a chain of %d: µs per all_sum min %.1f, median %.1f, max %.1f (%d evaluations)",
				r, k, ringChain, v[0], v[len(v)/2], v[len(v)-1], len(v))
		}
		t.Logf("rank %d: decode step over 2 ring ranks %.2f ms; whole model in one process %.2f ms", r, got.StepMS, whole)
	}
}

// TestRingBenchRank is one rank of TestRingBench.
func TestRingBenchRank(t *testing.T) {
	dir := os.Getenv(envRingBench)
	if rankOut() == "" || dir == "" {
		t.Skip("a rank of TestRingBench; runs only in the processes it starts")
	}
	b := newTestBackend(t)
	c, err := JoinGroup(b, GroupOptions{Backend: "ring", Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	res := ringBench{PerAllSum: map[string][]float64{}}
	for _, sz := range []struct {
		name string
		n    int
		dt   engine.DType
	}{{"512 f32 (2 KiB)", 512, engine.F32}, {"4096 bf16 (8 KiB)", 4096, engine.BF16}, {"4096 f32 (16 KiB)", 4096, engine.F32}} {
		for i := range ringReps + 1 {
			x := b.AsType(b.FromFloat32(make([]float32, sz.n), 1, sz.n), sz.dt)
			start := time.Now()
			for range ringChain {
				x = c.AllSum(b, x)
			}
			if err := b.Eval(x); err != nil {
				t.Fatal(err)
			}
			us := float64(time.Since(start).Nanoseconds()) / 1000 / ringChain
			b.Free()
			if i > 0 { // the first evaluation warms up: not kept
				res.PerAllSum[sz.name] = append(res.PerAllSum[sz.name], us)
			}
		}
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{Tensor: c})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	res.StepMS = decodeSteps(t, m)
	writeRankOut(t, res)
}
