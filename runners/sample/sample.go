// Package sample owns next-token selection from logits (greedy, temperature,
// top-k, top-p, min-p, repetition penalty with HF transformers' semantics;
// presence and frequency penalties and logit bias with OpenAI's; seeded or
// fresh randomness), speculative sampling's rule for a drafted token
// (Verify, with the draft's distribution from SampleDist),
// log-probabilities of the model's distribution, and the
// stop-sequence matcher that holds back text which may begin a stop string.
// It knows nothing of models, tokenizers or HTTP.
package sample

import (
	crand "crypto/rand"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
)

// Params configures a Sampler. Zero values disable a stage: Temperature 0
// is greedy (argmax, ties → lowest id); TopK 0, TopP 0 or ≥ 1, MinP 0,
// RepetitionPenalty 0 or 1, PresencePenalty 0, FrequencyPenalty 0 and an
// empty LogitBias are off.
//
// Randomness: with RandomSeed false, Seed seeds the random stream (every
// value, 0 included, is a seed: the same Params and inputs give the same
// tokens). With RandomSeed true, New draws a fresh seed from the operating
// system, so two samplers give different draws (a request without "seed").
type Params struct {
	Temperature, TopP float64
	TopK              int
	MinP              float64
	RepetitionPenalty float64
	// PresencePenalty and FrequencyPenalty are OpenAI's: for every token
	// this Sampler has already returned c > 0 times, its logit is lowered
	// by c×FrequencyPenalty + PresencePenalty (negative values raise it).
	// Only generated tokens count, not the prompt (as OpenAI and vLLM).
	PresencePenalty, FrequencyPenalty float64
	// LogitBias is added to the logits of its token ids before any other
	// stage; a bias of -100 or less bans the token outright (its logit
	// becomes -Inf), so it is never sampled, greedy or not.
	LogitBias  map[int32]float32
	Seed       int64
	RandomSeed bool
}

// BanBias is the logit bias at or below which a token is banned.
const BanBias = -100

// Sampler picks tokens for one generation stream. It is not safe for
// concurrent use (it owns a random stream and scratch buffers).
type Sampler struct {
	p      Params
	src    *rand.PCG // rng's state (Mark, Reset)
	rng    *rand.Rand
	logits []float32
	cand   []cand
	stamp  []uint32 // stamp[id] == gen: id already penalized this step
	gen    uint32
	counts map[int32]int // tokens returned so far (presence/frequency)
}

type cand struct {
	id int32
	l  float64 // temperature-scaled logit, then probability
}

// New returns a Sampler for p.
func New(p Params) *Sampler {
	seed := uint64(p.Seed)
	if p.RandomSeed {
		seed = FreshSeed()
	}
	src := rand.NewPCG(seed, 0x9e3779b97f4a7c15)
	return &Sampler{p: p, src: src, rng: rand.New(src)}
}

// Params returns the Sampler's parameters (with RandomSeed's seed drawn
// already: the stream is s's own).
func (s *Sampler) Params() Params { return s.p }

// Counts returns how many times each token has been returned so far, for
// the presence and frequency penalties (nil when neither is set). The map
// is s's: read it, do not keep it.
func (s *Sampler) Counts() map[int32]int { return s.counts }

// Uniform draws the value in [0, 1) that the next temperature > 0 pick
// would draw (the pick's u is Uniform × the total probability of the
// candidates): a device that picks tokens with the same rules (engine's
// overlapped steps) picks the same token from it. The value does not
// depend on the logits, so it can be drawn before they exist.
func (s *Sampler) Uniform() float64 { return s.rng.Float64() }

// Mark is a Sampler's random state (Mark, Reset).
type Mark struct{ pcg rand.PCG }

// Mark returns the random stream's current state.
func (s *Sampler) Mark() Mark { return Mark{pcg: *s.src} }

