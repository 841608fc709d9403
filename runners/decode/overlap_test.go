package decode

import (
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestOverlappedBatchEqualsSerial: with overlapped steps forced on (the
// cpu backend steps them synchronously), concurrent requests, plain
// greedy ones (overlapped: long, short so that the batch's members change
// mid-flight, with a stop sequence that ends one mid-overlap) mixed with
// ones that take the serial step (logprobs, seeded sampling, penalties
// and logit bias, a grammar, a tool call), answer exactly as one at a time
// on a server without batching; and the batcher did serve overlapped
// steps.
func TestOverlappedBatchEqualsSerial(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}
	plain := startTinyServer(t, spec, func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools, o.MaxBatch = g.NewConstraint, true, 1
	})
	s := startTinyServer(t, spec, func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools, o.MaxBatch = g.NewConstraint, true, 8
		o.overlap = func(Model) bool { return true }
	})
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
		with("greedy", nil), // logprobs: serial
		with("seeded", nil),
		with("penalties", nil),
		with("grammar", nil),
		with("tool call", nil),
	}
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plain.url, c)
	}
	for round := range 2 {
		got := make([]string, len(cases))
		var wg sync.WaitGroup
		for i, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := answer(s.url, c)
				if err != nil {
					t.Errorf("case %d: %v", i, err)
				}
				got[i] = a
			}()
		}
		wg.Wait()
		for i := range cases {
			if got[i] != want[i] {
				t.Fatalf("round %d, case %d: batched answer with overlapped steps\n%s\nserial\n%s", round, i, got[i], want[i])
			}
		}
	}
	// Alone, a plain greedy request is overlapped from its second step.
	if a := answerOf(t, s.url, cases[0]); a != want[0] {
		t.Fatalf("alone: %s, want %s", a, want[0])
	}
	served := 0
	for _, b := range s.srv.lanes {
		b.ov.mu.Lock()
		served += b.ov.served
		b.ov.mu.Unlock()
	}
	if served < 30 {
		t.Fatalf("%d batches served overlapped, want at least the lone request's 38", served)
	}
	t.Logf("%d batches served overlapped", served)
}

// TestOverlappedLoneEqualsSerial: without a batcher (--max-batch 1) a
// plain greedy generation's steps are overlapped too, and requests answer
// as with serial steps.
func TestOverlappedLoneEqualsSerial(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}
	plain := startTinyServer(t, spec, func(_ Text, o *Options) { o.MaxBatch = 1 })
	s := startTinyServer(t, spec, func(_ Text, o *Options) {
		o.MaxBatch = 1
		o.overlap = func(Model) bool { return true }
	})
	if !s.srv.overlap || s.srv.batch != nil {
		t.Fatal("want a lone server with overlapped steps")
	}
	reqs := specRequests()
	for _, c := range []map[string]any{reqs["stop"], reqs["greedy"], reqs["seeded"], reqs["penalties"]} {
		c["logprobs"], c["top_logprobs"] = nil, nil
		if got, want := answerOf(t, s.url, c), answerOf(t, plain.url, c); got != want {
			t.Fatalf("overlapped lone answer\n%s\nserial\n%s", got, want)
		}
	}
	// The greedy one (40 tokens) overlapped from its second step, the
	// stop one until its stop.
	if n := s.srv.soloOverlapped.Load(); n < 39 {
		t.Fatalf("%d overlapped lone steps, want at least 39", n)
	}
}
