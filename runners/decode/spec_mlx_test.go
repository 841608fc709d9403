//go:build mlx

package decode

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
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
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	text := NewText(tok, tmpl)
	reqs := specRequests()
	with := func(name string, extra map[string]any) map[string]any {
		b := map[string]any{}
		for k, v := range reqs[name] {
			b[k] = v
		}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	cases := []map[string]any{
		with("greedy", map[string]any{"logprobs": false, "top_logprobs": nil}),
		with("stop", nil),
		with("grammar", nil),
		with("seeded", nil),
		with("penalties", map[string]any{"x_exo_speculative": false}),
	}
	serve := func(spec string) (*Server, string) {
		g := &Grammars{Text: text}
		o := Options{Name: "m", Model: m, Text: text, NewSampler: NewSampler, NewStopMatcher: NewStopMatcher,
			MaxBatch: len(cases), CacheEntries: -1, NewConstraint: g.NewConstraint, AcceptTools: true,
			Speculative: spec, SpecTokens: 4, specForce: true, batchGather: time.Minute, batchQuorum: len(cases)}
		srv := New(o)
		t.Cleanup(srv.Close)
		hs := httptest.NewServer(apiMux(srv))
		t.Cleanup(hs.Close)
		return srv, hs.URL
	}
	_, plainURL := serve(SpecOff)
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plainURL, c)
	}
	_, url := serve(SpecPromptLookup)
	got := make([]string, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := answer(url, c)
			if err != nil {
				t.Errorf("case %d: %v", i, err)
			}
			got[i] = a
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
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
