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

// layerSink keeps each chunk by stream layer.
type layerSink struct {
	hdr    kvwire.Header
	chunks map[int][]rangeChunk
}

type rangeChunk struct {
	start, n int
	k, v     []byte
}

func (s *layerSink) Begin(h *kvwire.Header) error {
	s.hdr, s.chunks = *h, map[int][]rangeChunk{}
	return nil
}
func (s *layerSink) Chunk(l, start, n int, k, v []byte) error {
	s.chunks[l] = append(s.chunks[l], rangeChunk{start, n, bytes.Clone(k), bytes.Clone(v)})
	return nil
}
func (s *layerSink) State(int, int, [][]byte) error { return errors.New("no state expected") }
func (s *layerSink) Done(kvwire.Totals) error       { return nil }
func (s *layerSink) Rollback()                      {}

// TestProduceLayerRange: a request for layers [a, b) is answered from the
// whole model with a header for those layers (first layer a) and exactly
// the KV of the model's layers a…b−1 (bit for bit what a local prefill
// computes), nothing of the others; a second range of the same prompt is
// served from the prefix cache without computing; a range beyond the
// model is a mismatch, for requests and prefix probes alike.
func TestProduceLayerRange(t *testing.T) {
	m := loadSpec(t, "tiny3", testmodel.Spec{Arch: "qwen2", Seed: 5, Layers: 3, MaxPositions: 1024})
	met := metrics.New("prefill")
	_, addr := serveProducer(t, Options{Name: "m", Model: m, Chunk: 16, CacheBlock: 16, Metrics: met})
	ctx := context.Background()
	cl := kvwire.NewClient(kvwire.ClientConfig{})
	info := m.Info()
	fp := kvwire.Fingerprint(m.Fingerprint())
	prompt := testmodel.Ramp(61, 11, 29, 450)
	const start = 7
	ref := testmodel.LocalPrefill(t, m, prompt[:len(prompt)-1], 16)
	n := len(prompt) - 1 - start
	var computed float64
	for i, r := range [][2]int{{1, 3}, {0, 1}, {2, 3}} {
		sink := &layerSink{}
		req := &kvwire.Request{ID: fmt.Sprint(r), Model: "m", Fingerprint: fp, Tokens: prompt, StartPos: start, LayerStart: r[0], LayerEnd: r[1]}
		exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, r[1]-r[0]), KVHeads: info.KVHeads, HeadDim: info.HeadDim}
		st, err := cl.Fetch(ctx, addr, req, exp, sink)
		if err != nil {
			t.Fatalf("layers %v: %v", r, err)
		}
		if sink.hdr.FirstLayer != r[0] || sink.hdr.Layers() != r[1]-r[0] || len(sink.chunks) != r[1]-r[0] {
			t.Fatalf("layers %v: header from %d, %d layers; chunks for %d layers", r, sink.hdr.FirstLayer, sink.hdr.Layers(), len(sink.chunks))
		}
		var want int64
		for l := r[0]; l < r[1]; l++ {
			k, v, err := ref.Export(l, start, n)
			if err != nil {
				t.Fatal(err)
			}
			want += int64(len(k) + len(v))
			next := start
			for _, c := range sink.chunks[l-r[0]] {
				k, v, err := ref.Export(l, c.start, c.n)
				if err != nil || c.start != next || !bytes.Equal(c.k, k) || !bytes.Equal(c.v, v) {
					t.Fatalf("layers %v: stream layer %d [%d,+%d) differs from the model's layer %d (%v)", r, l-r[0], c.start, c.n, l, err)
				}
				next += c.n
			}
			if next != len(prompt)-1 {
				t.Fatalf("layers %v: stream layer %d ends at %d", r, l-r[0], next)
			}
		}
		if st.PayloadBytes != want {
			t.Fatalf("layers %v: %d payload bytes, the range's share is %d", r, st.PayloadBytes, want)
		}
		// The first range computes the prompt; later ones (any range) take
		// it from the prefix cache.
		c := counter(met.PrefillTokens.WithLabelValues("prefill"))
		if i > 0 && c != computed {
			t.Fatalf("layers %v: computed %v more tokens; the prefix cache holds the prompt", r, c-computed)
		}
		computed = c
	}
	beyond := &kvwire.Request{ID: "beyond", Model: "m", Fingerprint: fp, Tokens: prompt, LayerStart: 2, LayerEnd: 4}
	if _, err := cl.Fetch(ctx, addr, beyond, nil, &layerSink{}); !errors.Is(err, kvwire.ErrMismatch) {
		t.Fatalf("range beyond the model: %v", err)
	}
	if _, err := cl.PrefixHit(ctx, addr, beyond); !errors.Is(err, kvwire.ErrMismatch) {
		t.Fatalf("prefix probe with a range beyond the model: %v", err)
	}
	beyond.LayerEnd = 3
	if held, err := cl.PrefixHit(ctx, addr, beyond); err != nil || held != len(prompt)-1 {
		t.Fatalf("prefix probe with a range: %d, %v; want %d", held, err, len(prompt)-1)
	}
}
