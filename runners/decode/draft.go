package decode

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// Speculative decoding with a draft model (--speculative draft --draft SRC).
//
// A small model of the same tokenizer, loaded beside the target on the
// decode host (Options.Draft), drafts the tokens to verify: its greedy
// continuation of the history (prompt and output so far). Each generation
// has a draft cache of its own, taken from a prefix cache of draft caches
// (the draft's "prefix reuse") and kept in step with the history lazily:
// before drafting, the draft cache goes back to the longest prefix it
// shares with the history (rejected drafts and the target's corrections
// differ from what it fed) and is fed the rest. So a prompt the target
// found in its prefix cache or received from a prefill runner is
// prefilled on the draft here, once, at the first draft.
//
// Greedy and seeded requests get a point-mass draft (the draft model's
// argmax), verified as the prompt-lookup path's: each verified row goes
// through the plain per-token pipeline (mask, penalties, sampler, logprobs,
// stops), which is the exact rejection rule for a point-mass draft at any
// temperature (see spec.go), so their output equals plain decoding's, a
// seeded text included. An unseeded request at temperature > 0 gets sampled
// drafts: the draft samples each token from its own distribution q (the
// request's temperature, top-k/p, min-p and bias over the draft's logits,
// its own random stream), and each verified row keeps the drafted token d
// with probability min(1, p(d)/q(d)), p what the target's sampler would
// draw from (after the constraint's mask and the penalties), else draws
// from the residual max(0, p − q) (Picker.PickDraft): the output is
// distributed exactly as the target's, and a draft close to the target is
// kept far more often than its argmax would be. (A seeded request keeps the
// point mass: with sampled drafts its text would depend on how many tokens
// were drafted per step, which the measured costs decide.)
//
// How many tokens to draft uses the prompt-lookup path's cost model with
// one more cost: a draft forward, measured, in plain target steps (see
// speculator.plan).

// CheckDraftText refuses a draft model whose tokenizer is not the
// target's: the same vocabulary size, the same bytes for every token id
// and the same end-of-sequence ids.
func CheckDraftText(target, draft Text) error {
	if a, b := target.VocabSize(), draft.VocabSize(); a != b {
		return fmt.Errorf("draft model's tokenizer has %d tokens, the model's %d: a draft must share the model's tokenizer", b, a)
	}
	for id := range int32(target.VocabSize()) {
		if a, b := target.TokenBytes(id), draft.TokenBytes(id); !slices.Equal(a, b) {
			return fmt.Errorf("draft model's tokenizer differs at token %d (%q, the model's %q): a draft must share the model's tokenizer", id, b, a)
		}
	}
	a, b := slices.Sorted(slices.Values(target.EOS())), slices.Sorted(slices.Values(draft.EOS()))
	if !slices.Equal(a, b) {
		return fmt.Errorf("draft model's end-of-sequence tokens %v, the model's %v: a draft must share the model's tokenizer", b, a)
	}
	return nil
}

// drafter is one generation's draft model state: its cache (a draft pool
// entry, holding entry.tokens) and what a draft forward costs.
type drafter struct {
	// sampler, when set, samples the drafts (an unseeded request at
	// temperature > 0), each with its distribution in q; nil: greedy.
	sampler DraftSampler
	q       [][]float32
	m       Model
	vocab   int // drafted ids stay below it (both models' and the tokenizer's vocabularies)
	maxP    int // the draft's context (0: unbounded)
	pool    *kvPool
	chunk   int
	e       *convEntry
	step    float64 // seconds per draft forward (moving average; 0: unmeasured)
	catch   float64 // seconds per token of its catch-up prefill (moving average; 0: unmeasured)
	off     bool    // drafting stopped for this generation (see speculator.propose)
	err     error   // a failed draft forward: no more drafting in this generation
	out     []int32
	// b, when set, batches the draft steps with the other generations'
	// (the Server's draft batcher); nil: one forward per step.
	b *batcher
}

// draftCostPrior is a draft forward's cost, in target steps, until one is
// measured.
const draftCostPrior = 0.2

