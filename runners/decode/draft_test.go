package decode

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// otherToken is a Text whose token id has other bytes.
type otherToken struct {
	Text
	id int32
}

func (o otherToken) TokenBytes(id int32) []byte {
	if id == o.id {
		return []byte("something else")
	}
	return o.Text.TokenBytes(id)
}

// TestDraftTokenizerRefused: a draft whose tokenizer differs from the
// model's (another vocabulary size, one token's bytes, the end tokens) is
// refused naming the difference, by CheckDraftText and by LoadDraft,
// which loads a matching one.
func TestDraftTokenizerRefused(t *testing.T) {
	text := func(spec testmodel.Spec) (Text, string) {
		dir := filepath.Join(t.TempDir(), "m")
		if err := testmodel.Write(dir, spec); err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return NewText(tok, nil), dir
	}
	target, targetDir := text(testmodel.Spec{Arch: "llama", Seed: 7})
	same, sameDir := text(testmodel.Spec{Arch: "qwen3", Seed: 3, Layers: 1})
	small, smallDir := text(testmodel.Spec{Arch: "llama", Seed: 7, Vocab: 300})
	if err := CheckDraftText(target, same); err != nil {
		t.Fatalf("same tokenizer refused: %v", err)
	}
	for _, c := range []struct {
		draft Text
		want  string
	}{
		{small, "draft model's tokenizer has 300 tokens, the model's 512"},
		{otherToken{same, 100}, "draft model's tokenizer differs at token 100"},
	} {
		if err := CheckDraftText(target, c.draft); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckDraftText: %v, want %q", err, c.want)
		}
	}
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	tm, err := engine.Load(context.Background(), targetDir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	if _, err := LoadDraft(context.Background(), smallDir, tm, target); err == nil || !strings.Contains(err.Error(), "300 tokens") {
		t.Errorf("LoadDraft of another tokenizer: %v", err)
	}
	m, err := LoadDraft(context.Background(), sameDir, tm, target)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

// TestDrafterKeepsInStep: over many rounds in which the generation keeps
// some of the drafted tokens and then a token of its own, the drafter's
// cache follows the history (going back past what the history no longer
// shares: a full, a sliding-window and a Gated DeltaNet draft) and drafts
// exactly the greedy continuation a fresh cache gives; a second generation
// over a shared prefix takes the first one's draft cache from the pool.
func TestDrafterKeepsInStep(t *testing.T) {
	for _, c := range []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"llama", func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), "m")
			if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"gemma3", func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), "m")
			if err := testmodel.Write(dir, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 2}); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"qwen3_next", func(*testing.T) string { return filepath.Join("..", "engine", "testdata", "reference", "qwen3_next") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			b, err := backend.Open("cpu", backend.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			m, err := engine.Load(ctx, c.dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			vocab := min(m.Info().Vocab, 500)
			greedy := func(hist []int32, k int) []int32 {
				fresh := m.NewCache()
				defer fresh.Free()
				l, err := m.Forward(ctx, fresh, hist)
				if err != nil {
					t.Fatal(err)
				}
				var out []int32
				for {
					tok := argmaxBelow(l, vocab)
					out = append(out, tok)
					if len(out) == k {
						return out
					}
					if l, err = m.Forward(ctx, fresh, []int32{tok}); err != nil {
						t.Fatal(err)
					}
				}
			}
			pool := newKVPool(2, 4096, m.NewCache)
			defer pool.close()
			rng := rand.New(rand.NewPCG(3, 4))
			var hist []int32
			for range 24 {
				hist = append(hist, int32(10+rng.IntN(vocab-10)))
			}
			d := &drafter{m: m, vocab: vocab, pool: pool}
			for round := range 30 {
				k := 1 + rng.IntN(5)
				got, err := d.draft(ctx, hist, k)
				if err != nil {
					t.Fatal(err)
				}
				if want := greedy(hist, k); !slices.Equal(got, want) {
					t.Fatalf("round %d: drafted %v, a fresh cache's greedy continuation is %v", round, got, want)
				}
				if n := d.e.cache.Len(); n != len(d.e.tokens) || commonPrefix(d.e.tokens, hist) != len(hist) {
					t.Fatalf("round %d: draft cache holds %d positions for %d tokens, not history and drafts", round, n, len(d.e.tokens))
				}
				keep := rng.IntN(k + 1)
				hist = append(append(hist, got[:keep]...), int32(10+rng.IntN(vocab-10)))
			}
			first := d.e
			d.close()
			d2 := &drafter{m: m, vocab: vocab, pool: pool}
			got, err := d2.draft(ctx, hist[:len(hist)-3], 2)
			if err != nil {
				t.Fatal(err)
			}
			if d2.e != first || len(pool.entries) != 0 {
				t.Fatal("a second generation over a shared prefix did not take the first one's draft cache")
			}
			if want := greedy(hist[:len(hist)-3], 2); !slices.Equal(got, want) {
				t.Fatalf("second generation drafted %v, want %v", got, want)
			}
			d2.close()
		})
	}
}

