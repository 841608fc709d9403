package decode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// answerOf posts a chat request and returns its answer without what
// differs between two runs of the same request (ids and the time).
func answerOf(t *testing.T, url string, body map[string]any) string {
	t.Helper()
	a, err := answer(url, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// answer is answerOf for any goroutine.
func answer(url string, body map[string]any) (string, error) {
	req := map[string]any{"model": "m"}
	for k, v := range body {
		req[k] = v
	}
	b, _ := json.Marshal(req)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("%v: %s", err, raw)
	}
	delete(out, "id")
	delete(out, "created")
	choices, _ := out["choices"].([]any)
	for _, c := range choices {
		msg, _ := c.(map[string]any)["message"].(map[string]any)
		calls, _ := msg["tool_calls"].([]any)
		for _, tc := range calls {
			delete(tc.(map[string]any), "id")
		}
	}
	b, _ = json.Marshal(out)
	return string(b), nil
}

// specRequests are the requests whose answers speculation must not change:
// greedy with logprobs, a stop sequence, penalties and bias; seeded
// temperature 1; a grammar (response_format) and a forced tool call.
func specRequests() map[string]map[string]any {
	msgs := []map[string]any{{"role": "user", "content": "one two three four, one two three four, one two three four, one two"}}
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	return map[string]map[string]any{
		"greedy": {"messages": msgs, "max_tokens": 40, "ignore_eos": true, "temperature": 0, "logprobs": true, "top_logprobs": 2},
		"penalties": {"messages": msgs, "max_tokens": 40, "ignore_eos": true, "temperature": 0, "frequency_penalty": 0.3,
			"repetition_penalty": 1.1, "logit_bias": map[string]any{"5": 2}},
		"stop":      {"messages": msgs, "max_tokens": 40, "ignore_eos": true, "temperature": 0, "stop": []string{"e"}},
		"seeded":    {"messages": msgs, "max_tokens": 40, "ignore_eos": true, "temperature": 1, "seed": 11},
		"grammar":   {"messages": msgs, "max_tokens": 60, "temperature": 0, "response_format": point},
		"tool call": {"messages": msgs, "max_tokens": 60, "temperature": 0, "tools": []any{cityTool}, "tool_choice": "required"},
	}
}

// specBody is specRequests' request name with extra fields set (nil:
// removed).
func specBody(name string, extra map[string]any) map[string]any {
	b := map[string]any{}
	for k, v := range specRequests()[name] {
		b[k] = v
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// answerAll posts every request at once and returns their answers in
// order (failing the test if any fails).
func answerAll(t *testing.T, url string, bodies []map[string]any) []string {
	t.Helper()
	got := make([]string, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := answer(url, b)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			got[i] = a
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return got
}

// specFamilies are the tiny models of every architecture family, each
// with a draft: for a generated model the same generator's one-layer model
// of the same seed (it shares the embedding, the first layer and the
// head, so it drafts much as the target would), for a reference model the
// model itself (the references are too few to pair).
type specFamily struct {
	name       string
	dir, draft func(t *testing.T) string
}

func specFamilies() []specFamily {
	var fams []specFamily
	gen := func(arch string, layers int) func(t *testing.T) string {
		return func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), "m")
			spec := testmodel.Spec{Arch: arch, Seed: 7, Layers: layers}
			if arch == "mistral" {
				spec.SlidingWindow = 8 // every layer slides (testmodel's mistral has none by default)
			}
			if err := testmodel.Write(dir, spec); err != nil {
				t.Fatal(err)
			}
			return dir
		}
	}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "mistral", "gemma3", "gptoss"} {
		fams = append(fams, specFamily{arch, gen(arch, 2), gen(arch, 1)})
	}
	for _, ref := range []string{"smollm3", "olmo2", "qwen3_next", "qwen3_5", "qwen3_5_moe"} {
		dir := func(*testing.T) string { return filepath.Join("..", "engine", "testdata", "reference", ref) }
		fams = append(fams, specFamily{ref, dir, dir})
	}
	return fams
}