// draft returns up to k tokens the draft model greedily continues history
// with (history's last token is the one about to be fed to the target).
func (d *drafter) draft(ctx context.Context, history []int32, k int) ([]int32, error) {
	if d.err != nil || len(history) == 0 {
		return nil, d.err
	}
	if d.maxP > 0 {
		k = min(k, d.maxP-len(history))
	}
	if k <= 0 {
		return nil, nil
	}
	if d.e == nil {
		d.e, _ = d.pool.take(history[:len(history)-1])
	}
	c := d.e.cache
	n := min(commonPrefix(d.e.tokens, history), len(history)-1) // the last is fed: its logits draft
	if n < c.Len() {
		if !c.CanTruncate(n) {
			n = 0 // a sliding layer lost the window n needs: start over
		}
		c.Truncate(n)
	}
	n = c.Len() // a recurrent draft goes back to its latest kept state
	d.e.tokens = d.e.tokens[:n]
	fail := func(err error) ([]int32, error) {
		d.pool.drop(d.e)
		d.e, d.err = nil, err
		return nil, err
	}
	if rest := history[n : len(history)-1]; len(rest) > 0 {
		t0 := time.Now()
		if err := d.m.Prefill(ctx, c, rest, d.chunk, nil); err != nil {
			return fail(fmt.Errorf("draft prefill: %w", err))
		}
		d.e.tokens = append(d.e.tokens, rest...)
		if t := time.Since(t0).Seconds() / float64(len(rest)); d.catch == 0 {
			d.catch = t
		} else {
			d.catch += specAlpha * (t - d.catch)
		}
	}
	t0 := time.Now()
	d.out = d.out[:0]
	tok := history[len(history)-1]
	var mem *member
	if d.b != nil {
		// The other generations drafting now step with this one.
		mem = d.b.joinMember()
		defer mem.leave()
	}
	for range k {
		var logits []float32
		var err error
		if mem != nil {
			var out stepOut
			if err = ctx.Err(); err == nil {
				out, err = mem.step(c, tok)
			}
			logits = out.logits
		} else {
			logits, err = d.m.Forward(ctx, c, []int32{tok})
		}
		if err != nil {
			return fail(fmt.Errorf("draft step: %w", err))
		}
		d.e.tokens = append(d.e.tokens, tok)
		if d.sampler != nil {
			i := len(d.out)
			if i == len(d.q) {
				d.q = append(d.q, make([]float32, d.vocab))
			}
			tok = d.sampler.SampleDist(d.q[i], logits[:d.vocab], nil)
		} else {
			tok = argmaxBelow(logits, d.vocab)
		}
		d.out = append(d.out, tok)
	}
	t := time.Since(t0).Seconds() / float64(k)
	if d.step == 0 {
		d.step = t
	} else {
		d.step += specAlpha * (t - d.step)
	}
	return d.out, nil
}

// close returns the draft cache to the draft pool (it holds d.e.tokens).
func (d *drafter) close() {
	if d.e == nil {
		return
	}
	if d.e.cache.Len() == len(d.e.tokens) {
		d.pool.put(d.e)
	} else {
		d.pool.drop(d.e)
	}
	d.e = nil
}

// argmaxBelow is the id of the largest of logits[:n] (the first on ties).
func argmaxBelow(logits []float32, n int) int32 {
	n = min(n, len(logits))
	best := 0
	for i := 1; i < n; i++ {
		if logits[i] > logits[best] {
			best = i
		}
	}
	return int32(best)
}

// draftVocab is the ids a draft may propose: below the target's and the
// draft's logits and the tokenizer's vocabulary.
func draftVocab(target, draft engine.ModelInfo, text Text) int {
	v := min(target.Vocab, draft.Vocab)
	if text != nil {
		v = min(v, text.VocabSize())
	}
	return v
}

// LoadDraft loads the draft model at path (a model directory or .gguf
// file) beside target, on its backend (engine.LoadOptions.Beside: their
// steps take turns, as one backend's must), and refuses it unless its
// tokenizer is the target's (CheckDraftText against text).
func LoadDraft(ctx context.Context, path string, target *engine.Model, text Text) (*engine.Model, error) {
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("draft model tokenizer: %w", err)
	}
	if err := CheckDraftText(text, NewText(tok, nil)); err != nil {
		return nil, err
	}
	m, err := engine.Load(ctx, path, target.Backend(), engine.LoadOptions{Beside: target})
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	return m, nil
}