// Reset returns the random stream to m: the draws made since Mark are
// made again (a step whose Uniform was drawn but never used).
func (s *Sampler) Reset(m Mark) { *s.src = m.pcg }

// Observe records tok as returned, as Sample does after its pick: for a
// token picked elsewhere (on the device) from this Sampler's rules.
func (s *Sampler) Observe(tok int32) { s.count(tok) }

// FreshSeed returns 64 random bits from the operating system.
func FreshSeed() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return binary.LittleEndian.Uint64(b[:])
}

// Sample returns the next token id. history is every token so far (prompt
// and generated), used by the repetition penalty. Processing order (as in
// vLLM): logit bias, repetition penalty (HF's), presence and frequency
// penalties (OpenAI's), then temperature, top-k, top-p, min-p (HF's order)
// and a draw from the renormalized distribution. The returned token counts
// towards the presence and frequency penalties of later calls.
//
// The draw is an inverse-CDF pick of one Uniform over the candidates in a
// fixed order: by id, or by descending probability (ties by id) when top-p
// is on. Engine's device sampler walks them in the same order, so that a
// seeded request picks the same tokens on the device (but for float
// rounding at a boundary: the device computes in float32, this in float64).
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	return s.sample(logits, history, -1)
}

// Adjust returns the logits after logit bias and the repetition, presence
// and frequency penalties: logits itself when no stage applies, else a
// scratch copy owned by s (valid until the next call). The caller's slice
// is never modified.
func (s *Sampler) Adjust(logits []float32, history []int32) []float32 {
	rp := s.p.RepetitionPenalty
	doRep := rp > 0 && rp != 1 && len(history) > 0
	doCount := len(s.counts) > 0
	if len(s.p.LogitBias) == 0 && !doRep && !doCount {
		return logits
	}
	s.logits = append(s.logits[:0], logits...)
	l := s.logits
	for id, b := range s.p.LogitBias {
		if id < 0 || int(id) >= len(l) {
			continue
		}
		if b <= BanBias {
			l[id] = float32(math.Inf(-1))
		} else {
			l[id] += b
		}
	}
	if doRep {
		s.penalize(l, history, float32(rp))
	}
	if doCount {
		for id, c := range s.counts {
			if id < 0 || int(id) >= len(l) {
				continue
			}
			// in float32, each operation rounded (the conversions stop a
			// fused multiply-add), as the device's sampler computes it
			l[id] -= float32(float32(c)*float32(s.p.FrequencyPenalty)) + float32(s.p.PresencePenalty)
		}
	}
	return l
}

// penalize applies HF's repetition penalty once per distinct id in history:
// a positive logit is divided by rp, a negative one multiplied.
func (s *Sampler) penalize(l []float32, history []int32, rp float32) {
	if len(s.stamp) < len(l) {
		s.stamp = make([]uint32, len(l))
		s.gen = 0
	}
	s.gen++
	if s.gen == 0 { // wrapped: clear
		clear(s.stamp)
		s.gen = 1
	}
	for _, id := range history {
		if id < 0 || int(id) >= len(l) || s.stamp[id] == s.gen {
			continue
		}
		s.stamp[id] = s.gen
		if l[id] < 0 {
			l[id] *= rp
		} else {
			l[id] /= rp
		}
	}
}

// argmax returns the index of the largest logit, the lowest on ties; NaN
// never wins.
func argmax(l []float32) int32 {
	best := -1
	for i, v := range l {
		if v != v {
			continue
		}
		if best < 0 || v > l[best] {
			best = i
		}
	}
	if best < 0 {
		return 0
	}
	return int32(best)
}

// SampleWith is Sample with the draw's uniform u given (in [0, 1), as
// Uniform returns it) instead of drawn from s's stream.
func (s *Sampler) SampleWith(logits []float32, history []int32, u float64) int32 {
	return s.sample(logits, history, u)
}

