//go:build mlx

package decode

import (
	"os"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
)

// TestSpeculativeEqualsPlainMLX is TestSpeculativeEqualsPlain on the MLX
// backend (CPU device): on every architecture family of the tiny models,
// prompt lookup and a draft model answer every request kind as plain
// decoding on MLX does (logprobs within 1e-4: a verification's rows come
// from a forward of several positions), and drafts were accepted.
func TestSpeculativeEqualsPlainMLX(t *testing.T) {
	b, err := backend.Open("mlx", backend.Options{LibPath: os.Getenv("EXO_MLXC_PATH"), Device: "cpu"})
	if err != nil {
		t.Skip(err)
	}
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
			plain := serveTinyOn(t, b, dir, with(SpecOff))
			want := map[string]string{}
			for name, body := range specRequests() {
				want[name] = answerOf(t, plain.url, body)
			}
			for _, mode := range []string{SpecPromptLookup, SpecDraft} {
				spec := serveTinyOn(t, b, dir, with(mode))
				if spec.srv.specMax != 5 {
					t.Fatalf("%s: speculation refused: %s", mode, specRefusal(spec.srv.o.Model))
				}
				for name, body := range specRequests() {
					if got := answerOf(t, spec.url, body); !sameAnswer(got, want[name], 1e-4) {
						t.Fatalf("%s, %s: speculative answer on MLX\n%s\nplain\n%s", mode, name, got, want[name])
					}
				}
				accepted := 0
				for _, r := range spec.srv.journal.since(0) {
					accepted += r.SpecAccepted
				}
				if accepted == 0 {
					t.Fatalf("%s: no drafted token was accepted", mode)
				}
			}
		})
	}
}
