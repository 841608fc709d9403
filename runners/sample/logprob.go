package sample

import (
	"math"
	"sort"
)

// MaxTopLogprobs bounds how many alternatives TopLogprobs reports (OpenAI's
// limit for top_logprobs).
const MaxTopLogprobs = 20

// TokenLogprob is one token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float64
}

// Logprobs returns the log-probability of tok under softmax(logits) and the
// top most likely tokens (descending, ties → lower id; at most
// MaxTopLogprobs), computed in float64 from the logits as given: callers
// pass the model's raw logits, so the numbers describe the model's
// distribution, not the one temperature, penalties or filters shaped (as
// vLLM's default). NaN logits count as impossible (-Inf).
func Logprobs(logits []float32, tok int32, top int) (float64, []TokenLogprob) {
	top = min(max(top, 0), MaxTopLogprobs, len(logits))
	maxL := math.Inf(-1)
	for _, v := range logits {
		if v == v && float64(v) > maxL {
			maxL = float64(v)
		}
	}
	if math.IsInf(maxL, -1) {
		return math.Inf(-1), nil
	}
	sum := 0.0
	for _, v := range logits {
		if v == v {
			sum += math.Exp(float64(v) - maxL)
		}
	}
	lse := maxL + math.Log(sum)
	lp := func(id int32) float64 {
		v := logits[id]
		if v != v {
			return math.Inf(-1)
		}
		return float64(v) - lse
	}
	chosen := math.Inf(-1)
	if tok >= 0 && int(tok) < len(logits) {
		chosen = lp(tok)
	}
	if top == 0 {
		return chosen, nil
	}
	// keep the best `top` in a small sorted slice (top ≤ 20): one pass
	better := func(a, b TokenLogprob) bool {
		if a.Logprob != b.Logprob {
			return a.Logprob > b.Logprob
		}
		return a.ID < b.ID
	}
	best := make([]TokenLogprob, 0, top+1)
	for i := range logits {
		c := TokenLogprob{ID: int32(i), Logprob: lp(int32(i))}
		if len(best) == top && !better(c, best[top-1]) {
			continue
		}
		j := sort.Search(len(best), func(k int) bool { return better(c, best[k]) })
		best = append(best, TokenLogprob{})
		copy(best[j+1:], best[j:])
		best[j] = c
		if len(best) > top {
			best = best[:top]
		}
	}
	return chosen, best
}
