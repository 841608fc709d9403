package prefill

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loader
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func tinyModel(t *testing.T) *engine.Model {
	t.Helper()
	return loadSpec(t, "tiny", testmodel.Spec{Arch: "qwen2", Seed: 3, MaxPositions: 1024})
}

// loadSpec writes the test model of spec (named name) and loads it whole on
// its own cpu backend; it is closed when the test ends, after what the
// test set up later (serveProducer).
func loadSpec(t *testing.T, name string, spec testmodel.Spec) *engine.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, cpu.New(2), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// serveProducer serves a producer of o over the KV wire on a loopback TCP
// port until the test ends (then closes it, before the model's own
// cleanup) and returns it and the address.
func serveProducer(t *testing.T, o Options) (*Producer, string) {
	t.Helper()
	prod := New(o)
	t.Cleanup(prod.Close)
	return prod, kvwiretest.Serve(t, context.Background(), prod)
}

// gated makes the model wait, after its first chunk, until the client has
// received KV: if the server held KV back until the prefill finished, the
// test would deadlock instead of passing.
type gated struct {
	*engine.Model
	received chan struct{}
}

func (g *gated) Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error {
	first := true
	return g.Model.Prefill(ctx, c, tokens, chunk, func(s, n int) error {
		if err := onChunk(s, n); err != nil {
			return err
		}
		if first {
			first = false
			select {
			case <-g.received:
			case <-time.After(60 * time.Second):
				return errors.New("the client never saw the first chunk while prefill was running: no streaming")
			}
		}
		return nil
	})
}

// collect imports a stream into a cache like the decode runner's sink.
type collect struct {
	cache    engine.KVCache
	start    int
	once     sync.Once
	received chan struct{}
	hdr      kvwire.Header
}

func (c *collect) Begin(h *kvwire.Header) error { c.hdr = *h; return nil }
func (c *collect) Chunk(l, s, n int, k, v []byte) error {
	c.once.Do(func() { close(c.received) })
	return c.cache.Import(l, s, n, k, v)
}
func (c *collect) State(int, int, [][]byte) error { return errors.New("no state expected") }
func (c *collect) Done(t kvwire.Totals) error     { return c.cache.Commit(t.TokenEnd) }
func (c *collect) Rollback()                      { c.cache.Truncate(c.start) }

func TestProduceStreamsWhileComputingAndCaches(t *testing.T) {
	m := tinyModel(t)
	received := make(chan struct{})
	met := metrics.New("prefill")
	_, addr := serveProducer(t, Options{Name: "m", Model: &gated{Model: m, received: received}, Chunk: 32, Metrics: met})
	ctx := context.Background()
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	fp := kvwire.Fingerprint(m.Fingerprint())
	info := m.Info()
	exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, info.Layers), KVHeads: info.KVHeads, HeadDim: info.HeadDim}

	prompt := testmodel.Ramp(150, 7, 13, 400)
	// Prefix probes (PROTOCOL.md §18) answer what a Produce would reuse,
	// without computing: nothing before the first request, 149 after it.
	probe := func(model string, toks []int32) (int, error) {
		return cl.PrefixHit(ctx, addr, &kvwire.Request{ID: "p", Model: model, Fingerprint: fp, Tokens: toks})
	}
	if n, err := probe("m", prompt); n != 0 || err != nil {
		t.Fatalf("probe before any request: %d, %v", n, err)
	}
	sink := &collect{cache: m.NewCache(), received: received}
	if _, err := cl.Fetch(ctx, addr, &kvwire.Request{ID: "a", Model: "m", Fingerprint: fp, Tokens: prompt}, exp, sink); err != nil {
		t.Fatal(err)
	}
	if sink.cache.Len() != len(prompt)-1 || sink.hdr.TokenEnd != len(prompt)-1 {
		t.Fatalf("received %d tokens (header end %d), want N-1 = %d", sink.cache.Len(), sink.hdr.TokenEnd, len(prompt)-1)
	}
	// The shipped KV is what a local prefill computes, bit for bit.
	ref := testmodel.LocalPrefill(t, m, prompt[:len(prompt)-1], 32)
	same := func(a, b engine.KVCache, from, n int) {
		t.Helper()
		for layer := range info.Layers {
			ak, av, err1 := a.Export(layer, from, n)
			bk, bv, err2 := b.Export(layer, from, n)
			if err1 != nil || err2 != nil || !bytes.Equal(ak, bk) || !bytes.Equal(av, bv) {
				t.Fatalf("layer %d [%d,+%d): KV differs (%v %v)", layer, from, n, err1, err2)
			}
		}
	}
	same(sink.cache, ref, 0, len(prompt)-1)
	ext0 := append(append([]int32(nil), prompt...), 5, 6, 7)
	if n, err := probe("m", ext0); n != len(prompt)-1 || err != nil {
		t.Fatalf("probe of the extended prompt: %d, %v; want %d", n, err, len(prompt)-1)
	}
	if n, err := probe("m", append([]int32{prompt[0] + 1}, prompt[1:]...)); n != 0 || err != nil {
		t.Fatalf("probe of another prompt: %d, %v; want 0", n, err)
	}
	if _, err := probe("other", prompt); !errors.Is(err, kvwire.ErrMismatch) {
		t.Fatalf("probe for another model: %v, want ErrMismatch", err)
	}

	// An extended prompt with start_pos: the prefill side reuses its cached
	// 149 tokens, computes only the new ones and ships only from start_pos.
	ext := append(append([]int32(nil), prompt...), 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
	computed := counter(met.PrefillTokens.WithLabelValues("prefill"))
	sink2 := &collect{cache: sink.cache, start: sink.cache.Len(), received: make(chan struct{})}
	if _, err := cl.Fetch(ctx, addr, &kvwire.Request{ID: "b", Model: "m", Fingerprint: fp, Tokens: ext, StartPos: sink.cache.Len()}, exp, sink2); err != nil {
		t.Fatal(err)
	}
	if sink2.hdr.TokenStart != len(prompt)-1 || sink2.cache.Len() != len(ext)-1 {
		t.Fatalf("second stream [%d,%d), cache %d", sink2.hdr.TokenStart, sink2.hdr.TokenEnd, sink2.cache.Len())
	}
	if hit := counter(met.PrefixHit.WithLabelValues("prefill")); hit != float64(len(prompt)-1) {
		t.Fatalf("prefix hit tokens %v, want %d", hit, len(prompt)-1)
	}
	if d := counter(met.PrefillTokens.WithLabelValues("prefill")) - computed; d != float64(len(ext)-len(prompt)) {
		t.Fatalf("computed %v tokens for the extension, want %d", d, len(ext)-len(prompt))
	}
	ref2 := testmodel.LocalPrefill(t, m, ext[:len(ext)-1], 32)
	same(sink2.cache, ref2, 0, len(ext)-1)

	// Requests for another model name or fingerprint are a mismatch.
	for _, req := range []*kvwire.Request{
		{ID: "c", Model: "other", Tokens: prompt},
		{ID: "d", Model: "m", Tokens: prompt, Fingerprint: kvwire.Fingerprint{1}},
	} {
		s := &collect{cache: m.NewCache(), received: make(chan struct{})}
		if _, err := cl.Fetch(ctx, addr, req, nil, s); !errors.Is(err, kvwire.ErrMismatch) {
			t.Fatalf("%s: %v, want ErrMismatch", req.ID, err)
		}
	}
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
