package cpu_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// BenchmarkSmolLM2StepPositions: what one more position costs a step of
// SmolLM2-135M (Q4_1 GGUF, or $EXO_SMOLLM2_GGUF) on one thread, the
// number speculative decoding's speed-up hangs on. Each iteration runs
// one forward of each size P (1, 3, 5, 9, 17 positions: a plain step and
// a sequence verifying 2, 4, 8, 16 drafts) after the same 300-token
// context, in turn, so the machine's load drifts over all sizes alike;
// the cache is rolled back after each. Reported per size: the thread's
// CPU ms per step (Pn-ms) and the cost of each position past the first
// in units of a one-position step, (T(P)/T(1) − 1)/(P − 1) (Pn-cost).
func BenchmarkSmolLM2StepPositions(b *testing.B) {
	path := testenv.SmolLM2(b)
	be, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, path, be, engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ids := make([]int32, 300)
	for i := range ids {
		ids[i] = int32(100 + (i*37)%5000)
	}
	c := m.NewCache()
	if err := m.Prefill(ctx, c, ids, 0, nil); err != nil {
		b.Fatal(err)
	}
	sizes := []int{1, 3, 5, 9, 17}
	flat := make([]float32, 0, sizes[len(sizes)-1]*m.Info().Vocab)
	step := func(P int) {
		if _, err := m.ForwardAllInto(ctx, c, ids[10:10+P], flat); err != nil {
			b.Fatal(err)
		}
		c.Truncate(len(ids))
	}
	for _, P := range sizes { // warm: scratch takes its size
		step(P)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpuNs := make([]int64, len(sizes))
	for b.Loop() {
		for i, P := range sizes {
			t0 := cpu.ThreadCPU()
			step(P)
			cpuNs[i] += cpu.ThreadCPU() - t0
		}
	}
	if cpuNs[0] <= 0 {
		return // no thread CPU time here
	}
	for i, P := range sizes {
		b.ReportMetric(float64(cpuNs[i])/float64(b.N)/1e6, fmt.Sprintf("P%d-ms", P))
		if P > 1 {
			b.ReportMetric((float64(cpuNs[i])/float64(cpuNs[0])-1)/float64(P-1), fmt.Sprintf("P%d-cost", P))
		}
	}
}
