package decode_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// BenchmarkHeadFill: the decode side's cost of a head-split fill (a
// tensor-parallel prefill's pieces, assembled head by head) against one
// stream of every head, for the same KV: a 1024-token prompt of an f32
// model shaped 8 layers × 4 KV heads × 64 (16 MiB of KV per fill), warm
// in the prefix caches of whole prefill runners over loopback, so that
// only the transfers and the injection differ. "pieces-N": N head-range
// requests at once (ADDR#H0:H1), one per runner, assembled.
func BenchmarkHeadFill(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 3, Layers: 8, Hidden: 512, Heads: 8, KVHeads: 4, HeadDim: 64, MaxPositions: 2048}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, cpu.New(2), engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	prompt := make([]int32, 1025)
	for i := range prompt {
		prompt[i] = int32(7 + i*31%500)
	}
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	c := m.NewCache()
	defer c.Free()
	// One prefill runner per piece, as a tensor prefill group has one per
	// rank (one runner would serve the pieces of one prompt from one
	// computation's goroutine), each with the prompt in its prefix cache.
	addrs := make([]string, 4)
	for i := range addrs {
		prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 256})
		b.Cleanup(prod.Close)
		addrs[i] = kvwiretest.Serve(b, ctx, prod)
		warm := &decode.KVRemote{Client: cl, Name: "m", Model: m, Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: addrs[i]}})}
		c.Truncate(0)
		if _, err := warm.Prefill(ctx, "warm", prompt, 0, c, nil); err != nil {
			b.Fatal(err)
		}
	}
	one := &decode.KVRemote{Client: cl, Name: "m", Model: m, Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: addrs[0]}})}
	pieces := func(n int) *decode.KVRemote {
		var list []string
		for i := range n {
			list = append(list, fmt.Sprintf("%s#%d:%d", addrs[i], i*4/n, (i+1)*4/n))
		}
		_, parts, err := decode.ParsePrefillEndpoints(list)
		if err != nil {
			b.Fatal(err)
		}
		return &decode.KVRemote{Client: cl, Name: "m", Model: m, Parts: parts}
	}
	for _, bc := range []struct {
		name string
		r    *decode.KVRemote
	}{{"one-stream", one}, {"pieces-2", pieces(2)}, {"pieces-4", pieces(4)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var bytes int64
			for b.Loop() {
				c.Truncate(0)
				st, err := bc.r.Prefill(ctx, "bench", prompt, 0, c, nil)
				if err != nil {
					b.Fatal(err)
				}
				bytes = st.Bytes
			}
			b.SetBytes(bytes)
			if !strings.Contains(bc.name, "one") && c.Len() != len(prompt)-1 {
				b.Fatalf("cache holds %d", c.Len())
			}
		})
	}
}
