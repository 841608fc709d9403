package engine

import (
	"math"

	"github.com/exo-pd/exo-pd/runners/sample"
)

// SampleSpec says how an overlapped step picks one sequence's tokens on
// the device: with sample.Sampler's rules for Params (logit bias,
// repetition, presence and frequency penalties, then greedy, or
// temperature, top-k, min-p, top-p and a draw), so that the tokens are
// those the host's Sampler would pick from the same logits and draws. The
// zero SampleSpec is plain greedy (argmax).
type SampleSpec struct {
	// Params are the sampler's; Seed and RandomSeed are not used: the
	// draws come from Uniform.
	Params sample.Params
	// History is what the repetition penalty counts: the tokens before
	// the first overlapped pick (the prompt, the output so far and the
	// token fed to the first step). Picked tokens join it on the device.
	History []int32
	// Counts is how many times each token has been returned so far
	// (presence and frequency penalties; sample.Sampler.Counts).
	Counts map[int32]int
	// Uniform draws a step's value (sample.Sampler.Uniform), called once
	// for each step queued when Params.Temperature > 0, in step order
	// and before that step's logits exist.
	Uniform func() float64
	// Logprobs: each step also computes the log-probability of the row's
	// token under the step's logits as the model gave them (before the
	// mask, bias, penalties and temperature, as sample.Logprobs) and the
	// Top (at most sample.MaxTopLogprobs) most likely tokens, which
	// Overlap.Logprob returns with the token.
	Logprobs bool
	Top      int
	// Mask, when set, constrains the row's picks (a grammar): before each
	// pick it is asked for the tokens allowed next and sets dst[id] (V
	// floats, zero on entry) to -Inf for each token not allowed. The
	// first step's mask is asked by StartOverlap; each later one after
	// Accept was told the token before it, while the device computes the
	// step's forward.
	Mask func(dst []float32) error
	// Accept, when set, is told each token the row returns, in order,
	// before the next step's Mask.
	Accept func(tok int32) error
	// Steps bounds how many tokens the row may still return, the first
	// step's included (the request's remaining max_tokens): no step past
	// the last is queued, so none is computed for nothing. 0: no bound.
	Steps int
}

// Plain reports whether s is greedy with nothing that changes the logits
// (no penalty, bias or mask).
func (s *SampleSpec) Plain() bool {
	p := &s.Params
	return s.Mask == nil && p.Temperature <= 0 && !repPenalty(p) && p.PresencePenalty == 0 && p.FrequencyPenalty == 0 && len(p.LogitBias) == 0
}

func repPenalty(p *sample.Params) bool { return p.RepetitionPenalty > 0 && p.RepetitionPenalty != 1 }

// The columns of SampleArrays.Params.
const (
	SPInvT   = iota // 1/temperature (1 for greedy rows)
	SPGreedy        // 1: the row takes the argmax
	SPTopK          // k, 0: off
	SPTopP          // p (2 when off: every prefix is below it)
	SPTopPOn        // 1: top-p is on (0 < p < 1): the draw walks the nucleus by descending logit
	SPMinP          // min-p, 0: off
	SPRep           // repetition penalty (1: off)
	SPPres          // presence penalty
	SPFreq          // frequency penalty
	SPCount
)

// SampleArrays are the inputs of RowSampler.SampleRows for B rows of V
// logits.
type SampleArrays struct {
	Params Array // [B, SPCount] F32
	U      Array // [B] F32: each row's uniform (nil when no row samples)
	// Mask is the step's constraint ([B, V] F32, -Inf where a row may not
	// pick the token, 0 elsewhere; nil when no row is constrained): -Inf
	// replaces the logit before anything else (sample.Sampler is given
	// the masked logits).
	Mask Array
	// Bias is each row's logit bias ([B, V] F32, -Inf for a banned
	// token), Seen 1 where the repetition penalty applies (the row's
	// history), Counts each token's count so far; nil when no row has
	// the feature.
	Bias, Seen, Counts Array
	// Sampled: some row has temperature > 0; Sorted: some row has top-k
	// or top-p; TopP: some row has top-p.
	Sampled, Sorted, TopP bool
}

// RowSampler is implemented by backends that pick tokens on the device
// (mlx): an overlapped step then needs no read-back of its logits.
type RowSampler interface {
	// CanSampleRows reports whether the backend has the ops.
	CanSampleRows() bool
	// SampleRows picks one token per row of logits [B, V] by the rules
	// of SampleSpec (and sample.Sampler): tok [B] I32, and Seen and
	// Counts with the picked tokens added (nil where sa's are nil).
	SampleRows(logits Array, sa *SampleArrays) (tok, seen, counts Array)
}

