//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// BenchmarkMoEDecode measures MoE decode tokens/s on MLX with experts
// routed inside the graph (one Eval per step) and on the host (one
// read-back of router logits per sparse layer and step, the path it
// replaced), in the same run, after a 64-token prompt. The model matches
// the engine package's BenchmarkMoEDecode: 8 sparse layers of 32 experts,
// 4 per token, width 256, float32 (MLX's CPU backend has no fast 16-bit
// or quantized matmul; on Metal and CUDA the stall per read-back is the
// larger cost).
func BenchmarkMoEDecode(b *testing.B) {
	mb := newTestBackend(b)
	dir := moeBenchModel(b)
	ctx := context.Background()
	for _, host := range []bool{false, true} {
		route := "graph"
		if host {
			route = "host"
		}
		b.Run(fmt.Sprintf("route=%s", route), func(b *testing.B) {
			m, err := engine.Load(ctx, dir, mb, engine.LoadOptions{HostMoERouting: host})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			prompt := benchPrompt(64, testmodel.DefaultVocab)
			c := m.NewCache()
			defer c.Free()
			logits := forward(b, m, c, prompt...)
			tok := argmax(logits)
			cpu0 := cpuTime()
			n := 0
			for b.Loop() {
				if c.Len() > 1024 {
					c.Truncate(len(prompt))
				}
				tok = argmax(forward(b, m, c, tok))
				n++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
			reportCPU(b, cpu0, n)
		})
	}
}

// moeBenchModel writes the benchmark's MoE model (Qwen3-MoE, or the arch
// in $EXO_MLX_BENCH_MOE_ARCH) into
// $EXO_MLX_BENCH_MOE_MODEL (kept there, for mlx-lm to load too) or a
// temporary directory.
func moeBenchModel(b *testing.B) string {
	dir := os.Getenv("EXO_MLX_BENCH_MOE_MODEL")
	if dir == "" {
		dir = filepath.Join(b.TempDir(), "moe")
	}
	spec := testmodel.Spec{Arch: "qwen3moe", DType: engine.F32, Seed: 1, Layers: 8, Hidden: 256, Heads: 4, KVHeads: 2,
		Experts: 32, ExpertsPerToken: 4, MoEIntermediate: 256, AllSparse: true, MaxPositions: 2048}
	if a := os.Getenv("EXO_MLX_BENCH_MOE_ARCH"); a != "" {
		// The same shape as gpt-oss (sliding/full layers with sinks,
		// biased experts with the clamped SwiGLU): EXO_MLX_BENCH_MOE_ARCH=gptoss.
		spec.Arch, spec.AllSparse = a, false
	}
	if err := testmodel.Write(dir, spec); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkMoEPrefill measures MoE prefill tokens/s on MLX (one 256-token
// chunk: 1024 (token, expert) pairs sorted by expert for gather_mm),
// routed inside the graph and on the host, in the same run.
func BenchmarkMoEPrefill(b *testing.B) {
	mb := newTestBackend(b)
	dir := moeBenchModel(b)
	ctx := context.Background()
	prompt := benchPrompt(256, testmodel.DefaultVocab)
	for _, host := range []bool{false, true} {
		b.Run(fmt.Sprintf("route=%s", map[bool]string{false: "graph", true: "host"}[host]), func(b *testing.B) {
			m, err := engine.Load(ctx, dir, mb, engine.LoadOptions{HostMoERouting: host})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			cpu0 := cpuTime()
			n := 0
			for b.Loop() {
				c := m.NewCache()
				if err := m.Prefill(ctx, c, prompt, 0, nil); err != nil {
					b.Fatal(err)
				}
				c.Free()
				n += len(prompt)
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
			reportCPU(b, cpu0, n)
		})
	}
}
