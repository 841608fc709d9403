package decode

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// codeFile is a ~100-line Python file whose answer to "rename one name"
// repeats most of it.
func codeFile() string {
	var b strings.Builder
	b.WriteString("import math\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass Item:\n    name: str\n    price: float\n    quantity: int\n\n\n")
	for i, f := range []string{"apples", "pears", "plums", "grapes", "lemons", "cherries", "peaches", "melons"} {
		fmt.Fprintf(&b, "def total_%s(items):\n", f)
		fmt.Fprintf(&b, "    \"\"\"Return the total price of the %s in items.\"\"\"\n", f)
		b.WriteString("    total = 0.0\n")
		b.WriteString("    for item in items:\n")
		fmt.Fprintf(&b, "        if item.name == %q:\n", f)
		fmt.Fprintf(&b, "            total += compute_price(item) * %d\n", i+1)
		b.WriteString("    return round(total, 2)\n\n\n")
	}
	b.WriteString("def compute_price(item):\n    \"\"\"Price of one line: price times quantity, never negative.\"\"\"\n")
	b.WriteString("    return max(0.0, item.price * item.quantity)\n\n\n")
	b.WriteString("def main():\n    items = [Item(\"apples\", 0.5, 10), Item(\"pears\", 0.75, 4), Item(\"plums\", 1.25, 2)]\n")
	b.WriteString("    print(total_apples(items), total_pears(items), total_plums(items))\n")
	b.WriteString("    print(math.fsum(compute_price(i) for i in items))\n\n\n")
	b.WriteString("if __name__ == \"__main__\":\n    main()\n")
	return b.String()
}

// BenchmarkSpeculativeSmolLM2: SmolLM2 greedy decode tok/s on the cpu
// backend (one thread) through a decode Server, without and with
// prompt-lookup speculation, interleaved in one run, for a code edit (a
// ~100-line file and an instruction to rename one function: the answer
// repeats most of the file) and an open chat prompt. It fails unless both
// modes produce the same text. Reported: each mode's decode tok/s (after
// the first token), their ratio and the share of drafted tokens accepted.
func BenchmarkSpeculativeSmolLM2(b *testing.B) {
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
	servers := map[string]*Server{}
	for _, mode := range []string{SpecOff, SpecPromptLookup} {
		st, err := NewSetup("m", m, path, gen.Defaults{})
		if err != nil {
			b.Fatal(err)
		}
		o := st.Options
		o.Speculative, o.CacheEntries = mode, -1
		s := New(o)
		defer s.Close()
		servers[mode] = s
	}
	for _, w := range []struct {
		name, prompt string
		tokens       int
	}{
		{"code-edit", "Rename the function compute_price to line_price everywhere in this file. Reply with the whole file and nothing else.\n\n```python\n" + codeFile() + "```", 400},
		{"chat", "Write a short story about a lighthouse keeper who finds a message in a bottle.", 200},
	} {
		b.Run(w.name, func(b *testing.B) {
			rate := map[string]float64{}
			var accepted, verified int
			for b.Loop() {
				var texts []string
				for _, mode := range []string{SpecOff, SpecPromptLookup} {
					s := servers[mode]
					var em textEmitter
					req := &gen.Request{Chat: true, AddGenerationPrompt: true, MaxTokens: w.tokens, IgnoreEOS: true,
						Messages: []gen.Message{{Role: "user", Content: w.prompt}}}
					if _, err := s.Generate(context.Background(), req, &em); err != nil {
						b.Fatal(err)
					}
					j := s.journal.since(0)
					r := j[len(j)-1]
					rate[mode] += r.TokensPerSecond
					accepted, verified = accepted+r.SpecAccepted, verified+r.SpecAccepted+r.SpecRejected
					texts = append(texts, em.String())
				}
				if texts[0] != texts[1] {
					b.Fatalf("speculative text differs from plain:\n%q\n%q", texts[1], texts[0])
				}
			}
			b.ReportMetric(rate[SpecOff]/float64(b.N), "off-tok/s")
			b.ReportMetric(rate[SpecPromptLookup]/float64(b.N), "spec-tok/s")
			b.ReportMetric(rate[SpecPromptLookup]/rate[SpecOff], "speedup")
			if verified > 0 {
				b.ReportMetric(float64(accepted)/float64(verified), "acceptance")
			}
		})
	}
}