// RowLogprober is implemented by backends that compute logprobs on the
// device (mlx), so that a step that reports them needs no read-back of
// its logits.
type RowLogprober interface {
	// RowLogprobs returns, for logits [B, V] and the picked tokens tok
	// [B] (I32), the log-softmax at each row's token (chosen [B] F32)
	// and, with top > 0, the top most likely tokens of each row by
	// descending logit, ties by id (ids [B, top] I32, vals [B, top] F32),
	// as sample.Logprobs computes them (in float32; NaN logits count as
	// -Inf).
	RowLogprobs(logits, tok Array, top int) (chosen, ids, vals Array)
}

// sampleParams fills row's columns of SampleArrays.Params.
func sampleParams(row []float32, p *sample.Params) {
	clear(row)
	row[SPInvT], row[SPTopP], row[SPRep] = 1, 2, 1
	if p.Temperature > 0 {
		row[SPInvT] = float32(1 / p.Temperature)
		if p.TopK > 0 {
			row[SPTopK] = float32(p.TopK)
		}
		if p.TopP > 0 && p.TopP < 1 {
			row[SPTopP], row[SPTopPOn] = float32(p.TopP), 1
		}
		row[SPMinP] = float32(max(p.MinP, 0))
	} else {
		row[SPGreedy] = 1
	}
	if repPenalty(p) {
		row[SPRep] = float32(p.RepetitionPenalty)
	}
	row[SPPres], row[SPFreq] = float32(p.PresencePenalty), float32(p.FrequencyPenalty)
}

// SampleInputs builds the constant inputs of a batch's SampleRows (all but
// U) from specs, for V logits per row.
func SampleInputs(b Backend, specs []SampleSpec, V int) *SampleArrays {
	sa := &SampleArrays{}
	B := len(specs)
	params := make([]float32, B*SPCount)
	var bias, seen, counts []float32
	for i := range specs {
		p := &specs[i].Params
		sampleParams(params[i*SPCount:(i+1)*SPCount], p)
		if p.Temperature > 0 {
			sa.Sampled = true
			sa.Sorted = sa.Sorted || p.TopK > 0 || (p.TopP > 0 && p.TopP < 1)
			sa.TopP = sa.TopP || (p.TopP > 0 && p.TopP < 1)
		}
		if len(p.LogitBias) > 0 && bias == nil {
			bias = make([]float32, B*V)
		}
		if repPenalty(p) && seen == nil {
			seen = make([]float32, B*V)
		}
		if (p.PresencePenalty != 0 || p.FrequencyPenalty != 0) && counts == nil {
			counts = make([]float32, B*V)
		}
	}
	for i := range specs {
		sp := &specs[i]
		p := &sp.Params
		if bias != nil {
			row := bias[i*V : (i+1)*V]
			for id, v := range p.LogitBias {
				if id < 0 || int(id) >= V {
					continue
				}
				if v <= sample.BanBias {
					row[id] = float32(math.Inf(-1))
				} else {
					row[id] = v
				}
			}
		}
		if seen != nil && repPenalty(p) {
			row := seen[i*V : (i+1)*V]
			for _, id := range sp.History {
				if id >= 0 && int(id) < V {
					row[id] = 1
				}
			}
		}
		if counts != nil && (p.PresencePenalty != 0 || p.FrequencyPenalty != 0) {
			row := counts[i*V : (i+1)*V]
			for id, c := range sp.Counts {
				if id >= 0 && int(id) < V {
					row[id] = float32(c)
				}
			}
		}
	}
	sa.Params = b.FromFloat32(params, B, SPCount)
	b.Keep(sa.Params)
	for _, x := range []struct {
		dst *Array
		v   []float32
	}{{&sa.Bias, bias}, {&sa.Seen, seen}, {&sa.Counts, counts}} {
		if x.v != nil {
			*x.dst = b.FromFloat32(x.v, B, V)
			b.Keep(*x.dst)
		}
	}
	return sa
}

// takeRows returns sa's arrays of the rows idx ([N] I32) as a new
// SampleArrays (kept); sa is left as it was.
func (sa *SampleArrays) takeRows(b Backend, idx Array) *SampleArrays {
	out := *sa
	out.U, out.Mask = nil, nil
	for _, x := range []*Array{&out.Params, &out.Bias, &out.Seen, &out.Counts} {
		if *x != nil {
			*x = b.Take(*x, idx)
			b.Keep(*x)
		}
	}
	return &out
}

// Free releases sa's arrays.
func (sa *SampleArrays) Free(b Backend) {
	for _, a := range []Array{sa.Params, sa.Bias, sa.Seen, sa.Counts, sa.Mask} {
		if a != nil {
			b.Free(a)
		}
	}
	*sa = SampleArrays{}
}
