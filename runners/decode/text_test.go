package decode

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// scriptModel is a Model whose logits after each step pick the next token
// of a script (then EOS); its caches only count positions.
type scriptModel struct {
	Model
	script []int32
	eos    int32
	vocab  int
	plen   int // prompt tokens (0: 1)
}

type countCache struct {
	engine.KVCache
	n int
}

func (c *countCache) Len() int       { return c.n }
func (c *countCache) Truncate(n int) { c.n = n }
func (c *countCache) Free()          {}

// CanTruncate: a count can go back anywhere (KVCache gained it on main
// with sliding-window layers).
func (c *countCache) CanTruncate(n int) bool { return n <= c.n }

func (m *scriptModel) Info() engine.ModelInfo {
	return engine.ModelInfo{Vocab: m.vocab, MaxPositions: 4096}
}
func (m *scriptModel) NewCache() engine.KVCache { return &countCache{} }

func (m *scriptModel) logits(i int) []float32 {
	l := make([]float32, m.vocab)
	next := m.eos
	if i < len(m.script) {
		next = m.script[i]
	}
	l[next] = 1
	return l
}

func (m *scriptModel) Prefill(_ context.Context, c engine.KVCache, toks []int32, _ int, _ func(int, int) error) error {
	c.(*countCache).n += len(toks)
	return nil
}

func (m *scriptModel) Forward(_ context.Context, c engine.KVCache, toks []int32) ([]float32, error) {
	cc := c.(*countCache)
	cc.n += len(toks)
	return m.logits(cc.n - m.promptLen()), nil
}

func (m *scriptModel) ForwardBatch(ctx context.Context, cs []engine.KVCache, toks []int32) ([][]float32, error) {
	out := make([][]float32, len(cs))
	for i := range cs {
		l, _ := m.Forward(ctx, cs[i], toks[i:i+1])
		out[i] = l
	}
	return out, nil
}

// promptLen: the tests' prompt is one token ("a") unless plen says.
func (m *scriptModel) promptLen() int { return max(1, m.plen) }

type textEmitter struct{ strings.Builder }

func (e *textEmitter) Start(int) error { return nil }
func (e *textEmitter) Text(s string, _ *gen.TokenLogprob) error {
	e.WriteString(s)
	return nil
}

// TestGenerationFlushesPartialUTF8: a generation whose last tokens leave an
// unfinished UTF-8 sequence ends with U+FFFD, as HF's decode of the same
// ids gives, instead of losing those bytes.
func TestGenerationFlushesPartialUTF8(t *testing.T) {
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny_qwen2")
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode("a")
	if len(prompt) != 1 {
		t.Fatalf("prompt %v: want one token", prompt)
	}
	// byte-level tokens: "x", then the first two bytes of "€" (E2 82 AC)
	var script []int32
	for _, piece := range []string{"x", "\u00e2", "\u0124"} { // byte-level forms of 'x', 0xE2, 0x82
		id := tokenID(t, tok, piece)
		script = append(script, id)
	}
	m := &scriptModel{script: script, eos: tok.EOS()[0], vocab: tok.VocabSize()}
	s := New(Options{Name: "m", Model: m, Text: NewText(tok, nil), NewSampler: NewSampler,
		NewStopMatcher: NewStopMatcher, MaxBatch: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer s.Close()
	var em textEmitter
	res, err := s.Generate(context.Background(), &gen.Request{Model: "m", Prompt: "a", MaxTokens: 10}, &em)
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Decode(script); em.String() != want || want != "x\uFFFD" {
		t.Errorf("streamed %q, Decode %q, want %q", em.String(), want, "x\uFFFD")
	}
	if res.CompletionTokens != 3 || res.FinishReason != "stop" {
		t.Errorf("result %+v", res)
	}
}

func tokenID(t *testing.T, tok *tokenizer.Tokenizer, s string) int32 {
	t.Helper()
	for id := range int32(tok.VocabSize()) {
		if tok.Token(id) == s {
			return id
		}
	}
	t.Fatalf("no token %q", s)
	return -1
}
