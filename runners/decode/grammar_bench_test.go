package decode

import (
	"context"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// BenchmarkSmolLM2DecodeSchema: SmolLM2 greedy decode tok/s on one core,
// unconstrained and under a JSON Schema (the mask of each step computed
// while the backend computes it, as the decode runner does), same run.
// Both generate the same number of tokens (the schema's free strings keep
// it going).
func BenchmarkSmolLM2DecodeSchema(b *testing.B) {
	path := testenv.SmolLM2(b)
	be, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	m, err := engine.Load(context.Background(), path, be, engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	tok, err := tokenizer.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := chat.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	text, err := tmpl.Render([]chat.Message{{Role: "user", Content: "Describe three famous cities as JSON."}}, true)
	if err != nil {
		b.Fatal(err)
	}
	prompt := tok.Encode(text)
	g := &Grammars{Text: NewText(tok, tmpl)}
	v, err := g.vocabulary()
	if err != nil {
		b.Fatal(err)
	}
	gr, err := grammar.Compile([]byte(`{"type":"object","properties":{"cities":{"type":"array","items":{"type":"object",
		"properties":{"name":{"type":"string"},"country":{"type":"string"},"description":{"type":"string"}},
		"required":["name","country","description"],"additionalProperties":false}}},"required":["cities"],"additionalProperties":false}`))
	if err != nil {
		b.Fatal(err)
	}
	const n = 48
	run := func(b *testing.B, constrained bool) {
		var tokens int
		var spent time.Duration
		for b.Loop() {
			c := m.NewCache()
			logits, err := m.Forward(context.Background(), c, prompt)
			if err != nil {
				b.Fatal(err)
			}
			var cons *maskConstraint
			if constrained {
				cons = newMaskConstraint(grammar.NewConstraint(gr, v), v)
			}
			t0 := time.Now()
			masked := make([]float32, len(logits))
			for i := 0; i < n; i++ {
				sl := logits
				if cons != nil {
					copy(masked, logits)
					if err := cons.Mask(masked); err != nil {
						b.Fatal(err)
					}
					sl = masked
				}
				next := int32(argmax(sl))
				if cons != nil {
					if err := cons.Accept(next); err != nil {
						b.Fatal(err)
					}
					if cons.Done() {
						b.Fatalf("the document ended after %d tokens", i)
					}
				}
				tokens++
				if logits, err = m.Forward(context.Background(), c, []int32{next}); err != nil {
					b.Fatal(err)
				}
			}
			spent += time.Since(t0)
			if cons != nil {
				cons.Close()
			}
		}
		b.ReportMetric(float64(tokens)/spent.Seconds(), "tok/s")
	}
	b.Run("unconstrained", func(b *testing.B) { run(b, false) })
	b.Run("schema", func(b *testing.B) { run(b, true) })
}
