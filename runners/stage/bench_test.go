package stage_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// BenchmarkPipelinePrefill: the prefill of an 8192-token prompt in
// 256-token chunks by one stage holding every layer, capped at R tokens/s,
// against two stages over loopback TCP holding half the layers each and
// capped at 2R (rate-capped simulated hosts: two hosts as fast as the
// one, each doing half the work; the cap makes the result a property of
// the pipeline, not of how loaded this machine is). Reported: both
// prefill rates, their ratio (pipelined over one stage; 2 less the fill
// bubble is the most it can be) and stage 1's bubble ratio.
func BenchmarkPipelinePrefill(b *testing.B) {
	dir := b.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 1, Layers: 2, Hidden: 32, Heads: 1, KVHeads: 1, HeadDim: 32, Intermediate: 64, MaxPositions: 16384}); err != nil {
		b.Fatal(err)
	}
	const n, chunk, rate = 8192, 256, 1000.0
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % 500)
	}
	be, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	whole, err := engine.Load(ctx, dir, be, engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer whole.Close()
	reg := prometheus.NewRegistry()
	met := stage.NewMetrics(reg)
	p := newPipeline(b, dir, []int{1}, pipeOpts{maxBatch: 1, pace: 2 * rate, metrics: met})
	var one, two time.Duration
	for b.Loop() {
		c := whole.NewCache()
		t0 := time.Now()
		last := t0
		err := whole.Prefill(ctx, c, prompt, chunk, func(_, k int) error {
			time.Sleep(time.Until(last.Add(time.Duration(float64(k) / rate * float64(time.Second)))))
			last = time.Now()
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		one += time.Since(t0)
		c.Free()
		rc := p.ring.NewCache()
		t0 = time.Now()
		if err := p.ring.Prefill(ctx, rc, prompt, chunk, nil); err != nil {
			b.Fatal(err)
		}
		two += time.Since(t0)
		rc.Free()
	}
	b.ReportMetric(float64(n*b.N)/one.Seconds(), "one-stage-tok/s")
	b.ReportMetric(float64(n*b.N)/two.Seconds(), "two-stage-tok/s")
	b.ReportMetric(one.Seconds()/two.Seconds(), "speedup")
	b.ReportMetric(gauge(b, reg, "exo_stage_bubble_ratio", "1"), "stage1-bubble")
}

// gauge reads a stage's gauge from reg.
func gauge(b *testing.B, reg *prometheus.Registry, name, stage string) float64 {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// BenchmarkPipelineDecode: 8 concurrent greedy generations of 48 tokens
// over two rate-capped stages (each at R tokens/s: a step of k sequences
// takes k/R on each), the decode Server running one lane per stage (one
// lane's step on stage 1 while stage 0 computes the other's) against one
// lane (the whole batch through the stages in lockstep). Reported: both
// aggregate decode rates and their ratio (2 at most).
func BenchmarkPipelineDecode(b *testing.B) {
	dir := b.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 1, Layers: 2, MaxPositions: 4096}); err != nil {
		b.Fatal(err)
	}
	const streams, tokens, rate = 8, 48, 400.0
	rates := map[int]float64{}
	for _, lanes := range []int{1, 0} {
		p := newPipeline(b, dir, []int{1}, pipeOpts{maxBatch: streams, pace: rate, lanes: lanes})
		var total time.Duration
		for range b.N { // twice per run (b.Loop runs once)
			var wg sync.WaitGroup
			errs := make(chan error, streams)
			t0 := time.Now()
			for i := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := &gen.Request{PromptIDs: []int32{int32(1 + i), 2, 3}, MaxTokens: tokens, IgnoreEOS: true}
					var em emitter
					if _, err := p.srv.Generate(context.Background(), req, &em); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			total += time.Since(t0)
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
		rates[lanes] = float64(streams*tokens*b.N) / total.Seconds()
	}
	b.ReportMetric(rates[1], "lockstep-tok/s")
	b.ReportMetric(rates[0], "lanes-tok/s")
	b.ReportMetric(rates[0]/rates[1], "speedup")
}
