package prefill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// TestProduceHeadRange: a request for KV heads [a, b) (a tensor-parallel
// rank's, PROTOCOL.md §20) is answered with a header for those heads
// (first head a) and, for every layer, exactly the heads a…b−1 of what a
// local prefill computes, in native and FP8 wire dtypes, with a layer
// range too; a range beyond the model's heads is a mismatch.
func TestProduceHeadRange(t *testing.T) {
	m := loadSpec(t, "tiny", testmodel.Spec{Arch: "llama", Seed: 5, Layers: 2, Heads: 8, KVHeads: 4, HeadDim: 16, MaxPositions: 1024})
	_, addr := serveProducer(t, Options{Name: "m", Model: m, Chunk: 16, CacheBlock: 16, Metrics: metrics.New("prefill")})
	ctx := context.Background()
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	info := m.Info()
	fp := kvwire.Fingerprint(m.Fingerprint())
	prompt := testmodel.Ramp(45, 7, 31, 400)
	const start = 5
	ref := testmodel.LocalPrefill(t, m, prompt[:len(prompt)-1], 16)
	for _, c := range []struct {
		h      [2]int
		layers [2]int
		fp8    bool
	}{{[2]int{0, 2}, [2]int{}, false}, {[2]int{2, 4}, [2]int{}, false}, {[2]int{1, 2}, [2]int{1, 2}, false}, {[2]int{3, 4}, [2]int{}, true}} {
		req := &kvwire.Request{ID: fmt.Sprint(c.h), Model: "m", Fingerprint: fp, Tokens: prompt, StartPos: start,
			HeadStart: c.h[0], HeadEnd: c.h[1], LayerStart: c.layers[0], LayerEnd: c.layers[1]}
		l0, l1 := c.layers[0], c.layers[1]
		if l1 == 0 {
			l1 = info.Layers
		}
		if c.fp8 {
			req.DType = kvwire.DTypeF8E4M3
		}
		heads := c.h[1] - c.h[0]
		exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, l1-l0), KVHeads: heads, HeadDim: info.HeadDim}
		sink := &layerSink{}
		if _, err := cl.Fetch(ctx, addr, req, exp, sink); err != nil {
			t.Fatalf("heads %v: %v", c.h, err)
		}
		if sink.hdr.FirstHead != c.h[0] || sink.hdr.KVHeads != heads || len(sink.chunks) != l1-l0 {
			t.Fatalf("heads %v: header heads [%d,+%d), chunks for %d layers", c.h, sink.hdr.FirstHead, sink.hdr.KVHeads, len(sink.chunks))
		}
		for l := l0; l < l1; l++ {
			next := start
			for _, ch := range sink.chunks[l-l0] {
				k, v, err := ref.Export(l, ch.start, ch.n)
				if err != nil {
					t.Fatal(err)
				}
				per := len(k) / info.KVHeads
				wk, wv := k[c.h[0]*per:c.h[1]*per], v[c.h[0]*per:c.h[1]*per]
				if c.fp8 {
					// FP8 is lossy: the sizes say it carried the range's heads.
					if len(ch.k) != kvwire.FP8Len(heads, heads*ch.n*info.HeadDim) {
						t.Fatalf("heads %v fp8: %d bytes for %d heads × %d tokens", c.h, len(ch.k), heads, ch.n)
					}
				} else if !bytes.Equal(ch.k, wk) || !bytes.Equal(ch.v, wv) {
					t.Fatalf("heads %v: layer %d [%d,+%d) differs from the model's heads", c.h, l, ch.start, ch.n)
				}
				next = ch.start + ch.n
			}
			if next != len(prompt)-1 {
				t.Fatalf("heads %v: layer %d ends at %d", c.h, l, next)
			}
		}
	}
	beyond := &kvwire.Request{ID: "beyond", Model: "m", Fingerprint: fp, Tokens: prompt, HeadStart: 2, HeadEnd: 5}
	if _, err := cl.Fetch(ctx, addr, beyond, nil, &layerSink{}); !errors.Is(err, kvwire.ErrMismatch) {
		t.Fatalf("heads beyond the model: %v", err)
	}
}