// loadDraft loads the model at dir as target's draft (LoadDraft: beside
// it on its backend, its tokenizer checked against text's).
func loadDraft(t *testing.T, dir string, target Model, text Text) Model {
	t.Helper()
	m, err := LoadDraft(context.Background(), dir, target.(*engine.Model), text)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestSpeculativeEqualsPlain: on every architecture family of the tiny
// models (sliding windows and Gated DeltaNet layers included: their caches
// roll back), a runner with prompt-lookup speculation and one with a draft
// model answer every request of specRequests exactly as a runner without
// speculation; each verified drafts and kept some.
func TestSpeculativeEqualsPlain(t *testing.T) {
	for _, fam := range specFamilies() {
		t.Run(fam.name, func(t *testing.T) {
			dir, draftDir := fam.dir(t), fam.draft(t)
			with := func(spec string) func(Text, *Options) {
				return func(text Text, o *Options) {
					g := &Grammars{Text: text}
					o.NewConstraint, o.AcceptTools = g.NewConstraint, true
					o.Speculative, o.SpecTokens, o.specForce = spec, 5, true
					if spec == SpecDraft {
						o.Draft = loadDraft(t, draftDir, o.Model, text)
					}
				}
			}
			plain := serveTinyDir(t, dir, with(SpecOff))
			want := map[string]string{}
			for name, body := range specRequests() {
				want[name] = answerOf(t, plain.url, body)
			}
			for _, mode := range []string{SpecPromptLookup, SpecDraft} {
				spec := serveTinyDir(t, dir, with(mode))
				if spec.srv.specMax != 5 {
					t.Fatalf("%s: speculation refused: %s", mode, specRefusal(spec.srv.o.Model))
				}
				for name, body := range specRequests() {
					if got := answerOf(t, spec.url, body); got != want[name] {
						t.Fatalf("%s, %s: speculative answer\n%s\nplain\n%s", mode, name, got, want[name])
					}
				}
				accepted, verified := 0, 0
				for _, r := range spec.srv.journal.since(0) {
					accepted += r.SpecAccepted
					verified += r.SpecAccepted + r.SpecRejected
				}
				if accepted == 0 {
					t.Fatalf("%s: no drafted token was accepted (%d verified): speculation was not exercised", mode, verified)
				}
				t.Logf("%s: %d of %d drafted tokens accepted", mode, accepted, verified)
			}
		})
	}
}

// TestSpeculativeBatchedAndRemote: speculative requests (prompt lookup,
// and a draft model: the one-layer model of the same seed) batched beside
// requests that turn it off (x_exo_speculative: false), and a speculative
// request over a prompt prefilled by a real prefill runner (loopback TCP;
// the draft prefills it locally), answer as plain decoding does.
func TestSpeculativeBatchedAndRemote(t *testing.T) {
	for _, mode := range []string{SpecPromptLookup, SpecDraft} {
		t.Run(mode, func(t *testing.T) { testSpecBatchedRemote(t, mode) })
	}
}

func testSpecBatchedRemote(t *testing.T, mode string) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}
	plain := startTinyServer(t, spec, func(_ Text, o *Options) {})
	var remoteAddr string
	s := startTinyServer(t, spec, func(text Text, o *Options) {
		o.Speculative, o.SpecTokens, o.specForce = mode, 4, true
		if mode == SpecDraft {
			dir := filepath.Join(t.TempDir(), "draft")
			if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}); err != nil {
				t.Fatal(err)
			}
			o.Draft = loadDraft(t, dir, o.Model, text)
		}
		m := o.Model.(*engine.Model)
		remoteAddr = servePrefill(t, m, 16, nil)
		o.Remote = &KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m,
			Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: remoteAddr, Link: kvwire.LinkLoopback}})}
		o.RemoteMinTokens = 1
	})
	cases := []map[string]any{
		specBody("seeded", nil), // prefilled remotely; drafts get verified (and rejected) on this model
		specBody("seeded", map[string]any{"x_exo_speculative": false, "x_exo_disable_remote_prefill": true}),
		specBody("greedy", map[string]any{"x_exo_disable_remote_prefill": true}),
		specBody("penalties", map[string]any{"x_exo_speculative": false}),
	}
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plain.url, c)
	}
	for round := range 2 {
		got := answerAll(t, s.url, cases)
		for i := range cases {
			if got[i] != want[i] {
				t.Fatalf("round %d, case %d: batched speculative answer\n%s\nplain\n%s", round, i, got[i], want[i])
			}
		}
	}
	remote, accepted, rejected := 0, 0, 0
	for _, r := range s.srv.journal.since(0) {
		if r.Route == RouteRemote && r.SpecAccepted+r.SpecRejected > 0 {
			remote++
		}
		accepted, rejected = accepted+r.SpecAccepted, rejected+r.SpecRejected
	}
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	expo, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{fmt.Sprintf(`exo_speculative_tokens_total{outcome="accepted"} %d`, accepted),
		fmt.Sprintf(`exo_speculative_tokens_total{outcome="rejected"} %d`, rejected)} {
		if !strings.Contains(string(expo), want+"\n") {
			t.Errorf("metrics lack %q (the journal's sums)", want)
		}
	}
	if rejected == 0 {
		t.Error("no drafted token was rejected: the rollback was not exercised")
	}
	if remote != 2 {
		t.Fatalf("%d remote-prefilled requests verified drafts, want 2 (one per round)", remote)
	}
}