// TestSampledDraftsHonourConstraints: unseeded requests at temperature 1
// (sampled drafts, speculative sampling's rule) under a response_format
// and a forced tool call, on a runner whose model drafts for itself
// (without the grammar: a draft the mask forbids is always replaced),
// give documents of the schema and calls with valid arguments.
func TestSampledDraftsHonourConstraints(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 4096}
	s := startTinyServer(t, spec, func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools = g.NewConstraint, true
		o.Speculative, o.SpecTokens, o.Draft, o.specForce = SpecDraft, 4, o.Model, true
	})
	msgs := []map[string]any{{"role": "user", "content": "one two three four, one two three four"}}
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	for i := range 6 {
		var out struct {
			Choices []struct {
				Message struct {
					Content   string
					ToolCalls []struct {
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
			}
		}
		body := map[string]any{"messages": msgs, "max_tokens": 1000, "temperature": 1, "response_format": point}
		if i%2 == 1 {
			body = map[string]any{"messages": msgs, "max_tokens": 1000, "temperature": 1, "tools": []any{cityTool}, "tool_choice": "required"}
		}
		raw := answerOf(t, s.url, body)
		if err := json.Unmarshal([]byte(raw), &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("answer %s: %v", raw, err)
		}
		docs := []string{out.Choices[0].Message.Content}
		if i%2 == 1 {
			calls := out.Choices[0].Message.ToolCalls
			if len(calls) == 0 {
				t.Fatalf("no tool call in %s", raw)
			}
			docs = docs[:0]
			for _, c := range calls {
				if c.Function.Name != "get_weather" {
					t.Fatalf("call of %q in %s", c.Function.Name, raw)
				}
				docs = append(docs, c.Function.Arguments)
			}
		}
		for _, doc := range docs {
			var v map[string]any
			if err := json.Unmarshal([]byte(doc), &v); err != nil {
				t.Fatalf("request %d: %q is not a JSON document: %v", i, doc, err)
			}
			_, hasX := v["x"]
			_, hasCity := v["city"]
			if i%2 == 0 && (!hasX || len(v) != 2) || i%2 == 1 && (!hasCity || len(v) != 1) {
				t.Fatalf("request %d: %s breaks its schema", i, doc)
			}
		}
	}
	accepted, rejected := 0, 0
	for _, r := range s.srv.journal.since(0) {
		accepted, rejected = accepted+r.SpecAccepted, rejected+r.SpecRejected
	}
	if rejected == 0 {
		t.Fatalf("%d drafted tokens kept, %d replaced: the rule never replaced a draft the grammar forbids", accepted, rejected)
	}
	t.Logf("%d drafted tokens kept, %d replaced", accepted, rejected)
}

// TestDraftingStopsWhenProbesCost: a generation whose drafts do not pay
// probes its draft model after growing gaps while feeding the draft the
// plain steps' tokens is cheap, and stops drafting instead of its first
// probe once that catch-up costs more than specDraftCatchup per token.
func TestDraftingStopsWhenProbesCost(t *testing.T) {
	for _, c := range []struct {
		catch float64 // seconds per caught-up token, a plain step being 1 s
		stops bool
	}{{0.01, false}, {0.2, true}} {
		sp := newSpeculator(nil, 0, 8)
		sp.d = &drafter{step: 0.1, catch: c.catch}
		linearSteps(&sp.own, 1, 0.5, 10)
		sp.ok[0], sp.fail[0] = 1, 9 // acceptance 0.1: drafting does not pay
		probes := 0
		for range 40 {
			switch k := sp.draftPlan(8); {
			case k == 1:
				probes++
			case k != 0:
				t.Fatalf("catch-up %v: planned %d drafted tokens at acceptance 0.1", c.catch, k)
			}
		}
		if sp.d.off != c.stops || c.stops && probes != 0 || !c.stops && probes < 4 {
			t.Errorf("catch-up %v: stopped %v after %d probes", c.catch, sp.d.off, probes)
		}
	}
}
