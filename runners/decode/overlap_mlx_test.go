//go:build mlx

package decode

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// TestOverlappedBatchEqualsSerialMLX: on the MLX backend the batcher
// overlaps steps by itself (async_eval), and concurrent requests,
// overlapped and serial ones mixed, answer exactly as a server whose steps
// are all serial; so do requests sampled on the device (seeded
// temperature, top-k/p, min-p, penalties, logit bias, greedy) batched
// together.
func TestOverlappedBatchEqualsSerialMLX(t *testing.T) {
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
	serve := func(overlap func(Model) bool) (*Server, string) {
		o := Options{Name: "m", Model: m, Text: text, NewSampler: NewSampler, NewStopMatcher: NewStopMatcher,
			MaxBatch: 8, CacheEntries: -1, overlap: overlap}
		srv := New(o)
		t.Cleanup(srv.Close)
		hs := httptest.NewServer(apiMux(srv))
		t.Cleanup(hs.Close)
		return srv, hs.URL
	}
	_, serialURL := serve(func(Model) bool { return false })
	srv, url := serve(nil)
	if srv.lanes[0].ov == nil {
		t.Fatal("the batcher does not overlap on the mlx backend")
	}
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
		with("greedy", map[string]any{"logprobs": false, "top_logprobs": nil, "max_tokens": 7}),
		with("greedy", map[string]any{"logprobs": false, "top_logprobs": nil, "max_tokens": 19,
			"messages": []map[string]any{{"role": "user", "content": "five six"}}}),
		with("stop", nil),
		with("seeded", nil),
		with("penalties", nil),
	}
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, serialURL, c)
	}
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
	for i := range cases {
		if got[i] != want[i] {
			t.Fatalf("case %d: overlapped on mlx\n%s\nserial\n%s", i, got[i], want[i])
		}
	}
	if a := answerOf(t, url, cases[0]); a != want[0] {
		t.Fatalf("alone: %s, want %s", a, want[0])
	}
	srv.lanes[0].ov.mu.Lock()
	served := srv.lanes[0].ov.served
	srv.lanes[0].ov.mu.Unlock()
	if served < 30 {
		t.Fatalf("%d batches served overlapped, want at least the lone request's 38", served)
	}
	t.Logf("%d batches served overlapped on mlx", served)
	// Only overlappable requests, sampled on the device (MLX's
	// SampleRows), members leaving with draws in flight.
	sampled := overlapSampledCases()
	want = make([]string, len(sampled))
	for i, c := range sampled {
		want[i] = answerOf(t, serialURL, c)
	}
	got = make([]string, len(sampled))
	for i, c := range sampled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := answer(url, c)
			if err != nil {
				t.Errorf("sampled case %d: %v", i, err)
			}
			got[i] = a
		}()
	}
	wg.Wait()
	for i := range sampled {
		if got[i] != want[i] {
			t.Fatalf("sampled case %d: overlapped on mlx\n%s\nserial\n%s", i, got[i], want[i])
		}
	}
	srv.lanes[0].ov.mu.Lock()
	served, n := srv.lanes[0].ov.served-served, srv.lanes[0].ov.sampled
	srv.lanes[0].ov.mu.Unlock()
	if served < 10 || n == 0 {
		t.Fatalf("%d more batches served overlapped (%d overlaps with sampled members), want at least 10 and 1", served, n)
	}
	t.Logf("%d batches of sampled requests served overlapped on mlx (%d overlaps with sampled members)", served, n)
}
