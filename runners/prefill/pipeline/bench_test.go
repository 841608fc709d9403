package pipeline

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// paced caps a model's prefill at rate tokens/s (a simulated host: each
// chunk takes at least n/rate, computing included), for StageForward and
// for Prefill's chunks alike.
type paced struct {
	*engine.Model
	rate float64
}

func (p paced) wait(t0 time.Time, n int) {
	time.Sleep(time.Until(t0.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))))
}

func (p paced) StageForward(ctx context.Context, c engine.KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	t0 := time.Now()
	out, err := p.Model.StageForward(ctx, c, tokens, hidden)
	p.wait(t0, len(tokens))
	return out, err
}

func (p paced) Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error {
	t0 := time.Now()
	return p.Model.Prefill(ctx, c, tokens, chunk, func(s, n int) error {
		p.wait(t0, n)
		t0 = time.Now()
		if onChunk != nil {
			return onChunk(s, n)
		}
		return nil
	})
}

// BenchmarkPrefillPipeline: an 8192-token prompt's KV (every layer, no
// prefix cache) from one prefill runner capped at R tokens/s against two
// prefill stages each holding half the layers and so capped at 2R (the
// same hardware per layer), both stages asked at once as a decode side
// does; tokens/s of each, and the ratio. R is 300 tokens/s: slower than
// this tiny model computes on a loaded 2-core machine, so the cap, not the
// machine, sets the rate (as the routing tests' simulated hosts do).
func BenchmarkPrefillPipeline(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "llama")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 3, Layers: 4, MaxPositions: 16384}); err != nil {
		b.Fatal(err)
	}
	const R = 300.0
	const N = 8192
	prompt := func(i int) []int32 {
		p := make([]int32, N+1)
		for j := range p {
			p[j] = int32(1 + (j*37+i*11)%450)
		}
		return p
	}
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	load := func(r engine.LayerRange) *engine.Model {
		m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{Layers: r})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m
	}
	serve := func(prod *prefill.Producer) string { return kvwiretest.Serve(b, context.Background(), prod) }
	fetch := func(addr string, p []int32, a, c int, id string) {
		req := &kvwire.Request{ID: id, Model: "m", Tokens: p, LayerStart: a, LayerEnd: c}
		if _, err := cl.Fetch(context.Background(), addr, req, nil, &sink{}); err != nil {
			b.Error(err)
		}
	}
	var oneRate float64
	b.Run("one", func(b *testing.B) {
		m := paced{load(engine.LayerRange{}), R}
		prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 256, CacheBytes: -1})
		b.Cleanup(prod.Close)
		addr := serve(prod)
		t0 := time.Now()
		for i := range b.N {
			fetch(addr, prompt(i), 0, 0, fmt.Sprint("one", i))
		}
		oneRate = float64(N*b.N) / time.Since(t0).Seconds()
		b.ReportMetric(oneRate, "tokens/s")
	})
	b.Run("two-stages", func(b *testing.B) {
		ls := make([]net.Listener, 2)
		for i := range ls {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ls[i] = l
		}
		var addrs []string
		var pipes []*Pipe
		for i, r := range []engine.LayerRange{{Start: 0, End: 2}, {Start: 2, End: 4}} {
			m := paced{load(r), 2 * R}
			prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 256, CacheBytes: -1, Stage: r})
			b.Cleanup(prod.Close)
			pp, err := NewPipe(prod, m, PipeConfig{Stage: i, Stages: 2, Listener: ls[i], Next: ls[1-i].Addr().String()})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			b.Cleanup(cancel)
			go pp.Run(ctx)
			addrs = append(addrs, serve(prod))
			pipes = append(pipes, pp)
		}
		for _, pp := range pipes {
			testutil.Eventually(b, pp.Up, 30*time.Second, "links up")
		}
		b.ResetTimer()
		t0 := time.Now()
		for i := range b.N {
			p := prompt(i)
			var wg sync.WaitGroup
			for s, r := range [][2]int{{0, 2}, {2, 4}} {
				wg.Add(1)
				go func() { defer wg.Done(); fetch(addrs[s], p, r[0], r[1], fmt.Sprint("two", i)) }()
			}
			wg.Wait()
		}
		rate := float64(N*b.N) / time.Since(t0).Seconds()
		b.ReportMetric(rate, "tokens/s")
		if oneRate > 0 {
			b.ReportMetric(rate/oneRate, "x_one_stage")
		}
	})
}
