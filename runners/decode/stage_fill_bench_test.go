package decode

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// BenchmarkStageFillSmolLM2: remote fills of SmolLM2-135M (30 layers,
// Q4_1 GGUF, f32 KV on the cpu backend) from one prefill runner over
// loopback TCP, for a whole-model decode runner and for the two stages
// [0, 15) and [15, 30) of a pipelined one (each stage asks for its range;
// "group" runs both stages' fills at once, as a pipeline group does).
// "warm": the prompt is in the prefill runner's prefix cache (transfer and
// injection only); "cold": a new prompt each time (the prefill runner
// computes it for the first request and serves the second stage's range
// from its prefix cache: it admits one request at a time).
func BenchmarkStageFillSmolLM2(b *testing.B) {
	ctx := context.Background()
	path, err := hf.FindSmolLM2(ctx)
	if err != nil {
		b.Skip(err)
	}
	load := func(r engine.LayerRange) *engine.Model {
		m, err := engine.Load(ctx, path, cpu.New(2), engine.LoadOptions{Layers: r})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m
	}
	whole := load(engine.LayerRange{})
	n := whole.Info().Layers
	stages := []*engine.Model{load(engine.LayerRange{Start: 0, End: n / 2}), load(engine.LayerRange{Start: n / 2, End: n})}
	addr := servePrefill(b, whole, 256, nil)
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	const tokens = 1024
	prompt := func(seed int) []int32 {
		p := make([]int32, tokens)
		for i := range p {
			p[i] = int32(100 + (i*7919+seed*104729)%40000)
		}
		return p
	}
	fill := func(m StageModel, c engine.KVCache, p []int32) int64 {
		c.Truncate(0)
		st, err := (&StageFill{Client: cl, Name: "m", Model: m}).Fill(ctx, "bench", c, p, 0, []string{addr})
		if err != nil {
			b.Fatal(err)
		}
		return st.Bytes
	}
	group := func(caches []engine.KVCache, p []int32) int64 {
		var wg sync.WaitGroup
		bytes := make([]int64, len(stages))
		for i, s := range stages {
			wg.Go(func() { bytes[i] = fill(s, caches[i], p) })
		}
		wg.Wait()
		return bytes[0] + bytes[1]
	}
	warm := prompt(0)
	fill(whole, whole.NewCache(), warm) // into the prefill runner's prefix cache
	seed := 1
	for _, mode := range []string{"warm", "cold"} {
		next := func() []int32 {
			if mode == "warm" {
				return warm
			}
			seed++
			return prompt(seed)
		}
		cases := []struct {
			name string
			run  func(p []int32) int64
		}{
			{"whole", func() func([]int32) int64 {
				c := whole.NewCache()
				return func(p []int32) int64 { return fill(whole, c, p) }
			}()},
			{"group", func() func([]int32) int64 {
				cs := []engine.KVCache{stages[0].NewCache(), stages[1].NewCache()}
				return func(p []int32) int64 { return group(cs, p) }
			}()},
		}
		if mode == "warm" {
			for _, s := range stages {
				r := s.Stage()
				c := s.NewCache()
				cases = append(cases, struct {
					name string
					run  func(p []int32) int64
				}{fmt.Sprintf("stage=%d:%d", r.Start, r.End), func(p []int32) int64 { return fill(s, c, p) }})
			}
		}
		for _, tc := range cases {
			b.Run(mode+"/"+tc.name, func(b *testing.B) {
				var bytes int64
				for b.Loop() {
					bytes = tc.run(next())
				}
				b.SetBytes(bytes)
				b.ReportMetric(float64(bytes)/(1<<20), "MiB/fill")
			})
		}
	}
}
