package prefill

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// holdAfterFirst makes the model wait, after its first chunk, until
// release is closed, then fail with fail when set.
type holdAfterFirst struct {
	*engine.Model
	release chan struct{}
	fail    error
}

func (h *holdAfterFirst) Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error {
	first := true
	return h.Model.Prefill(ctx, c, tokens, chunk, func(s, n int) error {
		if err := onChunk(s, n); err != nil {
			return err
		}
		if first {
			first = false
			select {
			case <-h.release:
			case <-time.After(60 * time.Second):
				return errors.New("the second stage's request never began while the first was computing: it did not follow")
			}
			if h.fail != nil {
				return h.fail
			}
		}
		return nil
	})
}

// signalSink is a layerSink that closes begun at Begin and chunked at its
// first chunk.
type signalSink struct {
	layerSink
	begun, chunked chan struct{}
	once1, once2   sync.Once
}

func (s *signalSink) Begin(h *kvwire.Header) error {
	s.once1.Do(func() { close(s.begun) })
	return s.layerSink.Begin(h)
}

func (s *signalSink) Chunk(l, start, n int, k, v []byte) error {
	s.once2.Do(func() { close(s.chunked) })
	return s.layerSink.Chunk(l, start, n, k, v)
}

func newSignalSink() *signalSink {
	return &signalSink{begun: make(chan struct{}), chunked: make(chan struct{})}
}

// TestRangeRequestsFollowOneComputation: while one stage's request for a
// prompt computes (the server admits one request at a time), another
// stage's request for the same prompt and other layers does not wait for
// admission: it follows the computation (its header arrives while the
// first is held after its first chunk; waiting for admission it would
// not, and the held model would time out). It gets exactly its layers'
// KV, bit for bit what a local prefill computes, and the prompt is
// computed once. When the computation fails, the follower fails too
// (ErrRemoteInternal), and its decode stage falls back.
func TestRangeRequestsFollowOneComputation(t *testing.T) {
	m := loadSpec(t, "tiny3", testmodel.Spec{Arch: "qwen2", Seed: 7, Layers: 3, MaxPositions: 1024})
	ctx := context.Background()
	info := m.Info()
	fp := kvwire.Fingerprint(m.Fingerprint())
	prompt := testmodel.Ramp(61, 13, 31, 450)
	ref := testmodel.LocalPrefill(t, m, prompt[:len(prompt)-1], 16)

	for _, fail := range []error{nil, errors.New("the device went away")} {
		held := &holdAfterFirst{Model: m, release: make(chan struct{}), fail: fail}
		met := metrics.New("prefill")
		_, addr := serveProducer(t, Options{Name: "m", Model: held, Chunk: 16, CacheBytes: -1, Metrics: met})
		cl := kvwire.NewClient(kvwire.ClientConfig{})
		fetch := func(a, b int, sink kvwire.Sink) chan error {
			done := make(chan error, 1)
			go func() {
				req := &kvwire.Request{ID: "stage", Model: "m", Fingerprint: fp, Tokens: prompt, LayerStart: a, LayerEnd: b}
				exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, b-a), KVHeads: info.KVHeads, HeadDim: info.HeadDim}
				_, err := cl.Fetch(ctx, addr, req, exp, sink)
				done <- err
			}()
			return done
		}
		first, second := newSignalSink(), newSignalSink()
		firstDone := fetch(0, 1, first)
		<-first.chunked // the first request is computing (held after its first chunk)
		secondDone := fetch(1, 3, second)
		select {
		case <-second.begun:
			close(held.release)
		case err := <-secondDone:
			t.Fatalf("second stage's request ended before its header: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("the second stage's request never began while the first was computing")
		}
		err1, err2 := <-firstDone, <-secondDone
		if fail != nil {
			if err1 == nil || !errors.Is(err2, kvwire.ErrRemoteInternal) {
				t.Fatalf("computation failed: first %v, second %v; want both to fail, the second with ErrRemoteInternal", err1, err2)
			}
			continue
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("first %v, second %v", err1, err2)
		}
		for _, s := range []struct {
			sink *signalSink
			a, b int
		}{{first, 0, 1}, {second, 1, 3}} {
			if s.sink.hdr.FirstLayer != s.a || len(s.sink.chunks) != s.b-s.a {
				t.Fatalf("layers [%d, %d): header from %d, chunks for %d layers", s.a, s.b, s.sink.hdr.FirstLayer, len(s.sink.chunks))
			}
			for l := s.a; l < s.b; l++ {
				next := 0
				for _, c := range s.sink.chunks[l-s.a] {
					k, v, err := ref.Export(l, c.start, c.n)
					if err != nil || c.start != next || !bytes.Equal(c.k, k) || !bytes.Equal(c.v, v) {
						t.Fatalf("layer %d [%d,+%d) differs from a local prefill's (%v)", l, c.start, c.n, err)
					}
					next += c.n
				}
				if next != len(prompt)-1 {
					t.Fatalf("layer %d ends at %d", l, next)
				}
			}
		}
		if c := counter(met.PrefillTokens.WithLabelValues("prefill")); c != float64(len(prompt)-1) {
			t.Fatalf("computed %v tokens for two stages' requests, want the prompt once (%d)", c, len(prompt)-1)
		}
	}
}
