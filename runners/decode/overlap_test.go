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
// seeded sampling (temperature, top-k, top-p, min-p; lengths that differ,
// so that members leave while their draws are in flight), penalties and
// logit bias (overlapped too: picked by the same rules), and ones that
// take the serial step (logprobs, a grammar, a tool call), answer exactly
// as one at a time on a server without batching; and the batcher did
// serve overlapped steps (TestOverlappedSampledBatchEqualsSerial makes
// sure that sampled ones are among them).
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
		with("seeded", map[string]any{"seed": 3, "max_tokens": 11, "top_k": 8, "temperature": 0.8}),
		with("seeded", map[string]any{"seed": 5, "max_tokens": 23, "top_p": 0.9, "min_p": 0.05}),
		with("seeded", map[string]any{"seed": 9, "presence_penalty": 0.6, "repetition_penalty": 1.2,
			"logit_bias": map[string]any{"7": -100, "9": 3}}),
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
	served, sampled := 0, 0
	for _, b := range s.srv.lanes {
		b.ov.mu.Lock()
		served += b.ov.served
		sampled += b.ov.sampled
		b.ov.mu.Unlock()
	}
	if served < 30 {
		t.Fatalf("%d batches served overlapped, want at least the lone request's 38", served)
	}
	t.Logf("%d batches served overlapped; %d overlaps began with a sampled or penalized member", served, sampled)
}

// TestOverlappedLoneEqualsSerial: without a batcher (--max-batch 1) a
// generation's steps are overlapped too (greedy, seeded, penalized), and
// requests answer as with serial steps.
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
	// The greedy, seeded and penalties ones (40 tokens each) overlapped
	// from their second step, the stop one until its stop.
	if n := s.srv.soloOverlapped.Load(); n < 3*39 {
		t.Fatalf("%d overlapped lone steps, want at least %d", n, 3*39)
	}
}

// TestOverlappedSampledBatchEqualsSerial: a batch of only overlappable
// requests — seeded temperature, top-k, top-p, min-p, penalties and logit
// bias, and greedy — of different lengths, so that members leave while
// the others' next draws are in flight (the overlap stops, and each
// sampler takes back the draw of the dropped step), answers exactly as
// one request at a time without batching, and most batches overlap.
func TestOverlappedSampledBatchEqualsSerial(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}
	plain := startTinyServer(t, spec, func(_ Text, o *Options) { o.MaxBatch = 1 })
	s := startTinyServer(t, spec, func(_ Text, o *Options) {
		o.MaxBatch = 8
		o.overlap = func(Model) bool { return true }
	})
	cases := overlapSampledCases()
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plain.url, c)
	}
	for round := range 3 {
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
				t.Fatalf("round %d, case %d: overlapped\n%s\nserial\n%s", round, i, got[i], want[i])
			}
		}
	}
	served, sampled := 0, 0
	for _, b := range s.srv.lanes {
		b.ov.mu.Lock()
		served, sampled = served+b.ov.served, sampled+b.ov.sampled
		b.ov.mu.Unlock()
	}
	if served < 10 || sampled == 0 {
		t.Fatalf("%d batches served overlapped (%d overlaps with sampled members), want at least 10 and 1", served, sampled)
	}
	t.Logf("%d batches served overlapped, %d overlaps with sampled members", served, sampled)
}

// overlapSampledCases are requests whose steps the device can pick, of
// different lengths: seeded temperature, top-k, top-p, min-p, penalties
// (a negative presence penalty, so that its counts change greedy picks)
// and logit bias, and plain greedy.
func overlapSampledCases() []map[string]any {
	msgs := []map[string]any{{"role": "user", "content": "one two three four, one two"}}
	req := func(n int, extra map[string]any) map[string]any {
		b := map[string]any{"messages": msgs, "max_tokens": n, "ignore_eos": true}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	return []map[string]any{
		req(30, map[string]any{"temperature": 1, "seed": 1}),
		req(9, map[string]any{"temperature": 0.7, "seed": 2, "top_k": 5}),
		req(17, map[string]any{"temperature": 1.1, "seed": 3, "top_p": 0.85}),
		req(25, map[string]any{"temperature": 0.9, "seed": 4, "min_p": 0.1, "top_k": 40, "top_p": 0.95}),
		req(13, map[string]any{"temperature": 1, "seed": 5, "frequency_penalty": 1.5, "presence_penalty": 1,
			"repetition_penalty": 1.3, "logit_bias": map[string]any{"4": 2, "6": -100}}),
		req(21, map[string]any{"temperature": 0, "repetition_penalty": 1.2}),
		req(19, map[string]any{"temperature": 0, "frequency_penalty": -0.5, "presence_penalty": -2}), // raised: repeats
		req(6, map[string]any{"temperature": 0}),
	}
}