// sample is Sample with the uniform u (drawU's: u < 0 draws one).
func (s *Sampler) sample(logits []float32, history []int32, u float64) int32 {
	if len(logits) == 0 {
		return 0
	}
	l := s.Adjust(logits, history)
	var tok int32
	if s.p.Temperature <= 0 {
		tok = argmax(l)
	} else {
		tok = s.drawU(l, u)
	}
	s.count(tok)
	return tok
}

func (s *Sampler) draw(l []float32) int32 { return s.drawU(l, -1) }

// drawU is draw with the uniform u, or (u < 0) one drawn once there are
// candidates.
func (s *Sampler) drawU(l []float32, u float64) int32 {
	c := s.candidates(l)
	if len(c) == 0 {
		return argmax(l)
	}
	total := 0.0
	for _, x := range c {
		total += x.l
	}
	if u < 0 {
		u = s.rng.Float64()
	}
	u *= total
	for _, x := range c {
		u -= x.l
		if u < 0 {
			return x.id
		}
	}
	return c[len(c)-1].id
}

// candidates are the tokens draw chooses among with their probabilities
// (before the cuts of min-p and top-p: their sum may be below 1); none when
// every logit is NaN or -Inf. They are s's scratch.
func (s *Sampler) candidates(l []float32) []cand {
	invT := 1 / s.p.Temperature
	c := s.cand[:0]
	for i, v := range l {
		if v != v || math.IsInf(float64(v), -1) {
			continue
		}
		c = append(c, cand{id: int32(i), l: float64(v) * invT})
	}
	if len(c) == 0 {
		s.cand = c
		return nil
	}
	byLogit := func(a, b cand) int {
		if a.l != b.l {
			if a.l > b.l {
				return -1
			}
			return 1
		}
		return int(a.id - b.id)
	}
	if k := s.p.TopK; k > 0 && k < len(c) {
		// keep the k best and everything tied with the k-th (HF removes only
		// scores strictly below the k-th score)
		kth := kthLargest(c, k)
		n := 0
		for _, x := range c {
			if x.l >= kth {
				c[n] = x
				n++
			}
		}
		c = c[:n]
		// back in id order (kthLargest moved them): the draw walks the
		// candidates in id order unless top-p sorts them, the order a
		// device sampler uses too
		slices.SortFunc(c, func(a, b cand) int { return int(a.id - b.id) })
	}
	// probabilities over the survivors (normalized over the top-k set, as HF)
	maxL := math.Inf(-1)
	for _, x := range c {
		maxL = max(maxL, x.l)
	}
	sum := 0.0
	for i := range c {
		c[i].l = math.Exp(c[i].l - maxL)
		sum += c[i].l
	}
	pmax := 0.0
	for i := range c {
		c[i].l /= sum
		pmax = max(pmax, c[i].l)
	}
	// min-p and top-p both keep a prefix of the descending order, so their
	// intersection does not depend on the order they are applied in.
	cut := 0.0
	if mp := s.p.MinP; mp > 0 {
		cut = mp * pmax
	}
	tp := s.p.TopP
	topP := tp > 0 && tp < 1
	if topP {
		// tokens below eps hold less than 1-tp in total, so the nucleus
		// lies among the rest: only those need sorting.
		cut = max(cut, (1-tp)/float64(len(c))*0.999)
	}
	if cut > 0 {
		n := 0
		for _, x := range c {
			if x.l >= cut || x.l == pmax {
				c[n] = x
				n++
			}
		}
		c = c[:n]
	}
	if topP {
		slices.SortFunc(c, byLogit) // by probability now, same order
		before, n := 0.0, 0
		for n < len(c) && before < tp {
			before += c[n].l
			n++
		}
		c = c[:max(n, 1)]
	}
	s.cand = c
	return c
}

// count records tok as returned (presence and frequency penalties).
func (s *Sampler) count(tok int32) {
	if s.p.PresencePenalty != 0 || s.p.FrequencyPenalty != 0 {
		if s.counts == nil {
			s.counts = map[int32]int{}
		}
		s.counts[tok]++
	}
}

