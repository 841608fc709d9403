//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// TestSampleRowsMatchesSampler: MLX's device sampler (SampleRows) picks
// the token sample.Sampler picks from the same logits, history, counts and
// uniform, for greedy and seeded temperature, top-k, top-p, min-p,
// repetition/presence/frequency penalties and logit bias, alone and mixed
// in one batch. Greedy picks must agree exactly; sampled ones may differ
// only where float32 rounding moves a boundary (the device computes the
// probabilities in float32, the host in float64): the rate is logged and
// must stay under 1 in 2,000 picks.
func TestSampleRowsMatchesSampler(t *testing.T) {
	b := newTestBackend(t)
	if !b.CanSampleRows() {
		t.Skip("this libmlxc lacks the device sampler's ops")
	}
	cases := []struct {
		name string
		p    sample.Params
	}{
		{"greedy", sample.Params{}},
		{"temperature", sample.Params{Temperature: 0.8}},
		{"top-k", sample.Params{Temperature: 1, TopK: 20}},
		{"top-p", sample.Params{Temperature: 0.7, TopP: 0.9}},
		{"min-p", sample.Params{Temperature: 1.2, MinP: 0.05}},
		{"all cuts", sample.Params{Temperature: 0.9, TopK: 50, TopP: 0.8, MinP: 0.02}},
		{"penalties greedy", sample.Params{RepetitionPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.3}},
		{"penalties sampled", sample.Params{Temperature: 1, RepetitionPenalty: 1.2, PresencePenalty: -0.4, FrequencyPenalty: 0.7, TopP: 0.95}},
		{"bias", sample.Params{Temperature: 0.6, LogitBias: map[int32]float32{3: 5, 7: -100, 11: -2.5}}},
		{"bias greedy", sample.Params{LogitBias: map[int32]float32{3: 50, 9: -100}}},
	}
	const V = 1000
	rounds := 60 // EXO_MLX_SAMPLE_ROUNDS: more, to measure the rate (docs/BENCHMARKS.md)
	if v, err := strconv.Atoi(os.Getenv("EXO_MLX_SAMPLE_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	rng := rand.New(rand.NewPCG(1, 2))
	mixed := make([]sample.Params, 0, len(cases))
	for _, c := range cases {
		mixed = append(mixed, c.p)
	}
	run := func(t *testing.T, ps []sample.Params) (picks, diffs int) {
		for round := range rounds {
			B := len(ps)
			logits := make([]float32, B*V)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * 3)
			}
			if round%7 == 3 { // ties, NaN and -Inf now and then
				logits[5], logits[6] = logits[4], logits[4]
				logits[V+1] = float32(math.NaN())
				logits[2] = float32(math.Inf(-1))
			}
			specs := make([]engine.SampleSpec, B)
			want := make([]int32, B)
			us := make([]float32, B)
			for i, p := range ps {
				hist := make([]int32, 1+rng.IntN(40))
				for j := range hist {
					hist[j] = int32(rng.IntN(V))
				}
				host := sample.New(sample.Params{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
					RepetitionPenalty: p.RepetitionPenalty, PresencePenalty: p.PresencePenalty,
					FrequencyPenalty: p.FrequencyPenalty, LogitBias: p.LogitBias})
				for _, id := range hist[:len(hist)/2] { // the generated half counts
					host.Observe(id)
				}
				u := rng.Float64()
				us[i] = float32(u)
				specs[i] = engine.SampleSpec{Params: p, History: hist, Counts: host.Counts()}
				// the host picks with the float32 uniform the device gets
				want[i] = host.SampleWith(logits[i*V:(i+1)*V], hist, float64(us[i]))
				// the host's pick counted want[i]: undo for the device's inputs
				c := map[int32]int{}
				for _, id := range hist[:len(hist)/2] {
					c[id]++
				}
				specs[i].Counts = c
			}
			sa := engine.SampleInputs(b, specs, V)
			sa.U = b.FromFloat32(us, B)
			tok, _, _ := b.SampleRows(b.FromFloat32(logits, B, V), sa)
			raw, err := b.Bytes(tok)
			if err != nil {
				t.Fatal(err)
			}
			sa.Free(b)
			b.Free()
			for i := range B {
				got := int32(binary.LittleEndian.Uint32(raw[4*i:]))
				picks++
				if got != want[i] {
					diffs++
					if ps[i].Temperature <= 0 {
						t.Errorf("round %d row %d (%+v): device %d, host %d", round, i, ps[i], got, want[i])
					}
				}
			}
		}
		return picks, diffs
	}
	total, totalDiff := 0, 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ps := []sample.Params{c.p, c.p, c.p}
			n, d := run(t, ps)
			total, totalDiff = total+n, totalDiff+d
		})
	}
	t.Run("mixed batch", func(t *testing.T) {
		n, d := run(t, mixed)
		total, totalDiff = total+n, totalDiff+d
	})
	t.Logf("device vs host picks: %d of %d differ", totalDiff, total)
	if totalDiff*2000 > total {
		t.Fatalf("device and host picks differ %d times in %d", totalDiff, total)
	}
}
