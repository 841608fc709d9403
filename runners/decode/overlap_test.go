package decode

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestOverlappedBatchEqualsSerial: with overlapped steps forced on (the
// cpu backend steps them synchronously), concurrent requests, plain
// greedy ones (overlapped: long, short so that the batch's members change
// mid-flight, with a stop sequence that ends one mid-overlap) mixed with
// seeded sampling (temperature, top-k, top-p, min-p; lengths that differ,
// so that members leave while their draws are in flight), penalties and
// logit bias (overlapped too: picked by the same rules), logprobs, a
// grammar and a tool call (overlapped: the mask made on the host between
// the forward and the pick), answer exactly as one at a time on a server
// without batching; and the batcher did serve overlapped steps, some with
// a constrained member and some with logprobs
// (TestOverlappedSampledBatchEqualsSerial makes sure that sampled ones
// are among them).
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
	cases := overlapMixedCases()
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plain.url, c)
	}
	for round := range 2 {
		got := answerAll(t, s.url, cases)
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
	served, sampled, constrained, logprobs := overlapCounts(s.srv)
	if served < 30 || constrained == 0 || logprobs == 0 {
		t.Fatalf("%d batches served overlapped (%d overlaps with a grammar, %d with logprobs), want at least the lone request's 38, 1 and 1",
			served, constrained, logprobs)
	}
	t.Logf("%d batches served overlapped; overlaps began with a sampled or penalized member %d times, a constrained one %d, logprobs %d",
		served, sampled, constrained, logprobs)
}

// TestOverlappedLoneEqualsSerial: without a batcher (--max-batch 1) a
// generation's steps are overlapped too (greedy with logprobs, seeded,
// penalized, a grammar, a tool call), and requests answer as with serial
// steps; one that ends at max_tokens computes no step for nothing.
func TestOverlappedLoneEqualsSerial(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}
	opts := func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools, o.MaxBatch = g.NewConstraint, true, 1
	}
	plain := startTinyServer(t, spec, opts)
	s := startTinyServer(t, spec, func(text Text, o *Options) {
		opts(text, o)
		o.overlap = func(Model) bool { return true }
	})
	if !s.srv.overlap || s.srv.batch != nil {
		t.Fatal("want a lone server with overlapped steps")
	}
	reqs := specRequests()
	for _, c := range []map[string]any{reqs["greedy"], reqs["seeded"], reqs["penalties"]} {
		if got, want := answerOf(t, s.url, c), answerOf(t, plain.url, c); got != want {
			t.Fatalf("overlapped lone answer\n%s\nserial\n%s", got, want)
		}
	}
	// The greedy, seeded and penalties ones (40 tokens each) overlapped
	// from their second step and stopped at max_tokens with no step in
	// flight.
	if n := s.srv.soloOverlapped.Load(); n < 3*39 {
		t.Fatalf("%d overlapped lone steps, want at least %d", n, 3*39)
	}
	if n := s.srv.soloDropped.Load(); n != 0 {
		t.Fatalf("%d steps computed for nothing by requests that end at max_tokens", n)
	}
	before := s.srv.soloOverlapped.Load()
	for _, c := range []map[string]any{reqs["stop"], reqs["grammar"], reqs["tool call"]} {
		if got, want := answerOf(t, s.url, c), answerOf(t, plain.url, c); got != want {
			t.Fatalf("overlapped lone answer\n%s\nserial\n%s", got, want)
		}
	}
	if n := s.srv.soloOverlapped.Load() - before; n < 10 {
		t.Fatalf("%d overlapped lone steps of the stop, grammar and tool call requests", n)
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
		got := answerAll(t, s.url, cases)
		for i := range cases {
			if got[i] != want[i] {
				t.Fatalf("round %d, case %d: overlapped\n%s\nserial\n%s", round, i, got[i], want[i])
			}
		}
	}
	served, sampled, _, _ := overlapCounts(s.srv)
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

// overlapCounts sums the lanes' overlap counters: batches served
// overlapped, and the overlaps begun with a sampled, a constrained and a
// logprobs member.
func overlapCounts(s *Server) (served, sampled, constrained, logprobs int) {
	for _, b := range s.lanes {
		b.ov.mu.Lock()
		served, sampled = served+b.ov.served, sampled+b.ov.sampled
		constrained, logprobs = constrained+b.ov.constrained, logprobs+b.ov.logprobs
		b.ov.mu.Unlock()
	}
	return served, sampled, constrained, logprobs
}

// overlapMixedCases are specRequests' requests mixed as a batch would
// see them: plain greedy of three lengths, a stop sequence, seeded
// sampling, penalties, logprobs, a grammar and a tool call.
func overlapMixedCases() []map[string]any {
	return []map[string]any{
		specBody("greedy", map[string]any{"logprobs": false, "top_logprobs": nil}),
		specBody("greedy", map[string]any{"logprobs": false, "top_logprobs": nil, "max_tokens": 7}),
		specBody("greedy", map[string]any{"logprobs": false, "top_logprobs": nil, "max_tokens": 19,
			"messages": []map[string]any{{"role": "user", "content": "five six"}}}),
		specBody("stop", nil),
		specBody("greedy", nil), // logprobs, top 2
		specBody("seeded", nil),
		specBody("seeded", map[string]any{"seed": 3, "max_tokens": 11, "top_k": 8, "temperature": 0.8}),
		specBody("seeded", map[string]any{"seed": 5, "max_tokens": 23, "top_p": 0.9, "min_p": 0.05}),
		specBody("seeded", map[string]any{"seed": 9, "presence_penalty": 0.6, "repetition_penalty": 1.2,
			"logit_bias": map[string]any{"7": -100, "9": 3}}),
		specBody("penalties", nil),
		specBody("grammar", nil),
		specBody("tool call", nil),
		specBody("grammar", map[string]any{"temperature": 0.9, "seed": 4, "logprobs": true, "top_logprobs": 3}),
	}
}

// sameAnswer reports whether the JSON answers a and b are equal but for
// numbers that differ by at most tol (logprobs computed in float32 on the
// device against float64 on the host).
func sameAnswer(a, b string, tol float64) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	var same func(x, y any) bool
	same = func(x, y any) bool {
		switch xv := x.(type) {
		case float64:
			yv, ok := y.(float64)
			return ok && math.Abs(xv-yv) <= tol
		case []any:
			yv, ok := y.([]any)
			if !ok || len(xv) != len(yv) {
				return false
			}
			for i := range xv {
				if !same(xv[i], yv[i]) {
					return false
				}
			}
			return true
		case map[string]any:
			yv, ok := y.(map[string]any)
			if !ok || len(xv) != len(yv) {
				return false
			}
			for k, v := range xv {
				if w, ok := yv[k]; !ok || !same(v, w) {
					return false
				}
			}
			return true
		default:
			return x == y
		}
	}
	return same(x, y)
}

func TestSameAnswer(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{`{"x":[1,{"lp":-0.5}]}`, `{"x":[1,{"lp":-0.50001}]}`, true},
		{`{"x":[1,{"lp":-0.5}]}`, `{"x":[1,{"lp":-0.6}]}`, false},
		{`{"x":"a"}`, `{"x":"b"}`, false},
		{`{"x":[1]}`, `{"x":[1,2]}`, false},
		{`{"x":1}`, `{"y":1}`, false},
	} {
		if got := sameAnswer(c.a, c.b, 1e-4); got != c.want {
			t.Errorf("sameAnswer(%s, %s) = %v", c.a, c.b, got)
		}
	}
}
