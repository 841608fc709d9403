package engine_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

const tWindow = 8

// slidingPrompt is 5 windows long.
func slidingPrompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*37 + 11) % tV)
	}
	return p
}

func slidingSpecs() []tinySpec {
	return []tinySpec{
		{arch: "MistralForCausalLM", dt: engine.F32, window: tWindow},
		{arch: "MistralForCausalLM", dt: engine.BF16, window: tWindow},
		{arch: "MistralForCausalLM", dt: engine.BF16, bits: 4, gs: 32, window: tWindow},
	}
}

// TestSlidingWindowMatchesReference: the engine's windowed model agrees
// with the float64 reference that masks keys older than the window, and
// that reference differs clearly from full attention on this prompt (so
// the window is really applied).
func TestSlidingWindowMatchesReference(t *testing.T) {
	spec := tinySpec{arch: "MistralForCausalLM", dt: engine.F32, window: tWindow}
	src := newTiny(t, spec, 7)
	m := load(t, src, engine.LoadOptions{})
	if w := m.Info().Windows; len(w) != tLayers || w[0] != tWindow {
		t.Fatalf("Info().Windows = %v", w)
	}
	identity := func(v float64) float64 { return v }
	for _, n := range []int{tWindow - 1, tWindow, tWindow + 1, 5 * tWindow} {
		p := slidingPrompt(n)
		got, err := m.Forward(context.Background(), m.NewCache(), p)
		if err != nil {
			t.Fatal(err)
		}
		want := refForward(src, spec, p, identity)
		if c := cosine(got, want); c < 0.99999 {
			t.Fatalf("%d tokens: cosine %v against the windowed reference", n, c)
		}
		full := spec
		full.window = 0
		if c := cosine(got, refForward(src, full, p, identity)); n > tWindow && c > 0.999 {
			t.Fatalf("%d tokens: windowed logits equal full attention's (cosine %v): the window is not applied", n, c)
		}
	}
}

// TestSlidingWithinWindowEqualsFull: while a prompt fits in the window, a
// sliding model gives bit for bit the logits of the same weights with
// full attention.
func TestSlidingWithinWindowEqualsFull(t *testing.T) {
	spec := tinySpec{arch: "MistralForCausalLM", dt: engine.F32, window: 64}
	slid := load(t, newTiny(t, spec, 7), engine.LoadOptions{})
	spec.window = 0
	full := load(t, newTiny(t, spec, 7), engine.LoadOptions{})
	if full.Info().Windows != nil || full.Fingerprint() == slid.Fingerprint() {
		t.Fatal("the window pattern is not in Info or the fingerprint")
	}
	p := slidingPrompt(40)
	a, _ := slid.Forward(context.Background(), slid.NewCache(), p)
	b, _ := full.Forward(context.Background(), full.NewCache(), p)
	if !slices.Equal(a, b) {
		t.Fatal("within the window, sliding attention differs from full attention")
	}
}

// TestSlidingDecodeEqualsRecompute decodes 4×W tokens one at a time, the
// ring sliding many times, and checks every step's logits bit for bit
// against a fresh one-shot forward over the whole sequence so far.
func TestSlidingDecodeEqualsRecompute(t *testing.T) {
	ctx := context.Background()
	for _, spec := range slidingSpecs() {
		t.Run(fmt.Sprintf("%v-q%d", spec.dt, spec.bits), func(t *testing.T) {
			m := load(t, newTiny(t, spec, 5), engine.LoadOptions{})
			seq := slidingPrompt(3)
			c := m.NewCache()
			if err := m.Prefill(ctx, c, seq[:2], 0, nil); err != nil {
				t.Fatal(err)
			}
			for step := range 4*tWindow + 8 {
				got, err := m.Forward(ctx, c, seq[len(seq)-1:])
				if err != nil {
					t.Fatal(err)
				}
				want, err := m.Forward(ctx, m.NewCache(), seq)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("step %d (%d positions): decoded logits differ from recomputation", step, len(seq))
				}
				seq = append(seq, int32(argmax(got)+step)%tV)
			}
		})
	}
}