// discard is an Emitter that keeps nothing.
type discard struct{}

func (discard) Start(int) error                      { return nil }
func (discard) Text(string, *gen.TokenLogprob) error { return nil }

// recordingSampler records the tokens a sampler picks.
type recordingSampler struct {
	Sampler
	out *[]int32
}

func (r recordingSampler) Sample(logits []float32, history []int32) int32 {
	tok := r.Sampler.Sample(logits, history)
	*r.out = append(*r.out, tok)
	return tok
}

// SampleDist and Verify make a recordingSampler over a DraftSampler one.
func (r recordingSampler) SampleDist(q []float32, logits []float32, history []int32) int32 {
	tok := r.Sampler.(DraftSampler).SampleDist(q, logits, history)
	*r.out = append(*r.out, tok)
	return tok
}

func (r recordingSampler) Verify(logits []float32, history []int32, d int32, q []float32) (int32, bool) {
	tok, kept := r.Sampler.(DraftSampler).Verify(logits, history, d, q)
	*r.out = append(*r.out, tok)
	return tok, kept
}

// TestSpeculativeSamplingMatchesTarget: at temperature 1, the first three
// tokens of many seeded speculative generations are distributed as the
// target model says (chi-square, p > 1e-6; fixed seeds). The prompt
// repeats three tokens that a logit bias makes likely, so that drafts are
// proposed and often accepted: the second and third tokens come from
// verification rows, accepted or not. The expected probabilities are
// computed here from the engine's logits (bias added, softmax at
// temperature 1) for every sequence over the three tokens, the rest
// pooled.
//
// With a draft model: seeded, the target drafting for itself (its greedy
// tokens, point masses; the three tokens are the draft's first two greedy
// tokens and one more, so that its drafts are among them); and unseeded
// (fresh randomness: p < 1e-6 fails one run in a million), the one-layer
// model of the same seed sampling its drafts, kept or replaced by
// speculative sampling's rule (both must happen).
//
// Batched ("draft-sampled batched"): the unseeded requests four at a time
// in one batch, so that sampled drafts are verified in the batch's shared
// forwards (some steps must be shared).
func TestSpeculativeSamplingMatchesTarget(t *testing.T) {
	for _, mode := range []string{SpecPromptLookup, SpecDraft, "draft-sampled"} {
		t.Run(mode, func(t *testing.T) { testSpecSampling(t, mode, 1) })
	}
	t.Run("draft-sampled batched", func(t *testing.T) { testSpecSampling(t, "draft-sampled", 4) })
}

