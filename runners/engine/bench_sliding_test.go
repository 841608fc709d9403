package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// BenchmarkSlidingDecode: one decode step at a 4,096-token context of a
// tiny Mistral (2 layers, 4 heads × 32, f32) whose layers slide over 128
// positions, against the same weights with full attention, on the cpu
// backend, in one run: the ring keeps the step's attention (and the cache)
// at the window, the full model's grows with the context.
func BenchmarkSlidingDecode(b *testing.B) {
	for _, window := range []int{0, 128} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			dir := b.TempDir()
			spec := testmodel.Spec{Arch: "mistral", Seed: 3, MaxPositions: 8192, SlidingWindow: window}
			if err := testmodel.Write(dir, spec); err != nil {
				b.Fatal(err)
			}
			m := loadDir(b, dir)
			ctx := context.Background()
			p := make([]int32, 4096)
			for i := range p {
				p[i] = int32((i*37 + 11) % 500)
			}
			c := m.NewCache()
			if err := m.Prefill(ctx, c, p, 0, nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := m.Forward(ctx, c, []int32{7}); err != nil {
					b.Fatal(err)
				}
				c.Truncate(4096) // every step at the same context
			}
			reportTokens(b, b.N, cpu0)
		})
	}
}

func loadDir(b *testing.B, dir string) *engine.Model {
	b.Helper()
	be, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, be, engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}
