package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAdjustTable checks logit bias and the three penalties against values
// computed by hand from their definitions (OpenAI: l -= c·freq + [c>0]·pres
// over generated tokens; HF: positive logits ÷ rp, negative × rp over the
// history; bias added first, -100 bans).
func TestAdjustTable(t *testing.T) {
	inf := float32(math.Inf(-1))
	cases := []struct {
		name      string
		p         Params
		logits    []float32
		history   []int32
		generated []int32 // tokens the sampler returned before (forced by greedy picks)
		want      []float32
	}{
		{"nothing applies", Params{}, []float32{1, 2, 3}, []int32{0}, nil, []float32{1, 2, 3}},
		{"bias adds", Params{LogitBias: map[int32]float32{0: 2.5, 2: -1}}, []float32{1, 2, 3}, nil, nil, []float32{3.5, 2, 2}},
		{"bias -100 bans", Params{LogitBias: map[int32]float32{1: -100}}, []float32{1, 2, 3}, nil, nil, []float32{1, inf, 3}},
		{"bias out of range ignored", Params{LogitBias: map[int32]float32{7: 5}}, []float32{1, 2}, nil, nil, []float32{1, 2}},
		{"repetition then bias order", Params{LogitBias: map[int32]float32{0: 1}, RepetitionPenalty: 2}, []float32{3, -2}, []int32{0, 1}, nil,
			[]float32{(3 + 1) / 2.0, -2 * 2}},
		{"frequency counts repeats", Params{FrequencyPenalty: 0.5}, []float32{4, 4, 4}, nil, []int32{0, 0, 0}, []float32{4 - 1.5, 4, 4}},
		{"presence once", Params{PresencePenalty: 0.75}, []float32{4, 4, 4}, nil, []int32{0, 0}, []float32{4 - 0.75, 4, 4}},
		{"both", Params{PresencePenalty: 1, FrequencyPenalty: 0.25}, []float32{5, 1, 0}, nil, []int32{0, 0}, []float32{5 - 2*0.25 - 1, 1, 0}},
		{"negative raises", Params{PresencePenalty: -1}, []float32{0, 1}, nil, []int32{0}, []float32{1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := New(c.p)
			for _, g := range c.generated {
				// a logit vector whose argmax is g makes the greedy sampler return g
				l := make([]float32, len(c.logits))
				l[g] = 1000
				if got := s.Sample(l, nil); got != g {
					t.Fatalf("setup: sampled %d, want %d", got, g)
				}
			}
			in := slices.Clone(c.logits)
			got := s.Adjust(in, c.history)
			if !slices.Equal(in, c.logits) {
				t.Fatalf("input modified: %v", in)
			}
			for i := range got {
				if math.Abs(float64(got[i]-c.want[i])) > 1e-6 && !(math.IsInf(float64(got[i]), -1) && math.IsInf(float64(c.want[i]), -1)) {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestBannedNeverSampled(t *testing.T) {
	for _, temp := range []float64{0, 1, 2} {
		s := New(Params{Temperature: temp, LogitBias: map[int32]float32{1: -100}, Seed: 9})
		for range 500 {
			if s.Sample([]float32{0, 10, 0.5}, nil) == 1 {
				t.Fatalf("temperature %v: banned token sampled", temp)
			}
		}
	}
}

func TestFrequencyPenaltyChangesGreedy(t *testing.T) {
	// greedy with a frequency penalty of 1: token 0 (logit 2.5) wins until
	// it has been returned 1, then 2 times: 2.5-1 = 1.5 < 2 → token 1.
	s := New(Params{FrequencyPenalty: 1})
	l := []float32{2.5, 2, 0}
	var got []int32
	for range 4 {
		got = append(got, s.Sample(l, nil))
	}
	want := []int32{0, 1, 0, 1} // after 0: 1.5 vs 2 → 1; after 0,1: 1.5 vs 1 → 0; then 0.5 vs 1 → 1
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestRandomSeedDiffers(t *testing.T) {
	l := make([]float32, 1000) // uniform over 1000 tokens
	seqs := map[string]bool{}
	for range 5 {
		s := New(Params{Temperature: 1, RandomSeed: true})
		var b []byte
		for range 8 {
			b = append(b, byte(s.Sample(l, nil)), ',')
		}
		seqs[string(b)] = true
	}
	if len(seqs) < 4 {
		t.Fatalf("5 unseeded samplers gave %d distinct sequences", len(seqs))
	}
	a, b := New(Params{Temperature: 1, Seed: 5}), New(Params{Temperature: 1, Seed: 5})
	for range 50 {
		if a.Sample(l, nil) != b.Sample(l, nil) {
			t.Fatal("same seed, different draws")
		}
	}
}

func TestLogprobs(t *testing.T) {
	l := []float32{1, 3, 3, -2, float32(math.NaN()), 0.5}
	// reference: log-softmax in float64 over the non-NaN logits
	sum := 0.0
	for _, v := range l {
		if v == v {
			sum += math.Exp(float64(v))
		}
	}
	ref := func(i int) float64 { return float64(l[i]) - math.Log(sum) }
	lp, top := Logprobs(l, 2, 3)
	if math.Abs(lp-ref(2)) > 1e-12 {
		t.Fatalf("logprob %v, want %v", lp, ref(2))
	}
	wantIDs := []int32{1, 2, 0} // tie 1/2 → lower id first
	if len(top) != 3 {
		t.Fatalf("top %v", top)
	}
	for i, x := range top {
		if x.ID != wantIDs[i] || math.Abs(x.Logprob-ref(int(x.ID))) > 1e-12 {
			t.Fatalf("top[%d] = %+v, want id %d logprob %v", i, x, wantIDs[i], ref(int(wantIDs[i])))
		}
	}
	if lp, _ := Logprobs(l, 4, 0); !math.IsInf(lp, -1) {
		t.Fatalf("NaN token logprob %v", lp)
	}
	if _, top := Logprobs(l, 0, 50); len(top) != len(l) {
		t.Fatalf("top capped at %d with %d logits", len(top), len(l))
	}
	// the greedy token is the first of the top list
	g := New(Params{}).Sample(l, nil)
	if _, top := Logprobs(l, g, 1); top[0].ID != g {
		t.Fatalf("greedy %d, top %v", g, top)
	}
}

// BenchmarkSamplingExtras measures what logit bias, presence/frequency
// penalties and logprobs add per token on a Qwen3-sized vocabulary
// (151,936), against plain greedy in the same run.
func BenchmarkSamplingExtras(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	logits := make([]float32, 151936)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	hist := make([]int32, 2048)
	for i := range hist {
		hist[i] = int32(rng.IntN(len(logits)))
	}
	bias := map[int32]float32{}
	for range 50 {
		bias[int32(rng.IntN(len(logits)))] = float32(rng.NormFloat64())
	}
	run := func(name string, p Params, lp int) {
		b.Run(name, func(b *testing.B) {
			s := New(p)
			if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
				s.counts = map[int32]int{} // a generation's worth of counted tokens
				for i := range 256 {
					s.counts[int32(i*97)]++
				}
			}
			b.SetBytes(int64(4 * len(logits)))
			b.ReportAllocs()
			for b.Loop() {
				tok := s.Sample(logits, hist)
				if lp >= 0 {
					Logprobs(logits, tok, lp)
				}
			}
		})
	}
	run("greedy", Params{}, -1)
	run("greedy+bias+presence+frequency", Params{LogitBias: bias, PresencePenalty: 0.5, FrequencyPenalty: 0.5}, -1)
	run("greedy+logprobs", Params{}, 0)
	run("greedy+top_logprobs=20", Params{}, 20)
	run("temp0.7+topp0.9", Params{Temperature: 0.7, TopP: 0.9}, -1)
}