// testSpecSampling runs the generations batch at a time (1: one after
// another on a runner without a batcher).
func testSpecSampling(t *testing.T, mode string, batch int) {
	const n = 3000
	abc := []int32{40, 41, 42}
	bias := map[int32]float32{}
	var mu sync.Mutex
	var outs []*[]int32
	s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(text Text, o *Options) {
		o.Speculative, o.SpecTokens, o.MaxBatch, o.specForce = mode, 4, batch, true
		switch mode {
		case SpecDraft:
			o.Draft = o.Model
		case "draft-sampled":
			dir := filepath.Join(t.TempDir(), "draft")
			if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}); err != nil {
				t.Fatal(err)
			}
			o.Speculative, o.Draft = SpecDraft, loadDraft(t, dir, o.Model, text)
		}
		o.NewSampler = func(p gen.Sampling) Sampler {
			out := new([]int32)
			mu.Lock()
			outs = append(outs, out)
			mu.Unlock()
			return recordingSampler{NewSampler(p), out}
		}
	})
	prompt := []int32{7, 40, 41, 42, 9, 40, 41, 42, 11, 40, 41, 42, 40}
	ctx := context.Background()
	if mode == SpecDraft {
		greedy := func(ctx0 []int32) int32 {
			c := s.model.NewCache()
			defer c.Free()
			l, err := s.model.Forward(ctx, c, ctx0)
			if err != nil {
				t.Fatal(err)
			}
			return argmaxBelow(l, len(l))
		}
		a0 := greedy(prompt)
		a1 := greedy(append(slices.Clone(prompt), a0))
		abc = []int32{a0}
		for _, x := range []int32{a1, 40, 41, 42} {
			if len(abc) < 3 && !slices.Contains(abc, x) {
				abc = append(abc, x)
			}
		}
	}
	// The bias lifts the three tokens to about the most likely's logit
	// after the prompt, so that they take most of the mass, in shares the
	// model still decides.
	{
		c := s.model.NewCache()
		l, err := s.model.Forward(ctx, c, prompt)
		c.Free()
		if err != nil {
			t.Fatal(err)
		}
		top := slices.Max(l)
		for _, a := range abc {
			bias[a] = min(100, top-l[a]+2)
		}
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, batch)
	for seed := range int64(n) {
		req := &gen.Request{PromptIDs: prompt, MaxTokens: 3, IgnoreEOS: true,
			Sampling: gen.Sampling{Temperature: 1, TopP: 1, LogitBias: bias, Seed: seed + 1, SeedSet: mode != "draft-sampled"}}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if _, err := s.srv.Generate(ctx, req, discard{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if shared := metricValue(t, s.url, "exo_speculative_shared_steps_total"); batch > 1 {
		if shared == 0 {
			t.Fatal("no verifying step was shared with another generation: the batched verification was not exercised")
		}
		t.Logf("%v verifying steps shared with another generation", shared)
	}
	accepted, rejected := 0, 0
	for _, r := range s.srv.journal.since(0) {
		accepted += r.SpecAccepted
		rejected += r.SpecRejected
	}
	// The journal keeps the latest records only: a floor on acceptance.
	if accepted == 0 {
		t.Fatal("no drafted token was accepted: the verification rows were not exercised")
	}
	if mode == "draft-sampled" && rejected == 0 {
		t.Fatal("no sampled draft was rejected: the residual was not exercised")
	}
	// The target's probabilities of each continuation over abc.
	probs := func(ctx []int32) []float64 {
		c := s.model.NewCache()
		defer c.Free()
		l, err := s.model.Forward(context.Background(), c, ctx)
		if err != nil {
			t.Fatal(err)
		}
		mx := math.Inf(-1)
		adj := make([]float64, len(l))
		for i, x := range l {
			adj[i] = float64(x) + float64(bias[int32(i)])
			mx = max(mx, adj[i])
		}
		sum := 0.0
		for i := range adj {
			adj[i] = math.Exp(adj[i] - mx)
			sum += adj[i]
		}
		for i := range adj {
			adj[i] /= sum
		}
		return adj
	}
	type cell struct{ a, b, c int32 }
	expected := map[cell]float64{}
	p1 := probs(prompt)
	for _, a := range abc {
		p2 := probs(append(slices.Clone(prompt), a))
		for _, b := range abc {
			p3 := probs(append(slices.Clone(prompt), a, b))
			for _, c := range abc {
				expected[cell{a, b, c}] = p1[a] * p2[b] * p3[c]
			}
		}
	}
	observed := map[cell]int{}
	other := cell{-1, -1, -1}
	for _, op := range outs {
		o := *op
		if len(o) != 3 {
			t.Fatalf("sampled %d tokens, want 3", len(o))
		}
		k := cell{o[0], o[1], o[2]}
		if _, ok := expected[k]; !ok {
			k = other
		}
		observed[k]++
	}
	rest := 1.0
	for _, p := range expected {
		rest -= p
	}
	expected[other] = rest
	// Cells expecting fewer than 5 are pooled with the rest.
	chi, df, pooledE, pooledO := 0.0, -1, 0.0, 0
	for k, p := range expected {
		e := p * n
		if e < 5 || k == other {
			pooledE += e
			pooledO += observed[k]
			continue
		}
		d := float64(observed[k]) - e
		chi += d * d / e
		df++
	}
	if pooledE > 0 {
		d := float64(pooledO) - pooledE
		chi += d * d / pooledE
		df++
	}
	if df < 5 {
		t.Fatalf("only %d degrees of freedom: the test cannot tell distributions apart", df)
	}
	pv := chiSquareTail(chi, df)
	t.Logf("chi-square %.1f with %d degrees of freedom (p = %.3g), %d drafted tokens accepted", chi, df, pv, accepted)
	if pv < 1e-6 {
		t.Fatalf("speculative samples do not follow the target: chi-square %.1f, %d df, p = %.3g", chi, df, pv)
	}
}

// chiSquareTail is P(X ≥ x) for X chi-square with k degrees of freedom:
// the regularized upper incomplete gamma Q(k/2, x/2), by its series below
// a+1 and its continued fraction above (Numerical Recipes' gser/gcf).
func chiSquareTail(x float64, k int) float64 {
	a, z := float64(k)/2, x/2
	if z <= 0 {
		return 1
	}
	lg, _ := math.Lgamma(a)
	if z < a+1 {
		sum, term := 1/a, 1/a
		for n := 1; n < 1000; n++ {
			term *= z / (a + float64(n))
			sum += term
			if term < sum*1e-15 {
				break
			}
		}
		return 1 - sum*math.Exp(-z+a*math.Log(z)-lg)
	}
	b := z + 1 - a
	c, d := 1/1e-300, 1/b
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < 1e-300 {
			d = 1e-300
		}
		c = b + an/c
		if math.Abs(c) < 1e-300 {
			c = 1e-300
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-15 {
			break
		}
	}
	return math.Exp(-z+a*math.Log(z)-lg) * h
}

func TestChiSquareTail(t *testing.T) {
	for _, c := range []struct {
		x    float64
		k    int
		want float64
	}{
		{2, 2, math.Exp(-1)},              // k = 2: e^(-x/2)
		{10, 2, math.Exp(-5)},             // continued fraction side
		{1, 1, math.Erfc(math.Sqrt(0.5))}, // k = 1: erfc(sqrt(x/2))
		{9, 1, math.Erfc(math.Sqrt(4.5))},
	} {
		if got := chiSquareTail(c.x, c.k); math.Abs(got-c.want) > 1e-9*max(1, c.want) {
			t.Errorf("chiSquareTail(%v, %d) = %v, want %v", c.x, c.k, got, c.want)
		}
	}
}

// linearSteps makes c's step of P positions take step·(1 + cost·(P−1))
// seconds, P from 1 to n.
func linearSteps(c *batchCost, step, cost float64, n int) {
	for P := 1; P <= n; P++ {
		c.observe(stepStat{took: time.Duration(step * (1 + cost*float64(P-1)) * float64(time.Second)), seqs: 1, positions: P})
	}
}

// TestSpeculatorPlan: the draft comes from the place that ends with the
// longest run of the history's last tokens (the latest of equally long
// ones); its length follows the measured acceptance and step times; where
// drafting does not pay the steps are plain, with one-token probes after
// 1, 2, 4 … 64 plain steps.
func TestSpeculatorPlan(t *testing.T) {
	sp := newSpeculator(nil, 0, 4)
	for n := range sp.ok { // acceptance 0.9, nearly free positions
		sp.ok[n], sp.fail[n] = 9, 1
	}
	linearSteps(&sp.own, 0.01, 0.05, 12)
	for _, c := range []struct {
		history, want []int32
		class         int
	}{
		{[]int32{1, 2, 3, 9, 8, 1, 2, 3}, []int32{9, 8, 1, 2}, 3},
		// The 3-gram 2 3 4 recurs later, but 7 1 2 3 4 is longer.
		{[]int32{7, 1, 2, 3, 4, 5, 8, 2, 3, 4, 6, 7, 1, 2, 3, 4}, []int32{5, 8, 2, 3}, matchClass(5)},
		{[]int32{5, 6, 7, 6}, []int32{7, 6}, 1},
		{[]int32{1, 9, 1, 8, 1}, []int32{8, 1}, 1}, // equally long: the latest
		{[]int32{1, 2, 3}, nil, 0},
	} {
		sp.n = 0
		if d := sp.lookup(c.history, 10); !slices.Equal(d, c.want) || sp.n != c.class {
			t.Errorf("%v: draft %v (class %d), want %v (class %d)", c.history, d, sp.n, c.want, c.class)
		}
	}
	if d := sp.lookup([]int32{1, 2, 1}, 0); d != nil {
		t.Fatalf("draft %v with no room", d)
	}

	for _, c := range []struct {
		ok, fail, cost float64
		want           int
	}{
		{9, 1, 0.05, 8}, // acceptance 0.9, nearly free positions: all it may
		{9, 1, 0.3, 5},  // costly positions: fewer
		{1, 1, 0.05, 3}, // acceptance 0.5
		{1, 9, 0.1, -1}, // 0.1 does not pay: probes (cheap ones: within specProbeBudget)
	} {
		sp := newSpeculator(nil, 0, 8)
		linearSteps(&sp.own, 0.01, c.cost, 12)
		sp.ok[2], sp.fail[2] = c.ok, c.fail
		if c.want >= 0 {
			if k := sp.plan(2, 8); k != c.want {
				t.Errorf("%+v: plan %d", c, k)
			}
			if math.Abs(sp.cost-c.cost) > 1e-9 {
				t.Errorf("%+v: logged position cost %v", c, sp.cost)
			}
			continue
		}
		var probes []int
		for step := range 300 {
			sp.looks++ // propose counts the step
			if k := sp.plan(2, 8); k == 1 {
				probes = append(probes, step)
			} else if k != 0 {
				t.Fatalf("%+v: plan %d at step %d", c, k, step)
			}
		}
		gaps := []int{}
		for i := 1; i < len(probes); i++ {
			gaps = append(gaps, probes[i]-probes[i-1]-1)
		}
		if probes[0] != 0 || !slices.Equal(gaps[:7], []int{1, 2, 4, 8, 16, 32, 64}) || gaps[len(gaps)-1] != 64 {
			t.Errorf("%+v: probes at %v (plain steps between: %v)", c, probes, gaps)
		}
	}
}

// TestSpeculatorPlanBatch: in a batch the draft length weighs the
// member's expected tokens against what its positions add to the step
// every member waits for, at the size that step will have. On a step
// whose extra positions cost more the larger it is (the cpu backend's),
// a member drafts less beside three plain members than alone, less again
// beside members that draft, and not at all (probes only) at chat's
// acceptance; where extra positions are nearly free (a step bound by
// reading the weights) it drafts all it may.
func TestSpeculatorPlanBatch(t *testing.T) {
	// Seconds of a step of P positions: each position costs more the
	// more there are (an extra one 0.27 of a step alone, 0.76 of a
	// sequence's share beside three).
	convex := func(P int) float64 { return 0.02 + 0.006*float64(P) + 0.0004*float64(P*P) }
	flat := func(P int) float64 { return 0.1 + 0.0005*float64(P) }
	// plan is the member's draft length (0: a plain step or a probe).
	plan := func(T func(int) float64, acc float64, seqs, positions, own int) int {
		var bc batchCost
		for P := 1; P <= 48; P++ {
			bc.observe(stepStat{took: time.Duration(T(P) * float64(time.Second)), seqs: min(P, seqs), positions: P})
		}
		sp := newSpeculator(nil, 0, 8)
		sp.bc = &bc
		sp.ok[3], sp.fail[3] = acc, 1-acc
		sp.observeBatch(stepStat{took: time.Duration(T(positions) * float64(time.Second)), seqs: seqs, positions: positions}, own)
		if k := sp.plan(3, 8); sp.gap[3] == 0 {
			return k
		}
		return 0
	}
	alone := plan(convex, 0.9, 1, 1, 1)
	beside := plan(convex, 0.9, 4, 4, 1)
	busy := plan(convex, 0.9, 4, 13, 1) // the other three verify 3 drafts each
	if !(alone > beside && beside > busy) {
		t.Errorf("acceptance 0.9, convex step: drafts %d alone, %d beside plain members, %d beside drafting ones; want decreasing", alone, beside, busy)
	}
	if k := plan(convex, 0.3, 1, 1, 1); k != 0 {
		t.Errorf("acceptance 0.3 alone: plan %d, want probes only", k)
	}
	if k := plan(convex, 0.5, 4, 4, 1); k != 0 {
		t.Errorf("acceptance 0.5 beside plain members: plan %d, want probes only", k)
	}
	if k := plan(flat, 0.75, 4, 16, 1); k != 8 {
		t.Errorf("acceptance 0.75, nearly free positions: plan %d, want 8", k)
	}
	t.Logf("acceptance 0.9, convex step: %d alone, %d beside plain members, %d beside drafting ones", alone, beside, busy)
}

// TestSpeculatorPlanSolo: a generation whose verifications step aside from
// its batch (Server.batchVerify false) weighs them against what its plain
// steps cost the model — its share of the batch's forward — not against
// the time it waited for the batch. There a position verified alone costs
// more than a whole plain step and drafting at chat's acceptance does not
// pay (probes only); alone, where a plain step is a forward of its own,
// the same verification times make drafting pay.
func TestSpeculatorPlanSolo(t *testing.T) {
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	// A batch of 8 plain steps' forward takes 12 ms; the member saw 40
	// (the wait for the batch included); a verification of 4 drafts on
	// its own takes 11 ms; a plain forward alone 10 ms.
	batch := stepStat{took: ms(12), seqs: 8, positions: 8}
	plan := func(batched bool) (*speculator, []int) {
		sp := newSpeculator(nil, 0, 8)
		sp.ok[3], sp.fail[3] = 0.6, 0.4
		// A clock that moves by each step's wall time: consecutive steps
		// pair however slow the machine running the test is.
		clock := time.Unix(1000, 0)
		sp.own.now = func() time.Time { return clock }
		step := func(d time.Duration) { clock = clock.Add(d) }
		for range 12 {
			if batched {
				step(ms(40))
				sp.observePlain(batch, true, ms(40))
			} else {
				step(ms(10))
				sp.observePlain(stepStat{}, false, ms(10))
			}
			step(ms(11))
			sp.observe(5, ms(11))
		}
		step(ms(10))
		sp.observePlain(batch, batched, ms(10))
		var ks []int
		for range 8 {
			ks = append(ks, sp.plan(3, 8))
		}
		return sp, ks
	}
	sp, ks := plan(true)
	// One probe: a position costing more than a plain step, the next
	// ones wait for specProbeBudget (TestSpeculatorProbeBudget).
	if sp.cost < 1 || !slices.Equal(ks, []int{1, 0, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("beside a batch: position cost %.3f (want ≥ 1: more than a plain step's share), plans %v (want one probe)", sp.cost, ks)
	}
	sp, ks = plan(false)
	if sp.cost > 0.1 || ks[0] < 2 {
		t.Errorf("alone: position cost %.3f (want ≤ 0.1), plans %v (want drafts)", sp.cost, ks)
	}
}

// TestSpeculatorPairsSlowBatchSteps: a plain step that waited on a batch
// forward longer than costPairGap still pairs with the verification before
// it (the gap is measured against the wall time the generation saw, not
// its share of the forward), so slow models measure a position's cost.
func TestSpeculatorPairsSlowBatchSteps(t *testing.T) {
	sp := newSpeculator(nil, 0, 8)
	clock := time.Unix(1000, 0)
	sp.own.now = func() time.Time { return clock }
	batch := stepStat{took: 300 * time.Millisecond, seqs: 8, positions: 8}
	clock = clock.Add(11 * time.Millisecond)
	sp.observe(5, 11*time.Millisecond)
	clock = clock.Add(400 * time.Millisecond)
	sp.observePlain(batch, true, 400*time.Millisecond)
	if sp.own.np != 1 {
		t.Fatalf("a verification and the 400 ms plain step after it: %d pairs, want 1", sp.own.np)
	}
}

// TestLookupIndexMatchesScan: prompt lookup's search through its index of
// each token's positions finds the place a scan of the whole history does
// (the longest run of the last tokens, the latest of equally long ones),
// on histories that grow token by token (a generation's: indexed
// incrementally) and on unrelated ones (indexed anew).
func TestLookupIndexMatchesScan(t *testing.T) {
	scan := func(h []int32) (from, n int) {
		L := len(h)
		from = -1
		if L < 2 {
			return from, 0
		}
		for i := L - 2; i >= 0; i-- {
			if h[i] != h[L-1] {
				continue
			}
			m := 1
			for m < maxMatch && m <= i && h[i-m] == h[L-1-m] {
				m++
			}
			if m > n {
				from, n = i+1, m
				if m == maxMatch {
					break
				}
			}
		}
		return from, n
	}
	rng := rand.New(rand.NewPCG(3, 5))
	sp := newSpeculator(nil, 0, 8)
	found := 0
	for _, alphabet := range []int{2, 5, 40} {
		var h []int32
		for range 600 {
			// mostly copies of an earlier stretch (long matches), some new tokens
			if len(h) > 40 && rng.IntN(3) > 0 {
				at := rng.IntN(len(h) - 20)
				h = append(h, h[at:at+1+rng.IntN(20)]...)
			} else {
				h = append(h, int32(rng.IntN(alphabet)))
			}
			gf, gn := sp.match(h)
			wf, wn := scan(h)
			if gf != wf || gn != wn {
				t.Fatalf("alphabet %d, %d tokens: match (%d, %d), scan (%d, %d)", alphabet, len(h), gf, gn, wf, wn)
			}
			if gn == maxMatch {
				found++
			}
		}
		// an unrelated history on the same speculator
		u := []int32{9, 1, 2, 9, 1}
		if gf, gn := sp.match(u); gf != 2 || gn != 2 {
			t.Fatalf("unrelated history: match (%d, %d), want (2, 2)", gf, gn)
		}
	}
	if found == 0 {
		t.Fatal("no match of maxMatch tokens: the early stop was not exercised")
	}
}

// TestSpeculatorProbeBudget: where an extra position costs most of a step
// and the probes are rejected (an open chat on a compute-bound backend),
// the probes' cost stays within specProbeBudget of the steps (plus
// specProbeStart) instead of the schedule's one probe per class after 1,
// 2, 4 … 64 steps; where probes are accepted, or positions are nearly
// free, the budget holds none back.
func TestSpeculatorProbeBudget(t *testing.T) {
	const steps = 200
	// run steps steps of class-1 matches at position cost c; each probe
	// is accepted or rejected as accept says. It returns the probes and
	// those the budget held back.
	run := func(c float64, accept bool) (sp *speculator, probes int) {
		sp = newSpeculator(nil, 0, 8)
		linearSteps(&sp.own, 0.01, c, 12)
		sp.ok[1], sp.fail[1] = 0.02, 0.98 // drafting does not pay: probes only
		for range steps {
			if d := sp.lookup([]int32{7, 3, 5, 3}, 8); len(d) > 0 {
				if len(d) != 1 {
					t.Fatalf("cost %v: a draft of %d where only probes pay", c, len(d))
				}
				probes++
				sp.on, sp.rows = true, make([][]float32, 2)
				if accept {
					sp.next(d[0])
				}
				sp.end()
				sp.ok[1], sp.fail[1] = 0.02, 0.98 // keep probing
			}
			sp.looks++ // propose counts the step
		}
		return sp, probes
	}
	sp, probes := run(0.85, false)
	if spent := float64(probes) * 0.85; sp.held == 0 || spent > specProbeStart+specProbeBudget*steps+0.85 || probes < 2 {
		t.Errorf("position cost 0.85, probes rejected: %d probes (%.2f steps' worth), %d held back; want at least 2 within %.2f + one probe",
			probes, spent, sp.held, specProbeStart+specProbeBudget*steps)
	}
	_, unbudgeted := run(0.01, false)
	t.Logf("%d steps: %d probes at position cost 0.85 (%d held back), %d at 0.01", steps, probes, sp.held, unbudgeted)
	if unbudgeted < 8 || probes >= unbudgeted {
		t.Errorf("probes: %d at position cost 0.85, %d at 0.01 (the schedule's; want ≥ 8)", probes, unbudgeted)
	}
	for _, c := range []struct {
		cost   float64
		accept bool
	}{{0.85, true}, {0.01, false}} {
		if sp, n := run(c.cost, c.accept); sp.held != 0 || n != unbudgeted {
			t.Errorf("%+v: %d probes, %d held back; want the schedule's %d", c, n, sp.held, unbudgeted)
		}
	}
}
