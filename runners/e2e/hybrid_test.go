package e2e

import (
	"path/filepath"
	"testing"
	"time"
)

// TestHybridRemoteEqualsLocal runs a Gated DeltaNet hybrid (the engine's
// tiny Qwen3-Next, checked against mlx-lm) through real runners: remote
// prefill (attention KV in chunks, the recurrent layers' states in State
// frames, counted in the decode runner's log) gives the local text for
// ~300- and ~1,000-token prompts and for a second turn that resumes from
// the states kept where turn 1's remote KV ended; a prefill runner
// killed mid-stream falls back to local prefill with the same text.
func TestHybridRemoteEqualsLocal(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("..", "engine", "testdata", "reference", "qwen3_next"))
	if err != nil {
		t.Fatal(err)
	}
	pre := start(t, "prefill", "prefill", "--model", dir, "--prefill-chunk", "64")
	dec := start(t, "decode-remote", "decode", "--model", dir, "--prefill", pre.listen)
	ref := start(t, "decode-local", "decode", "--model", dir)

	for _, c := range []struct {
		name  string
		words int
	}{{"~300 tokens", 125}, {"~1000 tokens", 420}} {
		t.Run(c.name, func(t *testing.T) {
			m := user(words(300+c.words, c.words))
			ok := dec.metric(t, outcome("ok"))
			got := chatStream(t, dec.listen, m, genTokens, ignoreEOS)
			want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
			expectSame(t, c.name, got, want)
			if dec.metric(t, outcome("ok")) != ok+1 {
				t.Fatalf("not prefilled remotely; outcome %q", dec.lastOutcome())
			}
			// The fill's record follows its metric: wait for it.
			fill := dec.waitRecords(t, "remote prefill", 1, 5*time.Second)
			if last := fill[len(fill)-1]; last["outcome"] != "ok" || last["states"] != "2" {
				t.Fatalf("remote fill %v: want State frames for the 2 recurrent layers:\n%s", last, dec.logs())
			}
		})
	}
	t.Run("second turn", func(t *testing.T) {
		first := user(words(11, 150))
		r1 := chatStream(t, dec.listen, first, genTokens, ignoreEOS)
		l1 := chatStream(t, ref.listen, first, genTokens, ignoreEOS)
		expectSame(t, "turn 1", r1, l1)
		second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: words(12, 150)})
		hit := dec.metric(t, `exo_prefix_cache_hit_tokens_total{role="decode"}`)
		r2 := chatStream(t, dec.listen, second, genTokens, ignoreEOS)
		expectSame(t, "turn 2", r2, chatStream(t, ref.listen, second, genTokens, ignoreEOS))
		// The decode cache kept the recurrent states where turn 1's remote
		// KV ended, so turn 2 resumes there.
		if d := dec.metric(t, `exo_prefix_cache_hit_tokens_total{role="decode"}`) - hit; d < float64(r1.Prompt-1) || r2.Cached < r1.Prompt-1 {
			t.Fatalf("turn 2 reused %v cached tokens (start_pos %d), want ≥ %d", d, r2.Cached, r1.Prompt-1)
		}
	})
	t.Run("prefill killed mid-stream", func(t *testing.T) {
		victim := start(t, "prefill-victim", "prefill", "--model", dir, "--prefill-chunk", "16", "--prefix-cache-mib", "0")
		px := newProxy(t, victim.listen)
		px.trigger = 8000
		px.onTrig = victim.kill
		d := start(t, "decode-victim", "decode", "--model", dir, "--prefill", px.addr())
		m := user(words(77, 420))
		before := d.metric(t, outcome("fallback_error"))
		expectSame(t, "killed", chatStream(t, d.listen, m, genTokens, ignoreEOS), chatStream(t, ref.listen, m, genTokens, ignoreEOS))
		if d.metric(t, outcome("fallback_error")) != before+1 {
			t.Fatalf("outcome %q, want fallback_error", d.lastOutcome())
		}
		select {
		case <-victim.done:
		default:
			t.Fatal("the prefill runner was not killed")
		}
	})
}
