package decode

import (
	"context"
	"fmt"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// Picked is the token a Picker chose from one step's logits.
type Picked struct {
	Tok int32
	// Logprob describes Tok under the unmasked logits, when the request
	// asks for logprobs (nil otherwise).
	Logprob *gen.TokenLogprob
	// Done: the request's constraint is complete once Tok is emitted.
	Done bool
}

// Picker is one generation's per-token pipeline over a step's logits:
// the constraint's mask, the sampler (given the generation's history for
// its penalties), the constraint told the token, and the token's
// logprob record. It lives where the logits are: in the decode runner,
// or on a pipeline's last stage, which builds it from the same request
// (Options.NewPicker), so both pick the same tokens (seeded sampling
// included). Not safe for concurrent use.
type Picker struct {
	sampler  Sampler
	cons     Constraint
	text     Text
	history  []int32
	logprobs bool
	top      int
	masked   []float32
}

// NewPicker builds req's Picker from the Options' sampler, constraint and
// tokenizer: history is what the cache holds before the first pick (the
// prompt), st where the output begins.
func (o *Options) NewPicker(req *gen.Request, st chat.Start, history []int32) (*Picker, error) {
	var cons Constraint
	if o.NewConstraint != nil {
		var err error
		if cons, err = o.NewConstraint(req, st); err != nil {
			return nil, err
		}
	}
	return o.newPicker(req, cons, history), nil
}

func (o *Options) newPicker(req *gen.Request, cons Constraint, history []int32) *Picker {
	return &Picker{sampler: o.NewSampler(req.Sampling), cons: cons, text: o.Text,
		history: append([]int32(nil), history...), logprobs: req.Logprobs, top: req.TopLogprobs}
}

// Pick chooses the next token from logits (which it does not modify).
func (p *Picker) Pick(logits []float32) (Picked, error) { return p.pick(logits, 0, nil) }

// DraftSampler is a Sampler that also samples a draft together with the
// distribution it drew from, and verifies a drafted token by speculative
// sampling's rule (sample.Sampler is one): draft-model speculation of an
// unseeded request at temperature > 0 uses it.
type DraftSampler interface {
	Sampler
	SampleDist(q []float32, logits []float32, history []int32) int32
	Verify(logits []float32, history []int32, d int32, q []float32) (tok int32, kept bool)
}

// PickDraft is Pick for the row of a drafted token d that a draft model
// sampled from q (indexed by token id): the sampler's Verify replaces its
// Sample, so the token is distributed as Pick's would be (d kept with
// probability min(1, p(d)/q(d)), else a draw from the residual); the
// constraint's mask, the history and the logprob are Pick's. A sampler
// that cannot verify samples as Pick does.
func (p *Picker) PickDraft(logits []float32, d int32, q []float32) (Picked, error) {
	return p.pick(logits, d, q)
}

func (p *Picker) pick(logits []float32, d int32, q []float32) (Picked, error) {
	sl := logits
	if p.cons != nil {
		p.masked = append(p.masked[:0], logits...)
		if err := p.cons.Mask(p.masked); err != nil {
			return Picked{}, fmt.Errorf("constraint: %w", err)
		}
		sl = p.masked
	}
	var tok int32
	if ds, ok := p.sampler.(DraftSampler); ok && q != nil {
		tok, _ = ds.Verify(sl, p.history, d, q)
	} else {
		tok = p.sampler.Sample(sl, p.history)
	}
	if p.cons != nil {
		if err := p.cons.Accept(tok); err != nil {
			return Picked{}, fmt.Errorf("constraint: %w", err)
		}
	}
	p.history = append(p.history, tok)
	pk := Picked{Tok: tok, Done: p.cons != nil && p.cons.Done()}
	if p.logprobs {
		lp, top := sample.Logprobs(logits, tok, p.top) // under the model's logits, before any sampling transform
		pk.Logprob = p.logprobOf(tok, lp, top)
	}
	return pk, nil
}

// accept records tok, picked on the device by the rules of p's sampler
// (an overlapped step), as pick records its own: in the history and in
// the sampler's counts. The constraint, if any, was told the token by the
// overlap itself (engine.SampleSpec.Accept), before the next step's mask.
func (p *Picker) accept(tok int32) {
	p.history = append(p.history, tok)
	if s, ok := p.sampler.(*sample.Sampler); ok {
		s.Observe(tok)
	}
}

// Close ends the constraint (a mask computed ahead may still be running).
func (p *Picker) Close() {
	if cl, ok := p.cons.(interface{ Close() }); ok {
		cl.Close()
	}
}

// logprobOf describes tok by its log-probability lp and the top most
// likely tokens, computed from the logits on the host (pick) or on the
// device (an overlapped step).
func (p *Picker) logprobOf(tok int32, lp float64, top []sample.TokenLogprob) *gen.TokenLogprob {
	out := &gen.TokenLogprob{Bytes: p.text.TokenBytes(tok), Logprob: lp}
	for _, b := range top {
		out.Top = append(out.Top, gen.TopToken{Bytes: p.text.TokenBytes(b.ID), Logprob: b.Logprob})
	}
	return out
}

// PickingModel is a Model whose steps return the picked token rather
// than logits: a pipeline's first stage, whose last stage holds the
// logits and runs the request's Picker there. Its Forward and
// ForwardBatch (logits) are refused; the Server steps it through
// ForwardPick and ForwardBatchPick instead, and does not speculate.
type PickingModel interface {
	Model
	// StartPicking installs req's Picker for the sequence of c on the
	// stage that holds the logits (history: the prompt, which c will hold
	// before the first pick; st: where the output begins). It replaces
	// any earlier request's Picker of that sequence.
	StartPicking(ctx context.Context, c engine.KVCache, req *gen.Request, st chat.Start, history []int32) error
	// ForwardPick runs tokens at positions c.Len()… and returns the token
	// picked from the last position's logits.
	ForwardPick(ctx context.Context, c engine.KVCache, tokens []int32) (Picked, error)
	// ForwardBatchPick is ForwardBatch returning each sequence's pick.
	ForwardBatchPick(ctx context.Context, caches []engine.KVCache, tokens []int32) ([]Picked, error)
}
