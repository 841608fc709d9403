package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestTinyDraftSpeculation: `exo runner decode --speculative draft --draft
// DIR` (a one-layer model of the tiny model's seed: the same tokenizer)
// answers as a runner without speculation, on a short prompt and on a
// long one prefilled by a real prefill runner, greedy and seeded at
// temperature 1, with drafted tokens counted in
// exo_speculative_tokens_total; a draft of another tokenizer keeps the
// runner from starting, naming the difference.
func TestTinyDraftSpeculation(t *testing.T) {
	dir := tinyModel(t, "main")
	draft := filepath.Join(t.TempDir(), "draft")
	if err := testmodel.Write(draft, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1, MaxPositions: 4096}); err != nil {
		t.Fatal(err)
	}
	pre := start(t, "prefill", "prefill", "--model", dir, "--prefill-chunk", "128")
	spec := start(t, "decode-draft", "decode", "--model", dir, "--prefill", pre.listen,
		"--speculative", "draft", "--draft", draft, "--speculative-tokens", "4")
	ref := start(t, "decode-plain", "decode", "--model", dir)
	for i, c := range []struct {
		words int
		extra map[string]any
	}{
		{12, map[string]any{"ignore_eos": true}},
		{125, map[string]any{"ignore_eos": true}},
		{125, map[string]any{"ignore_eos": true, "temperature": 1, "seed": 5}},
	} {
		m := user(words(300+i, c.words))
		got := chatStream(t, spec.listen, m, 32, c.extra)
		want := chatStream(t, ref.listen, m, 32, c.extra)
		expectSame(t, "draft speculation", got, want)
	}
	if n := spec.metric(t, outcome("ok")); n < 2 {
		t.Fatalf("%v remote prefills, want the two long prompts", n)
	}
	acc := spec.metric(t, `exo_speculative_tokens_total{outcome="accepted"}`)
	rej := spec.metric(t, `exo_speculative_tokens_total{outcome="rejected"}`)
	if acc+rej == 0 {
		t.Fatal("no drafted token was verified")
	}
	t.Logf("drafted tokens: %v accepted, %v rejected", acc, rej)

	other := filepath.Join(t.TempDir(), "other")
	if err := testmodel.Write(other, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1, Vocab: 300}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exoBin, "runner", "decode", "--listen", freeAddr(t), "--served-name", "m", "--backend", "cpu", "--offline",
		"--model", dir, "--speculative", "draft", "--draft", other)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "draft model's tokenizer has 300 tokens, the model's 512") {
		t.Fatalf("runner with another tokenizer's draft: %v\n%s", err, tail(string(out), 2000))
	}
}
