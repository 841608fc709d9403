//go:build mlx

package decode

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestSpeculativeBatchSharesForwardsMLX: on the MLX backend, requests
// speculating by prompt lookup batched with one that does not (greedy, a
// stop sequence, a grammar, seeded temperature 1; penalties without
// speculation) answer as a runner without speculation does, and drafts
// were verified in the same forward as another request's step.
func TestSpeculativeBatchSharesForwardsMLX(t *testing.T) {
	b, err := backend.Open("mlx", backend.Options{LibPath: os.Getenv("EXO_MLXC_PATH"), Device: "cpu"})
	if err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}); err != nil {
		t.Fatal(err)
	}
	cases := []map[string]any{
		specBody("greedy", map[string]any{"logprobs": false, "top_logprobs": nil}),
		specBody("stop", nil),
		specBody("grammar", nil),
		specBody("seeded", nil),
		specBody("penalties", map[string]any{"x_exo_speculative": false}),
	}
	serve := func(spec string) string {
		return serveTinyOn(t, b, dir, func(text Text, o *Options) {
			g := &Grammars{Text: text}
			o.MaxBatch, o.NewConstraint, o.AcceptTools = len(cases), g.NewConstraint, true
			o.Speculative, o.SpecTokens, o.specForce, o.batchGather, o.batchQuorum = spec, 4, true, time.Minute, len(cases)
		}).url
	}
	plainURL := serve(SpecOff)
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plainURL, c)
	}
	url := serve(SpecPromptLookup)
	got := answerAll(t, url, cases)
	for i := range cases {
		if got[i] != want[i] {
			t.Fatalf("case %d: batched speculative answer on MLX\n%s\nplain\n%s", i, got[i], want[i])
		}
	}
	shared := metricValue(t, url, "exo_speculative_shared_steps_total")
	accepted := metricValue(t, url, `exo_speculative_tokens_total{outcome="accepted"}`)
	if shared == 0 || accepted == 0 {
		t.Fatalf("%v steps verified drafts beside another request's, %v drafted tokens kept", shared, accepted)
	}
	t.Logf("%v verifying steps shared, %v drafted tokens kept", shared, accepted)
}

// TestSpeculativeOverlappedMLX is TestSpeculativeOverlapped on the MLX
// backend (whose overlapped steps are queued before the step before them
// is read back).
func TestSpeculativeOverlappedMLX(t *testing.T) {
	b, err := backend.Open("mlx", backend.Options{LibPath: os.Getenv("EXO_MLXC_PATH"), Device: "cpu"})
	if err != nil {
		t.Skip(err)
	}
	testSpecOverlapped(t, 1e-4, func(dir string, configure func(Text, *Options)) *tinyServer {
		return serveTinyOn(t, b, dir, configure)
	})
}
