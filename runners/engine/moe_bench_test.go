package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// moeBenchSpec is a small but not tiny MoE: 8 sparse layers of 32 experts,
// 4 per token, width 256.
func moeBenchSpec(dt engine.DType, bits int) testmodel.Spec {
	return testmodel.Spec{Arch: "qwen3moe", DType: dt, QuantBits: bits, Seed: 1, Layers: 8, Hidden: 256, Heads: 4, KVHeads: 2,
		Experts: 32, ExpertsPerToken: 4, MoEIntermediate: 256, AllSparse: true, MaxPositions: 2048}
}

// BenchmarkMoEDecode measures MoE decode tokens/s on the cpu backend with
// experts routed inside the graph and on the host (the path it replaced:
// one read-back of router logits per sparse layer and step), in the same
// run, after a 64-token prompt.
func BenchmarkMoEDecode(b *testing.B) {
	be, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []struct {
		dt   engine.DType
		bits int
	}{{engine.F32, 0}, {engine.BF16, 4}} {
		dir := b.TempDir()
		if err := testmodel.Write(dir, moeBenchSpec(q.dt, q.bits)); err != nil {
			b.Fatal(err)
		}
		for _, host := range []bool{false, true} {
			route := "graph"
			if host {
				route = "host"
			}
			b.Run(fmt.Sprintf("%v-q%d/route=%s", q.dt, q.bits, route), func(b *testing.B) {
				benchMoEDecode(b, be, dir, host)
			})
		}
	}
}

func benchMoEDecode(b *testing.B, be engine.Backend, dir string, host bool) {
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, be, engine.LoadOptions{HostMoERouting: host})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(100 + i*7%300)
	}
	c := m.NewCache()
	defer c.Free()
	logits, err := m.Forward(ctx, c, prompt)
	if err != nil {
		b.Fatal(err)
	}
	tok := int32(argmax(logits))
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		if c.Len() > 1024 {
			c.Truncate(len(prompt))
		}
		if logits, err = m.Forward(ctx, c, []int32{tok}); err != nil {
			b.Fatal(err)
		}
		tok = int32(argmax(logits))
	}
	reportTokens(b, b.N, cpu0)
}

// BenchmarkMoEPrefill measures MoE prefill tokens/s (one 256-token chunk,
// (token, expert) pairs sorted by expert) on the cpu backend, routed
// inside the graph and on the host, in the same run.
func BenchmarkMoEPrefill(b *testing.B) {
	be, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := testmodel.Write(dir, moeBenchSpec(engine.BF16, 4)); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	prompt := make([]int32, 256)
	for i := range prompt {
		prompt[i] = int32(100 + i*7%300)
	}
	for _, host := range []bool{false, true} {
		b.Run(fmt.Sprintf("bfloat16-q4/route=%s", map[bool]string{false: "graph", true: "host"}[host]), func(b *testing.B) {
			m, err := engine.Load(ctx, dir, be, engine.LoadOptions{HostMoERouting: host})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				c := m.NewCache()
				if err := m.Prefill(ctx, c, prompt, 0, nil); err != nil {
					b.Fatal(err)
				}
				c.Free()
			}
			reportTokens(b, len(prompt)*b.N, cpu0)
		})
	}
}

// BenchmarkGptOssDecode is BenchmarkMoEDecode on a gpt-oss-shaped model
// (sliding/full layers with sinks, biased experts, clamped SwiGLU; 8
// layers of 32 experts, 4 per token, width 256), f32 and MXFP4 experts,
// routed inside the graph and on the host.
func BenchmarkGptOssDecode(b *testing.B) {
	be, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, mx := range []bool{false, true} {
		spec := testmodel.Spec{Arch: "gptoss", DType: engine.F32, MXFP4: mx, Seed: 1, Layers: 8, Hidden: 256, Heads: 4, KVHeads: 2,
			Experts: 32, ExpertsPerToken: 4, MoEIntermediate: 256, MaxPositions: 2048}
		if mx {
			spec.DType = engine.BF16
		}
		dir := b.TempDir()
		if err := testmodel.Write(dir, spec); err != nil {
			b.Fatal(err)
		}
		for _, host := range []bool{false, true} {
			route := "graph"
			if host {
				route = "host"
			}
			b.Run(fmt.Sprintf("mxfp4=%v/route=%s", mx, route), func(b *testing.B) {
				benchMoEDecode(b, be, dir, host)
			})
		}
	}
}
