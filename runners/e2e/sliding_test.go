package e2e

import (
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// slidingWindow is the tiny Mistral's window: every test prompt here is at
// least 4 windows long.
const slidingWindow = 64

// TestTinySlidingRemoteEqualsLocal runs three tiny sliding-window models
// through real runners: a Mistral whose layers all slide, a Gemma 3 whose
// every third layer is global and a gpt-oss alternating sliding and full
// layers with sinks and experts (window 64 for all). Remote prefill
// gives the local text for prompts of ~5 and ~30 windows and for a cached
// second turn (where a sliding layer's window starts past start_pos, so the
// decode side stages it); the bytes received are exactly W-1 positions per
// sliding layer plus the whole prompt per full layer (from the transfer
// totals); a prefill runner killed mid-stream falls back to the same text.
func TestTinySlidingRemoteEqualsLocal(t *testing.T) {
	for _, spec := range []testmodel.Spec{
		{Arch: "mistral", Seed: 7, Layers: 2, MaxPositions: 4096, SlidingWindow: slidingWindow},
		{Arch: "gemma3", Seed: 7, Layers: 4, MaxPositions: 4096, SlidingWindow: slidingWindow, SlidingPattern: 3},
		{Arch: "gptoss", Seed: 7, Layers: 2, MaxPositions: 4096, SlidingWindow: slidingWindow},
	} {
		t.Run(spec.Arch, func(t *testing.T) { slidingRemoteEqualsLocal(t, spec) })
	}
}

func slidingRemoteEqualsLocal(t *testing.T, spec testmodel.Spec) {
	dir := filepath.Join(t.TempDir(), spec.Arch)
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	spec, _ = spec.Normalized()
	// K and V of one position of one layer, in the f32 cache dtype.
	perPos := float64(2 * spec.KVHeads * spec.HeadDim * 4)
	global := 0 // full-attention layers
	switch spec.Arch {
	case "gemma3":
		global = spec.Layers / spec.SlidingPattern
	case "gptoss":
		global = spec.Layers / 2
	}
	// What a prompt of n tokens puts on the link with start_pos 0.
	wantBytes := func(n int) float64 {
		return (float64(spec.Layers-global)*(slidingWindow-1) + float64(global)*float64(n-1)) * perPos
	}

	pre := start(t, "prefill", "prefill", "--model", dir, "--prefill-chunk", "48")
	dec := start(t, "decode-remote", "decode", "--model", dir, "--prefill", pre.listen)
	ref := start(t, "decode-local", "decode", "--model", dir)
	received := func() float64 { return dec.metric(t, `exo_kv_transfer_bytes_total{role="decode"}`) }

	for i, c := range []struct {
		name  string
		words int
	}{{"~300 tokens", 125}, {"~2000 tokens", 830}} {
		t.Run(c.name, func(t *testing.T) {
			m := user(words(300+i, c.words))
			b0, ok0 := received(), dec.metric(t, outcome("ok"))
			got := chatStream(t, dec.listen, m, genTokens, ignoreEOS)
			want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
			expectSame(t, c.name, got, want)
			if got.Prompt < 4*slidingWindow {
				t.Fatalf("prompt of %d tokens is under 4 windows", got.Prompt)
			}
			if dec.metric(t, outcome("ok")) != ok0+1 {
				t.Fatalf("not prefilled remotely: %q", dec.lastOutcome())
			}
			// A sliding layer carries W-1 positions, not the prompt's N-1.
			if d := received() - b0; d != wantBytes(got.Prompt) {
				t.Fatalf("received %v bytes for a %d-token prompt, want %v (%d sliding layers × %d positions, %d full × %d); all positions would be %v",
					d, got.Prompt, wantBytes(got.Prompt), spec.Layers-global, slidingWindow-1, global, got.Prompt-1,
					float64(spec.Layers)*float64(got.Prompt-1)*perPos)
			}
		})
	}

	t.Run("second turn with a cached prefix", func(t *testing.T) {
		first := user(words(77, 150))
		r1 := chatStream(t, dec.listen, first, genTokens, ignoreEOS)
		l1 := chatStream(t, ref.listen, first, genTokens, ignoreEOS)
		expectSame(t, "turn 1", r1, l1)
		second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: words(78, 150)})
		ok0 := dec.metric(t, outcome("ok"))
		r2 := chatStream(t, dec.listen, second, genTokens, ignoreEOS)
		l2 := chatStream(t, ref.listen, second, genTokens, ignoreEOS)
		expectSame(t, "turn 2", r2, l2)
		if r2.Cached < r1.Prompt-1 {
			t.Fatalf("turn 2 start_pos %d, want ≥ %d: the decode cache kept the window of turn 1", r2.Cached, r1.Prompt-1)
		}
		if dec.metric(t, outcome("ok")) != ok0+1 {
			t.Fatalf("turn 2 not prefilled remotely: %q", dec.lastOutcome())
		}
	})

	t.Run("prefill killed mid-stream", func(t *testing.T) {
		victim := start(t, "prefill-victim", "prefill", "--model", dir, "--prefill-chunk", "32", "--prefix-cache-mib", "0")
		px := newProxy(t, victim.listen)
		px.trigger = 8000 // inside the window's chunk frames
		px.cut = true
		px.onTrig = victim.kill
		dv := start(t, "decode-victim", "decode", "--model", dir, "--prefill", px.addr())
		m := user(words(91, 400))
		want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
		before := dv.metric(t, outcome("fallback_error"))
		got := chatStream(t, dv.listen, m, genTokens, ignoreEOS)
		expectSame(t, "killed", got, want)
		if dv.metric(t, outcome("fallback_error")) != before+1 {
			t.Fatalf("outcome %q, want fallback_error", dv.lastOutcome())
		}
		select {
		case <-victim.done:
		default:
			t.Fatal("the prefill runner was not killed")
		}
	})
}
