package decode

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// BenchmarkSpeculativeDraftPair: greedy decode of a generated 8-layer
// llama (hidden 512, f32) on the cpu backend (one thread) through a decode
// Server, without and with a draft model (the one-layer model of the same
// seed, which shares its embedding, first layer and head), interleaved in
// one run. It fails unless both give the same text. By LayerGain of the
// pair: 1 (the generator's default: every layer moves the residual as much
// as the embedding, so the draft rarely agrees: what drafting costs when it
// cannot help) and 0.05 (the layers refine what the first decides, as a
// distilled draft's target would: what it gains when the draft agrees).
// Greedy (temp=0), and seeded and unseeded at temperature 1 (temp=1: a
// seeded request drafts the draft's argmax, a point mass, and its text must
// equal plain decoding's; an unseeded one samples its drafts, verified by
// speculative sampling's rule: "sampled"). Reported: each mode's decode
// tok/s (after the first token), its ratio to off, and the share of
// drafted tokens accepted (b.ReportMetric: SetBytes'
// MB/s would print 0.00 at tens of tokens per second).
func BenchmarkSpeculativeDraftPair(b *testing.B) {
	const tokens = 128
	// EXO_BENCH_BACKEND=mlx (with EXO_MLXC_PATH) runs it on MLX's CPU
	// device instead (benchBackend).
	be := benchBackend(b)
	load := func(spec testmodel.Spec, beside *engine.Model) (*engine.Model, string) {
		dir := filepath.Join(b.TempDir(), fmt.Sprintf("l%d", spec.Layers))
		if err := testmodel.Write(dir, spec); err != nil {
			b.Fatal(err)
		}
		m, err := engine.Load(context.Background(), dir, be, engine.LoadOptions{Beside: beside})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m, dir
	}
	for _, gain := range []float64{1, 0.05} {
		b.Run(fmt.Sprintf("gain=%g", gain), func(b *testing.B) {
			spec := testmodel.Spec{Arch: "llama", Seed: 11, Layers: 8, Hidden: 512, Heads: 8, KVHeads: 4, Intermediate: 1536,
				MaxPositions: 1024, LayerGain: gain}
			target, dir := load(spec, nil)
			spec.Layers = 1
			draft, _ := load(spec, target) // as the runner does (LoadDraft)
			tok, err := tokenizer.Load(dir)
			if err != nil {
				b.Fatal(err)
			}
			text := NewText(tok, nil)
			servers := map[string]*Server{}
			for _, mode := range []string{SpecOff, SpecDraft} {
				o := Options{Name: "m", Model: target, Text: text, NewSampler: NewSampler, NewStopMatcher: NewStopMatcher,
					MaxBatch: 1, CacheEntries: -1, Speculative: mode}
				if mode == SpecDraft {
					o.Draft = draft
				}
				s := New(o)
				b.Cleanup(s.Close)
				servers[mode] = s
			}
			prompt := text.Encode("Write a short story about a lighthouse keeper who finds a message in a bottle.")
			type variant struct {
				label, mode string
				seeded      bool
			}
			for _, temp := range []float64{0, 1} {
				vs := []variant{{"off", SpecOff, true}, {"draft", SpecDraft, true}}
				if temp > 0 {
					vs = append(vs, variant{"sampled", SpecDraft, false})
				}
				b.Run(fmt.Sprintf("temp=%g", temp), func(b *testing.B) {
					rate := map[string]float64{}
					accepted, verified := map[string]int{}, map[string]int{}
					seed := int64(0)
					for b.Loop() {
						seed++
						var texts []string
						for _, v := range vs {
							s := servers[v.mode]
							var em textEmitter
							req := &gen.Request{PromptIDs: prompt, MaxTokens: tokens, IgnoreEOS: true,
								Sampling: gen.Sampling{Temperature: temp, Seed: seed, SeedSet: v.seeded}}
							if _, err := s.Generate(context.Background(), req, &em); err != nil {
								b.Fatal(err)
							}
							j := s.journal.since(0)
							r := j[len(j)-1]
							rate[v.label] += r.TokensPerSecond
							accepted[v.label] += r.SpecAccepted
							verified[v.label] += r.SpecAccepted + r.SpecRejected
							texts = append(texts, em.String())
						}
						if texts[0] != texts[1] {
							b.Fatalf("speculative text differs from plain:\n%q\n%q", texts[1], texts[0])
						}
					}
					for _, v := range vs {
						b.ReportMetric(rate[v.label]/float64(b.N), v.label+"-tok/s")
						if v.mode == SpecDraft {
							b.ReportMetric(rate[v.label]/rate["off"], v.label+"-speedup")
							if verified[v.label] > 0 {
								b.ReportMetric(float64(accepted[v.label])/float64(verified[v.label]), v.label+"-acceptance")
							}
						}
					}
				})
			}
		})
	}
}
