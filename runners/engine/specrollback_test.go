package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// cacheBytes is what a cache of n positions can still be asked for: every
// recurrent layer's state, and each attention layer's K and V over the
// window the next position sees (every position for a full layer).
func cacheBytes(t *testing.T, info engine.ModelInfo, c engine.KVCache) [][]byte {
	t.Helper()
	n := c.Len()
	rs, _ := c.(engine.RecurrentState)
	var out [][]byte
	for layer := range info.Layers {
		if rs != nil && rs.Recurrent(layer) {
			st, err := rs.ExportState(layer)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, st...)
			continue
		}
		w := 0
		if info.Windows != nil {
			w = info.Windows[layer]
		}
		from := engine.WindowStart(w, n+1)
		k, v, err := c.Export(layer, from, n-from)
		if err != nil {
			t.Fatalf("layer %d [%d, %d): %v", layer, from, n, err)
		}
		out = append(out, k, v)
	}
	return out
}

func floatBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// TestSpeculativeRollbackEqualsRecompute: a speculative decoder's cache —
// each round one forward of the history's missing tokens, a token and up to
// six drafts, then truncated past the rejected drafts (a hybrid cache goes
// back to where the forward began; its kept tokens are fed again with the
// next round's forward) — holds, after many rounds over a prompt longer
// than the sliding windows and their slack, byte for byte on cpu what a
// cache that ran the same forwards without the rejected drafts holds
// (sliding layers' windows, full layers' K/V, Gated DeltaNet states), and
// gives the same logits for the next token. A sliding layer can always go
// back to any position the last forward reached.
func TestSpeculativeRollbackEqualsRecompute(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type model struct {
		name string
		dir  func(t *testing.T) string
	}
	for _, mc := range []model{
		{"gemma3", gen(testmodel.Spec{Arch: "gemma3", Seed: 3, Layers: 3})},
		{"gptoss", gen(testmodel.Spec{Arch: "gptoss", Seed: 3})},
		{"mistral", gen(testmodel.Spec{Arch: "mistral", Seed: 3, SlidingWindow: 8})},
		{"llama", gen(testmodel.Spec{Arch: "llama", Seed: 3})},
		{"qwen3_next", ref("qwen3_next")},
		{"qwen3_5", ref("qwen3_5")},
		{"qwen3_5_moe", ref("qwen3_5_moe")},
	} {
		t.Run(mc.name, func(t *testing.T) {
			m, err := engine.Load(ctx, mc.dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			info := m.Info()
			vocab := min(info.Vocab, 500)
			rng := rand.New(rand.NewPCG(5, 7))
			tok := func() int32 { return int32(10 + rng.IntN(vocab-10)) }
			var hist []int32
			for range 70 {
				hist = append(hist, tok())
			}
			spec, re := m.NewCache(), m.NewCache()
			defer spec.Free()
			defer re.Free()
			for _, c := range []engine.KVCache{spec, re} {
				if _, err := m.Forward(ctx, c, hist); err != nil {
					t.Fatal(err)
				}
			}
			rejected := 0
			for round := range 60 {
				pre := append([]int32(nil), hist[spec.Len():]...)
				feed := append(append(pre, tok()), make([]int32, 1+rng.IntN(6))...)
				for i := len(pre) + 1; i < len(feed); i++ {
					feed[i] = tok()
				}
				start := spec.Len()
				if _, err := m.ForwardAllInto(ctx, spec, feed, nil); err != nil {
					t.Fatal(err)
				}
				drafts := len(feed) - len(pre) - 1
				keep := len(pre) + 1 + rng.IntN(drafts+1) // the token and the accepted drafts
				if round%7 == 0 {
					keep = len(feed) // every draft accepted
				}
				rejected += len(feed) - keep
				hist = append(hist, feed[len(pre):keep]...)
				if !spec.CanTruncate(start + keep) {
					t.Fatalf("round %d: cannot go back to %d after a forward from %d to %d", round, start+keep, start, spec.Len())
				}
				spec.Truncate(start + keep)
				got := spec.Len()
				if got != start+keep && !(info.Recurrent != nil && got == start) {
					t.Fatalf("round %d: truncated to %d, want %d (or %d, where the forward began, for a hybrid cache)", round, got, start+keep, start)
				}
				// The recomputation runs what the speculative cache kept of
				// this forward.
				if kept := got - start; kept > 0 {
					if _, err := m.Forward(ctx, re, feed[:kept]); err != nil {
						t.Fatal(err)
					}
				}
				if spec.Len() != re.Len() {
					t.Fatalf("round %d: %d positions, recomputed %d", round, spec.Len(), re.Len())
				}
				want := cacheBytes(t, info, re)
				for i, g := range cacheBytes(t, info, spec) {
					if !bytes.Equal(g, want[i]) {
						t.Fatalf("round %d: cache array %d differs from the recomputation", round, i)
					}
				}
			}
			if rejected == 0 {
				t.Fatal("no draft rejected")
			}
			// Both feed what the hybrid cache lacks and one more token.
			last := append(append([]int32(nil), hist[spec.Len():]...), tok())
			ls, err := m.Forward(ctx, spec, last)
			if err != nil {
				t.Fatal(err)
			}
			ls = append([]float32(nil), ls...)
			lr, err := m.Forward(ctx, re, last)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(floatBytes(ls), floatBytes(lr)) {
				t.Fatal(fmt.Sprintf("next-token logits differ after %d rejected drafts", rejected))
			}
		})
	}
}
