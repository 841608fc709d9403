package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// TestSmolLM2RemoteEqualsLocal runs a real instruct model through a prefill
// and a decode runner and checks the text against a local-only decode
// runner at temperature 0.
func TestSmolLM2RemoteEqualsLocal(t *testing.T) {
	gguf := testenv.SmolLM2(t)
	pre := start(t, "smol-prefill", "prefill", "--model", gguf)
	dec := start(t, "smol-decode-remote", "decode", "--model", gguf, "--prefill", pre.listen)
	ref := start(t, "smol-decode-local", "decode", "--model", gguf)

	t.Run("real text", func(t *testing.T) {
		r := chatStream(t, dec.listen, user("What is the capital of France? Answer in one word."), 12, nil)
		if r.Status != 200 || !r.Done || !strings.Contains(r.Text, "Paris") {
			t.Fatalf("SmolLM2 answered %q (%+v)", r.Text, r)
		}
	})

	cases := []struct {
		name    string
		words   int
		minTok  int
		maxTok  int
		outcome string
		long    bool
	}{
		{"~50 tokens (skips remote)", 25, 30, 120, "skipped_short", false},
		{"~300 tokens", 250, 260, 420, "ok", false},
		{"~2000 tokens", 1750, 1700, 2600, "ok", true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.long && (testing.Short() || os.Getenv("EXO_E2E_LONG") == "") {
				t.Skip("minutes on a shared two-core machine: set EXO_E2E_LONG=1 (and not -short) to run it")
			}
			m := user("Summarize: " + words(300+i, c.words))
			before := dec.metric(t, outcome(c.outcome))
			got := chatStream(t, dec.listen, m, 16, ignoreEOS)
			want := chatStream(t, ref.listen, m, 16, ignoreEOS)
			expectSame(t, c.name, got, want)
			if got.Prompt < c.minTok || got.Prompt > c.maxTok {
				t.Fatalf("prompt has %d tokens, want %d..%d", got.Prompt, c.minTok, c.maxTok)
			}
			if after := dec.metric(t, outcome(c.outcome)); after != before+1 {
				t.Fatalf("outcome %s: %v → %v (last %q)", c.outcome, before, after, dec.lastOutcome())
			}
		})
	}

	t.Run("second turn with start_pos > 0", func(t *testing.T) {
		first := user("Summarize: " + words(400, 250))
		r1 := chatStream(t, dec.listen, first, 16, ignoreEOS)
		l1 := chatStream(t, ref.listen, first, 16, ignoreEOS)
		expectSame(t, "turn 1", r1, l1)
		second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: "Now this: " + words(401, 280)})
		preHit := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`)
		ok := dec.metric(t, outcome("ok"))
		r2 := chatStream(t, dec.listen, second, 16, ignoreEOS)
		l2 := chatStream(t, ref.listen, second, 16, ignoreEOS)
		expectSame(t, "turn 2", r2, l2)
		if r2.Cached < r1.Prompt-1 {
			t.Fatalf("turn 2 start_pos %d, want ≥ %d", r2.Cached, r1.Prompt-1)
		}
		if dec.metric(t, outcome("ok")) != ok+1 {
			t.Fatalf("turn 2 not remote: %q", dec.lastOutcome())
		}
		if d := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`) - preHit; d < float64(r1.Prompt-1) {
			t.Fatalf("prefill prefix hits grew by %v, want ≥ %d", d, r1.Prompt-1)
		}
	})
}
