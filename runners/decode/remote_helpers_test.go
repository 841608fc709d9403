package decode

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// The remote-prefill tests' shared setup: a real prefill producer behind a
// real KV wire server on loopback TCP, and a KVRemote fetching from it.

// loadReference loads one of the engine's mlx-lm-checked tiny models
// (engine/testdata/reference/name) on its own cpu backend; it is closed
// when the test ends, after what the test set up later (servePrefill).
func loadReference(t *testing.T, name string, o engine.LoadOptions) *engine.Model {
	t.Helper()
	m, err := engine.Load(context.Background(), filepath.Join("..", "engine", "testdata", "reference", name), cpu.New(2), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// servePrefill serves m's prefill (chunks of chunk tokens, metrics to met;
// nil: a fresh registry) over the KV wire on a loopback TCP port until the
// test ends, and returns the address. Close m no earlier (t.Cleanup or
// loadReference, not a defer in the test).
func servePrefill(t testing.TB, m *engine.Model, chunk int, met *metrics.Runner) string {
	t.Helper()
	if met == nil {
		met = metrics.New("prefill")
	}
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: chunk, Metrics: met})
	t.Cleanup(prod.Close)
	return kvwiretest.Serve(t, context.Background(), prod)
}

// loopbackRemote is a KVRemote for model "m" fetching into m from the one
// endpoint addr over a loopback link.
func loopbackRemote(m *engine.Model, addr string) *KVRemote {
	return &KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m,
		Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: addr, Link: kvwire.LinkLoopback}})}
}

// greedyAfter feeds last to m on c and returns the 12 greedy tokens that
// follow (each fed back in turn).
func greedyAfter(t *testing.T, m *engine.Model, c engine.KVCache, last int32) []int32 {
	t.Helper()
	var out []int32
	for range 12 {
		lg, err := m.Forward(context.Background(), c, []int32{last})
		if err != nil {
			t.Fatal(err)
		}
		last = int32(argmax(lg))
		out = append(out, last)
	}
	return out
}

// argmax is the index of v's largest value (the first, on a tie).
func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
