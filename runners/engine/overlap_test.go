package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// TestGreedyOverlapEqualsSerial: on every architecture family of the tiny
// models, overlapped greedy decode (StartGreedy, Next, Stop) gives token
// for token what ForwardBatch with a host argmax gives, alone and batched
// over prompts of different lengths; after Stop the caches hold what the
// serial caches hold (same length, and the same next logits' argmax).
// Hybrid models are refused with ErrNoOverlap.
func TestGreedyOverlapEqualsSerial(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]func(t *testing.T) string{}
	for _, arch := range []string{"llama", "qwen3", "qwen3moe", "gemma3", "gptoss"} {
		dirs[arch] = func(t *testing.T) string {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 9}); err != nil {
				t.Fatal(err)
			}
			return dir
		}
	}
	dirs["qwen3_next"] = func(*testing.T) string { return filepath.Join("testdata", "reference", "qwen3_next") }
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			m, err := engine.Load(context.Background(), dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for _, n := range []int{1, 3} {
				CheckGreedyOverlap(t, m, n, 12, name == "qwen3_next")
			}
		})
	}
}

// CheckGreedyOverlap decodes steps tokens greedily for n prompts, serially
// and overlapped, and fails unless they agree (see
// TestGreedyOverlapEqualsSerial). With refused it wants ErrNoOverlap.
func CheckGreedyOverlap(t *testing.T, m *engine.Model, n, steps int, refused bool) {
	t.Helper()
	ctx := context.Background()
	mk := func() ([]engine.KVCache, []int32) {
		cs := make([]engine.KVCache, n)
		last := make([]int32, n)
		for i := range cs {
			p := make([]int32, 5+3*i) // lengths differ
			for j := range p {
				p[j] = int32(1 + (7*j+11*i)%(m.Info().Vocab-1))
			}
			cs[i] = m.NewCache()
			if _, err := m.Forward(ctx, cs[i], p[:len(p)-1]); err != nil {
				t.Fatal(err)
			}
			last[i] = p[len(p)-1]
		}
		return cs, last
	}
	free := func(cs []engine.KVCache) {
		for _, c := range cs {
			c.Free()
		}
	}
	serial, toks := mk()
	defer free(serial)
	var want [][]int32
	for range steps {
		rows, err := m.ForwardBatch(ctx, serial, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			toks[i] = int32(argmax(r))
		}
		want = append(want, slices.Clone(toks))
	}
	over, start := mk()
	defer free(over)
	o, err := m.StartGreedy(ctx, over, start)
	if refused {
		if !errors.Is(err, engine.ErrNoOverlap) {
			t.Fatalf("StartGreedy on a hybrid model: %v, want ErrNoOverlap", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		got, err := o.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[s]) {
			t.Fatalf("batch of %d, step %d: overlapped tokens %v, serial %v", n, s, got, want[s])
		}
	}
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
	// The serial caches hold the prompt and steps-1 picks (the last pick
	// not fed); so must the overlapped ones, with the same content.
	for i := range over {
		if over[i].Len() != serial[i].Len() {
			t.Fatalf("after Stop cache %d holds %d, serial %d", i, over[i].Len(), serial[i].Len())
		}
		a, err := m.Forward(ctx, over[i], toks[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		ga := argmax(a)
		w, err := m.Forward(ctx, serial[i], toks[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if ga != argmax(w) {
			t.Fatalf("after Stop cache %d continues with %d, serial %d", i, ga, argmax(w))
		}
	}
}

// TestSampledOverlapEqualsSerial: an Overlap whose rows are picked by
// SampleSpecs (seeded temperature, top-k, top-p, min-p, penalties with
// their history and counts, logit bias, greedy) gives token for token
// what ForwardBatch followed by each row's own sample.Sampler gives, the
// draws coming from a Sampler of the same seed (Uniform); after Stop the
// caches hold what the serial ones hold.
func TestSampledOverlapEqualsSerial(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 9}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ps := []sample.Params{
		{Temperature: 1, Seed: 1},
		{Temperature: 0.7, TopK: 5, Seed: 2},
		{Temperature: 1.1, TopP: 0.8, MinP: 0.05, Seed: 3},
		{Temperature: 1, FrequencyPenalty: 0.7, PresencePenalty: -1, RepetitionPenalty: 1.3, Seed: 4},
		{RepetitionPenalty: 1.5, PresencePenalty: -2, LogitBias: map[int32]float32{3: 4, 5: -100}},
		{},
	}
	testmodel.CheckSampledOverlap(t, m, ps, 14)
}

// TestOverlapFeaturesEqualSerial: an Overlap whose rows ask for logprobs,
// are constrained by a mask made on the host from the row's last token
// (a grammar's shape: the step's forward and its pick are two graphs)
// and end after their own number of steps (left out of the next steps),
// greedy and sampled in one batch, gives serial decoding's tokens and
// logprobs (testmodel.CheckOverlapFeatures).
func TestOverlapFeaturesEqualSerial(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 9}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ps := []sample.Params{
		{},
		{},
		{Temperature: 1, Seed: 1},
		{Temperature: 0.7, TopK: 5, Seed: 2},
		{Temperature: 1.1, TopP: 0.8, MinP: 0.05, Seed: 3, RepetitionPenalty: 1.3},
		{PresencePenalty: -1, LogitBias: map[int32]float32{3: 4, 5: -100}},
	}
	testmodel.CheckOverlapFeatures(t, m, ps, 12, 0)
	// greedy rows only: the argmax and device-side logprobs alone
	testmodel.CheckOverlapFeatures(t, m, []sample.Params{{}, {}, {}}, 8, 0)
	// one row alone, bounded: no step past its last
	testmodel.CheckOverlapFeatures(t, m, []sample.Params{{Temperature: 1, Seed: 5}}, 6, 0)
}

// TestOverlapMaskFails: a row whose Mask fails is reported by Failed
// (row and error) after the call that asked it, the other rows' tokens
// still come, and Stop leaves the caches as serial decoding of the tokens
// returned would; an Accept that fails fails Next.
func TestOverlapMaskFails(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 9}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	mk := func() []engine.KVCache {
		cs := []engine.KVCache{m.NewCache(), m.NewCache()}
		for i, c := range cs {
			if _, err := m.Forward(ctx, c, []int32{1, 2, int32(3 + i)}); err != nil {
				t.Fatal(err)
			}
		}
		return cs
	}
	boom := errors.New("no token allowed")
	calls := 0
	specs := []engine.SampleSpec{{}, {Mask: func(dst []float32) error {
		if calls++; calls == 3 {
			return boom
		}
		return nil
	}}}
	cs := mk()
	o, err := m.StartOverlap(ctx, cs, []int32{4, 5}, specs)
	if err != nil {
		t.Fatal(err)
	}
	if row, err := o.Failed(); err != nil {
		t.Fatalf("row %d failed at the start: %v", row, err)
	}
	for step := 1; step <= 2; step++ {
		if _, err := o.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	row, err := o.Failed()
	if row != 1 || !errors.Is(err, boom) {
		t.Fatalf("Failed after the third mask: row %d, %v", row, err)
	}
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		if c.Len() != 3+2 { // the prompt, the start token and the first returned token
			t.Fatalf("cache %d holds %d after Stop, want 5", i, c.Len())
		}
	}
	// an Accept that fails fails Next
	specs[1].Mask = nil
	specs[1].Accept = func(int32) error { return boom }
	o, err = m.StartOverlap(ctx, mk(), []int32{4, 5}, specs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Next(ctx); !errors.Is(err, boom) {
		t.Fatalf("Next with a failing Accept: %v", err)
	}
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestOverlapDrain: after Drain the next Next returns the step in
// flight's tokens and queues nothing (Caches empty, a further Next
// refused); the caches keep that step, so that decoding goes on serially
// from its tokens exactly as greedy serial decoding does, and Stop has
// nothing to drop.
func TestOverlapDrain(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 9}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	prompts := [][]int32{{3, 9, 4, 1, 7}, {5, 2, 8, 6, 2, 3, 1, 4}}
	mk := func() []engine.KVCache {
		cs := make([]engine.KVCache, len(prompts))
		for i, p := range prompts {
			cs[i] = m.NewCache()
			if _, err := m.Forward(ctx, cs[i], p[:len(p)-1]); err != nil {
				t.Fatal(err)
			}
		}
		return cs
	}
	// serial greedy: want[s] are the tokens of step s
	serial := mk()
	toks := []int32{prompts[0][4], prompts[1][7]}
	var want [][]int32
	for range 6 {
		rows, err := m.ForwardBatch(ctx, serial, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			toks[i] = int32(argmax(r))
		}
		want = append(want, slices.Clone(toks))
	}
	for _, k := range []int{0, 2} { // Drain after k Nexts
		over := mk()
		o, err := m.StartGreedy(ctx, over, []int32{prompts[0][4], prompts[1][7]})
		if err != nil {
			t.Fatal(err)
		}
		for s := range k {
			if got, err := o.Next(ctx); err != nil || !slices.Equal(got, want[s]) {
				t.Fatalf("step %d: %v, %v; want %v", s, got, err, want[s])
			}
		}
		o.Drain()
		got, err := o.Next(ctx)
		if err != nil || !slices.Equal(got, want[k]) {
			t.Fatalf("drained after %d: %v, %v; want %v", k, got, err, want[k])
		}
		if c := o.Caches(); c != nil {
			t.Fatalf("drained overlap still has %d rows in flight", len(c))
		}
		if _, err := o.Next(ctx); err == nil {
			t.Fatal("Next after the drained step: no error")
		}
		if err := o.Stop(); err != nil {
			t.Fatal(err)
		}
		for i, c := range over {
			if c.Len() != len(prompts[i])+k {
				t.Fatalf("drained after %d: cache %d holds %d, want %d", k, i, c.Len(), len(prompts[i])+k)
			}
			lg, err := m.Forward(ctx, c, want[k][i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			if g := int32(argmax(lg)); g != want[k+1][i] {
				t.Fatalf("drained after %d: cache %d continues with %d, serial %d", k, i, g, want[k+1][i])
			}
			c.Free()
		}
	}
	for _, c := range serial {
		c.Free()
	}
}