// SampleDist is Sample for a speculative draft (temperature > 0): it
// also writes into q (len(logits) entries, cleared here) the distribution
// the token was drawn from, which Verify needs. At temperature ≤ 0 it is
// Sample, and q is the point mass on the token.
func (s *Sampler) SampleDist(q []float32, logits []float32, history []int32) int32 {
	q = q[:len(logits)]
	clear(q)
	if len(logits) == 0 {
		return 0
	}
	l := s.Adjust(logits, history)
	var tok int32
	c := []cand(nil)
	if s.p.Temperature > 0 {
		c = s.candidates(l)
	}
	if len(c) == 0 {
		tok = argmax(l)
		q[tok] = 1
	} else {
		total := 0.0
		for _, x := range c {
			total += x.l
		}
		for _, x := range c {
			q[x.id] = float32(x.l / total)
		}
		tok = s.pick(c, total)
	}
	s.count(tok)
	return tok
}

func (s *Sampler) pick(c []cand, total float64) int32 {
	u := s.rng.Float64() * total
	for _, x := range c {
		u -= x.l
		if u < 0 {
			return x.id
		}
	}
	return c[len(c)-1].id
}

// Verify is speculative sampling's rule for one drafted token d drawn from
// q (SampleDist's, indexed by token id): with p the distribution Sample
// would draw from, d is kept with probability min(1, p(d)/q(d)); else the
// token is drawn from the residual max(0, p − q), renormalized. The token
// returned is distributed as p whatever q is, and counts as Sample's does;
// kept reports whether it is d. At temperature ≤ 0 it is Sample.
func (s *Sampler) Verify(logits []float32, history []int32, d int32, q []float32) (tok int32, kept bool) {
	if len(logits) == 0 || s.p.Temperature <= 0 {
		tok = s.Sample(logits, history)
		return tok, tok == d
	}
	l := s.Adjust(logits, history)
	c := s.candidates(l)
	if len(c) == 0 {
		tok = argmax(l)
		s.count(tok)
		return tok, tok == d
	}
	qOf := func(id int32) float64 {
		if int(id) < len(q) {
			return float64(q[id])
		}
		return 0
	}
	total, pd := 0.0, 0.0
	for _, x := range c {
		total += x.l
		if x.id == d {
			pd = x.l
		}
	}
	pd /= total
	if qd := qOf(d); qd > 0 && s.rng.Float64()*qd < pd {
		s.count(d)
		return d, true
	}
	// The residual, over p's support (outside it max(0, 0 − q) is 0).
	rest := 0.0
	for i, x := range c {
		r := max(0, x.l/total-qOf(x.id))
		c[i].l = r
		rest += r
	}
	if rest <= 0 { // p ≤ q everywhere yet d rejected: only by rounding; draw from p
		tok = s.draw(l)
	} else {
		tok = s.pick(c, rest)
	}
	s.count(tok)
	return tok, tok == d
}

// kthLargest returns the k-th largest scaled logit in c (1-based) without
// sorting all of c (c's order is changed).
func kthLargest(c []cand, k int) float64 {
	lo, hi := 0, len(c)-1
	target := k - 1
	for lo < hi {
		// median-of-three pivot, Hoare-style partition by descending value
		mid := lo + (hi-lo)/2
		p := median3(c[lo].l, c[mid].l, c[hi].l)
		i, j := lo, hi
		for i <= j {
			for c[i].l > p {
				i++
			}
			for c[j].l < p {
				j--
			}
			if i <= j {
				c[i], c[j] = c[j], c[i]
				i++
				j--
			}
		}
		switch {
		case target <= j:
			hi = j
		case target >= i:
			lo = i
		default:
			return c[target].l
		}
	}
	return c[target].l
}

func median3(a, b, c float64) float64 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	if a > b {
		return a
	}
	return b
}
