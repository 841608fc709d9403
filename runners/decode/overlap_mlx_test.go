//go:build mlx

package decode

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// TestOverlappedBatchEqualsSerialMLX: on the MLX backend the batcher
// overlaps steps by itself (async_eval), and concurrent requests of every
// kind (greedy, a stop sequence, seeded sampling, penalties, logprobs
// computed on the device, a grammar and a tool call whose masks are made
// on the host while the device computes the step's forward) answer
// exactly as a server whose steps are all serial; so do requests sampled
// on the device (seeded temperature, top-k/p, min-p, penalties, logit
// bias, greedy) batched together. A request alone that ends at max_tokens
// computes no step for nothing.
func TestOverlappedBatchEqualsSerialMLX(t *testing.T) {
	serve := tinyMLXServer(t)
	_, serialURL := serve(func(Model) bool { return false })
	srv, url := serve(nil)
	if srv.lanes[0].ov == nil {
		t.Fatal("the batcher does not overlap on the mlx backend")
	}
	check := func(what string, cases []map[string]any) {
		t.Helper()
		want := make([]string, len(cases))
		for i, c := range cases {
			want[i] = answerOf(t, serialURL, c)
		}
		got := answerAll(t, url, cases)
		for i := range cases {
			if !sameAnswer(got[i], want[i], 1e-4) { // logprobs: float32 on the device
				t.Fatalf("%s case %d: overlapped on mlx\n%s\nserial\n%s", what, i, got[i], want[i])
			}
		}
	}
	cases := overlapMixedCases()
	check("mixed", cases)
	served, _, constrained, logprobs := overlapCounts(srv)
	if served < 30 || constrained == 0 || logprobs == 0 {
		t.Fatalf("%d batches served overlapped (%d overlaps with a grammar, %d with logprobs), want at least 30, 1 and 1",
			served, constrained, logprobs)
	}
	t.Logf("%d batches served overlapped on mlx (%d overlaps with a grammar, %d with logprobs)", served, constrained, logprobs)
	srv.lanes[0].ov.mu.Lock()
	dropped := srv.lanes[0].ov.dropped
	srv.lanes[0].ov.mu.Unlock()
	for _, c := range []map[string]any{cases[0], cases[4], cases[10]} { // greedy, logprobs, grammar: alone
		check("alone", []map[string]any{c})
	}
	srv.lanes[0].ov.mu.Lock()
	dropped = srv.lanes[0].ov.dropped - dropped
	srv.lanes[0].ov.mu.Unlock()
	if dropped > 1 { // the grammar request may end on its constraint with a step in flight
		t.Fatalf("%d steps computed for nothing by lone requests ending at max_tokens", dropped)
	}
	// Only overlappable requests, sampled on the device (MLX's
	// SampleRows), members leaving with draws in flight.
	before, _, _, _ := overlapCounts(srv)
	check("sampled", overlapSampledCases())
	served, n, _, _ := overlapCounts(srv)
	if served-before < 10 || n == 0 {
		t.Fatalf("%d more batches served overlapped (%d overlaps with sampled members), want at least 10 and 1", served-before, n)
	}
	t.Logf("%d batches of sampled requests served overlapped on mlx (%d overlaps with sampled members)", served-before, n)
}

// tinyMLXServer writes the tiny llama model and returns a function that
// starts a batching Server over it on MLX (EXO_MLXC_PATH; the test skips
// without it; grammars and tools on), with overlap deciding whether it
// overlaps steps (nil: on MLX, by itself).
func tinyMLXServer(t *testing.T) func(overlap func(Model) bool) (*Server, string) {
	t.Helper()
	b, err := backend.Open("mlx", backend.Options{LibPath: os.Getenv("EXO_MLXC_PATH"), Device: "cpu"})
	if err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}); err != nil {
		t.Fatal(err)
	}
	return func(overlap func(Model) bool) (*Server, string) {
		s := serveTinyOn(t, b, dir, func(text Text, o *Options) {
			g := &Grammars{Text: text}
			o.NewConstraint, o.AcceptTools, o.MaxBatch, o.overlap = g.NewConstraint, true, 16, overlap
		})
		return s.srv, s.url
	}
}

// TestOverlappedSmolLM2MLX (SmolLM2-135M's GGUF, testenv.SmolLM2; skipped
// without it): with real weights on MLX, a JSON-schema request (greedy
// and seeded), a forced tool call and a logprobs request answer with
// overlapped steps as with serial ones, each alone and all at once (logprobs
// within float32 rounding), and the overlaps did hold a constrained and a
// logprobs member.
func TestOverlappedSmolLM2MLX(t *testing.T) {
	path := testenv.SmolLM2(t)
	b, err := backend.Open("mlx", backend.Options{LibPath: os.Getenv("EXO_MLXC_PATH"), Device: "cpu"})
	if err != nil {
		t.Skip(err)
	}
	serve := func(overlap func(Model) bool) *tinyServer {
		return serveTinyOn(t, b, path, func(text Text, o *Options) {
			g := &Grammars{Text: text}
			o.NewConstraint, o.AcceptTools, o.MaxBatch, o.overlap = g.NewConstraint, true, 8, overlap
		})
	}
	serial, over := serve(func(Model) bool { return false }), serve(nil)
	msgs := []map[string]any{{"role": "user", "content": "Give me a point with x 3 and y 4, and the weather in Paris."}}
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	cases := []map[string]any{
		{"messages": msgs, "max_tokens": 24, "temperature": 0, "response_format": point},
		{"messages": msgs, "max_tokens": 24, "temperature": 0.8, "seed": 3, "response_format": point},
		{"messages": msgs, "max_tokens": 24, "temperature": 0, "tools": []any{cityTool}, "tool_choice": "required"},
		{"messages": msgs, "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3},
	}
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, serial.url, c)
	}
	for i, c := range cases {
		if got := answerOf(t, over.url, c); !sameAnswer(got, want[i], 1e-3) {
			t.Fatalf("case %d alone: overlapped on mlx\n%s\nserial\n%s", i, got, want[i])
		}
	}
	got := answerAll(t, over.url, cases)
	for i := range cases {
		if !sameAnswer(got[i], want[i], 1e-3) {
			t.Fatalf("case %d at once: overlapped on mlx\n%s\nserial\n%s", i, got[i], want[i])
		}
	}
	served, _, constrained, logprobs := overlapCounts(over.srv)
	if served == 0 || constrained == 0 || logprobs == 0 {
		t.Fatalf("%d batches served overlapped, %d overlaps with a grammar, %d with logprobs", served, constrained, logprobs)
	}
	t.Logf("SmolLM2 on mlx: %d batches served overlapped (%d overlaps with a grammar, %d with logprobs); answers: %q", served, constrained, logprobs, want)
}