// TestSlidingChunkInvariance: chunked prefill across window boundaries
// gives the same bytes in every layer's held window, and the same next
// logits, as one-shot prefill, for chunk sizes below, at and above W.
func TestSlidingChunkInvariance(t *testing.T) {
	ctx := context.Background()
	p := slidingPrompt(5*tWindow + 3)
	for _, spec := range slidingSpecs() {
		m := load(t, newTiny(t, spec, 5), engine.LoadOptions{})
		one := m.NewCache()
		if err := m.Prefill(ctx, one, p[:len(p)-1], 0, nil); err != nil {
			t.Fatal(err)
		}
		wantLogits, _ := m.Forward(ctx, one, p[len(p)-1:])
		n := len(p) - 1
		for _, chunk := range []int{1, 2, 3, tWindow - 1, tWindow, tWindow + 1, 2*tWindow + 3, 100} {
			c := m.NewCache()
			if err := m.Prefill(ctx, c, p[:n], chunk, nil); err != nil {
				t.Fatal(err)
			}
			for l := range tLayers {
				from := engine.WindowStart(tWindow, n)
				k1, v1, err1 := c.Export(l, from, n-from)
				one2 := m.NewCache()
				_ = m.Prefill(ctx, one2, p[:n], 0, nil)
				k2, v2, err2 := one2.Export(l, from, n-from)
				if err1 != nil || err2 != nil || string(k1) != string(k2) || string(v1) != string(v2) {
					t.Fatalf("%v q%d chunk %d layer %d: window KV differs (%v, %v)", spec.dt, spec.bits, chunk, l, err1, err2)
				}
			}
			got, _ := m.Forward(ctx, c, p[n:])
			if !slices.Equal(got, wantLogits) {
				t.Fatalf("%v q%d chunk %d: next logits differ from one-shot", spec.dt, spec.bits, chunk)
			}
		}
	}
}

// TestSlidingRollback: a conversation can go back within the kept slack
// and continue exactly as a recomputation would; going back past the
// window is reported by CanTruncate and refused by Truncate.
func TestSlidingRollback(t *testing.T) {
	ctx := context.Background()
	spec := tinySpec{arch: "MistralForCausalLM", dt: engine.F32, window: tWindow}
	m := load(t, newTiny(t, spec, 5), engine.LoadOptions{})
	p := slidingPrompt(200)
	c := m.NewCache()
	if err := m.Prefill(ctx, c, p, 16, nil); err != nil {
		t.Fatal(err)
	}
	if c.CanTruncate(100) {
		t.Fatal("CanTruncate(100) after the window slid past it")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Truncate past the window did not panic")
			}
		}()
		c.Truncate(100)
	}()
	if !c.CanTruncate(195) {
		t.Fatal("cannot go back 5 positions")
	}
	c.Truncate(195)
	got, _ := m.Forward(ctx, c, []int32{9})
	want, _ := m.Forward(ctx, m.NewCache(), append(slices.Clone(p[:195]), 9))
	if !slices.Equal(got, want) || math.IsNaN(float64(got[0])) {
		t.Fatal("after going back, logits differ from recomputation")
	}
}

// TestSlidingForwardBatch: batched decode over ring caches at different
// lengths (some past their slab, some not) gives each sequence the logits
// of its own Forward.
func TestSlidingForwardBatch(t *testing.T) {
	ctx := context.Background()
	spec := tinySpec{arch: "MistralForCausalLM", dt: engine.F32, window: tWindow}
	m := load(t, newTiny(t, spec, 5), engine.LoadOptions{})
	var batch, alone []engine.KVCache
	for i, n := range []int{3, 30, 90} {
		p := slidingPrompt(n + i)
		for _, dst := range []*[]engine.KVCache{&batch, &alone} {
			c := m.NewCache()
			if err := m.Prefill(ctx, c, p, 7, nil); err != nil {
				t.Fatal(err)
			}
			*dst = append(*dst, c)
		}
	}
	toks := []int32{5, 6, 7}
	for step := range 2 * tWindow {
		got, err := m.ForwardBatch(ctx, batch, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range alone {
			want, _ := m.Forward(ctx, c, toks[i:i+1])
			if !slices.Equal(got[i], want) {
				t.Fatalf("step %d sequence %d: batched logits differ", step, i)
			}
			toks[i] = int32(argmax(want))
		}
	}
}

// TestQwen2SlidingLayers: Qwen2 with use_sliding_window slides the layers
// from max_window_layers on (HF's rule) and matches the float64 reference
// that windows only those layers.
func TestQwen2SlidingLayers(t *testing.T) {
	spec := tinySpec{arch: "Qwen2ForCausalLM", dt: engine.F32, window: tWindow, windowFrom: 1}
	src := newTiny(t, spec, 9)
	m := load(t, src, engine.LoadOptions{})
	if w := m.Info().Windows; !slices.Equal(w, []int{0, tWindow}) {
		t.Fatalf("windows %v, want [0 %d]", w, tWindow)
	}
	p := slidingPrompt(5 * tWindow)
	got, err := m.Forward(context.Background(), m.NewCache(), p)
	if err != nil {
		t.Fatal(err)
	}
	identity := func(v float64) float64 { return v }
	if c := cosine(got, refForward(src, spec, p, identity)); c < 0.99999 {
		t.Fatalf("cosine %v against the reference windowing layer 1 only", c)
	}
	all := spec
	all.windowFrom = 0
	if c := cosine(got, refForward(src, all, p, identity)); c > 0.9999 {
		t.Fatalf("cosine %v against windowing every layer: layer 0 is not full", c)
	}
}
