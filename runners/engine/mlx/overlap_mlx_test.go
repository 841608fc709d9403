//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/sample"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// TestGreedyOverlapEqualsSerialMLX: on MLX, overlapped greedy decode
// (the next step built from the device's argmax and queued with
// async_eval before the tokens are read) gives token for token what
// serial ForwardBatch with a host argmax gives, alone and batched, on
// tiny models (full attention; gemma3's sliding-window ring caches) and
// on SmolLM2; after Stop the caches continue as the serial ones do.
func TestGreedyOverlapEqualsSerialMLX(t *testing.T) {
	b := newTestBackend(t)
	for _, arch := range []string{"llama", "gemma3"} { // gemma3: sliding-window ring caches
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 9}); err != nil {
			t.Fatal(err)
		}
		tiny := load(t, dir, b)
		for _, n := range []int{1, 3} {
			checkOverlap(t, tiny, nil, n, 16)
		}
	}
	path := testenv.SmolLM2(t)
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	smol := load(t, path, b)
	var prompts [][]int32
	for _, text := range smolPrompts {
		prompts = append(prompts, tok.Encode(text))
	}
	for _, n := range []int{1, 3} {
		checkOverlap(t, smol, prompts, n, 24)
	}
}

func checkOverlap(t *testing.T, m *engine.Model, prompts [][]int32, n, steps int) {
	t.Helper()
	ctx := context.Background()
	mk := func() ([]engine.KVCache, []int32) {
		cs := make([]engine.KVCache, n)
		last := make([]int32, n)
		for i := range cs {
			var p []int32
			if prompts != nil {
				p = prompts[i%len(prompts)]
			} else {
				p = make([]int32, 5+3*i)
				for j := range p {
					p[j] = int32(1 + (7*j+11*i)%(m.Info().Vocab-1))
				}
			}
			cs[i] = m.NewCache()
			forward(t, m, cs[i], p[:len(p)-1]...)
			last[i] = p[len(p)-1]
		}
		t.Cleanup(func() {
			for _, c := range cs {
				c.Free()
			}
		})
		return cs, last
	}
	serial, toks := mk()
	var want [][]int32
	for range steps {
		rows, err := m.ForwardBatch(ctx, serial, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			toks[i] = argmax(r)
		}
		want = append(want, slices.Clone(toks))
	}
	over, start := mk()
	o, err := m.StartGreedy(ctx, over, start)
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		got, err := o.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[s]) {
			t.Fatalf("batch of %d, step %d: overlapped %v, serial %v", n, s, got, want[s])
		}
	}
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range over {
		if over[i].Len() != serial[i].Len() {
			t.Fatalf("after Stop cache %d holds %d, serial %d", i, over[i].Len(), serial[i].Len())
		}
		if a, w := argmax(forward(t, m, over[i], toks[i])), argmax(forward(t, m, serial[i], toks[i])); a != w {
			t.Fatalf("after Stop cache %d continues with %d, serial %d", i, a, w)
		}
	}
	t.Logf("batch of %d: %d overlapped greedy steps equal serial decode: %v", n, steps, want[len(want)-1])
}

// TestSampledOverlapEqualsSerialMLX: on MLX, an Overlap whose rows are
// picked on the device (SampleRows: seeded temperature, top-k, top-p,
// min-p, penalties, logit bias, greedy, all in one batch) gives token for
// token what serial steps with each row's sample.Sampler on the host
// give, on tiny models (full attention; gemma3's ring caches).
func TestSampledOverlapEqualsSerialMLX(t *testing.T) {
	b := newTestBackend(t)
	ps := []sample.Params{
		{Temperature: 1, Seed: 1},
		{Temperature: 0.7, TopK: 5, Seed: 2},
		{Temperature: 1.1, TopP: 0.8, MinP: 0.05, Seed: 3},
		{Temperature: 1, FrequencyPenalty: 0.7, PresencePenalty: -1, RepetitionPenalty: 1.3, Seed: 4},
		{RepetitionPenalty: 1.5, PresencePenalty: -2, LogitBias: map[int32]float32{3: 4, 5: -100}},
		{},
	}
	for _, arch := range []string{"llama", "gemma3"} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 9}); err != nil {
			t.Fatal(err)
		}
		testmodel.CheckSampledOverlap(t, load(t, dir, b), ps, 16)
	}
}

// TestOverlapFeaturesEqualSerialMLX: on MLX, rows that ask for logprobs
// (computed on the device: RowLogprobs), rows constrained by a host mask
// that depends on their last token (the forward queued before the mask
// is made, then a pick graph with the mask: SampleRows' mask) and rows
// that end after their own number of steps (left out of the next
// steps), greedy and sampled in one batch, give serial decoding's tokens,
// and its logprobs within float32 rounding (testmodel.CheckOverlapFeatures).
func TestOverlapFeaturesEqualSerialMLX(t *testing.T) {
	b := newTestBackend(t)
	ps := []sample.Params{
		{},
		{},
		{Temperature: 1, Seed: 1},
		{Temperature: 0.7, TopK: 5, Seed: 2},
		{Temperature: 1.1, TopP: 0.8, MinP: 0.05, Seed: 3, RepetitionPenalty: 1.3},
		{PresencePenalty: -1, LogitBias: map[int32]float32{3: 4, 5: -100}},
	}
	for _, arch := range []string{"llama", "gemma3"} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 9}); err != nil {
			t.Fatal(err)
		}
		m := load(t, dir, b)
		testmodel.CheckOverlapFeatures(t, m, ps, 12, 1e-4)
		testmodel.CheckOverlapFeatures(t, m, []sample.Params{{}, {}, {}}, 8, 1e-4)
		testmodel.CheckOverlapFeatures(t, m, []sample.Params{{Temperature: 1, Seed: 5}}, 6, 1e-4)
	}
}
