package prefill

import (
	"bytes"
	"context"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// TestProduceSlidingWindows: for a Gemma 3 (window 8, every third layer
// global) the header states the windows, each sliding layer ships only the
// window of token_end (byte-identical to a local prefill's), full layers
// ship everything, and the prefix cache counts a sliding layer at its ring's
// size, not the prompt's.
func TestProduceSlidingWindows(t *testing.T) {
	m := loadSpec(t, "gemma3", testmodel.Spec{Arch: "gemma3", Seed: 3, Layers: 3, MaxPositions: 1024})
	info := m.Info()
	prod, addr := serveProducer(t, Options{Name: "m", Model: m, Chunk: 32})
	ctx := context.Background()
	fp := kvwire.Fingerprint(m.Fingerprint())
	exp := &kvwire.Expect{Fingerprint: fp, Kinds: make([]kvwire.LayerKind, info.Layers), Windows: info.Windows, KVHeads: info.KVHeads, HeadDim: info.HeadDim}
	prompt := testmodel.Ramp(300, 7, 13, 400)
	sink := &collect{cache: m.NewCache(), received: make(chan struct{})}
	st, err := kvwire.NewClient(kvwire.ClientConfig{}).Fetch(ctx, addr,
		&kvwire.Request{ID: "a", Model: "m", Fingerprint: fp, Tokens: prompt}, exp, sink)
	if err != nil {
		t.Fatal(err)
	}
	end := len(prompt) - 1
	if sink.hdr.Window(0) != 8 || sink.hdr.Window(2) != 0 || sink.cache.Len() != end {
		t.Fatalf("header windows %v, cache %d", sink.hdr.Windows, sink.cache.Len())
	}
	perPos := int64(2 * info.KVHeads * info.HeadDim * info.CacheDType.Size())
	if want := (2*7 + int64(end)) * perPos; st.PayloadBytes != want {
		t.Fatalf("payload %d bytes, want %d (2 sliding layers × 7 positions + 1 full × %d)", st.PayloadBytes, want, end)
	}
	ref := testmodel.LocalPrefill(t, m, prompt[:end], 32)
	for layer, w := range info.Windows {
		from := engine.WindowStart(w, end)
		a, _, err1 := sink.cache.Export(layer, from, end-from)
		b, _, err2 := ref.Export(layer, from, end-from)
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Fatalf("layer %d [%d, %d): %v %v", layer, from, end, err1, err2)
		}
	}
	_, used := prod.CacheStats()
	held := int64(2*engine.SlidingHeldMax(8, 32) + end)
	if used != held*perPos || used >= int64(3*end)*perPos {
		t.Fatalf("prefix cache counts %d bytes, want %d (%d positions)", used, held*perPos, held)
	}
}
