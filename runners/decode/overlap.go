package decode

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// overlapStarter is a model that can run overlapped steps (engine.Model:
// StartOverlap, mlx-lm's generate_step).
type overlapStarter interface {
	StartOverlap(ctx context.Context, caches []engine.KVCache, tokens []int32, specs []engine.SampleSpec) (*engine.Overlap, error)
}

// overlapping reports whether the batcher should overlap m's plain steps:
// m can, and its backend computes asynchronously (MLX). On the eager cpu
// backend an overlapped step gains nothing and every change of the
// batch's members would cost a step computed for nothing.
func overlapping(m Model) bool {
	if _, ok := m.(overlapStarter); !ok {
		return false
	}
	bm, ok := m.(interface{ Backend() engine.Backend })
	if !ok {
		return false
	}
	_, async := bm.Backend().(engine.AsyncEvaler)
	return async
}

// overlappable returns the generation's Picker when its tokens may be
// picked on the device (engine.SampleSpec: greedy or sample.Sampler's
// temperature, top-k/p, min-p, seeded draws, penalties and logit bias),
// so that its steps can be overlapped; nil when a step must be serial: a
// grammar or tool-call constraint (its mask needs the previous token on
// the host), logprobs (they need the logits), speculation, a pipeline's
// picking stage, or a sampler that is not sample.Sampler.
func overlappable(p *Picker, sp *speculator, pm PickingModel) *Picker {
	if p == nil || p.cons != nil || p.logprobs || sp != nil || pm != nil {
		return nil
	}
	if _, ok := p.sampler.(*sample.Sampler); !ok {
		return nil
	}
	return p
}

// overlapRun is a batcher's overlapped decode: while the batch's members
// stay the same and every one is overlappable, each batch is one
// engine.Overlap.Next (the step after it already queued); any other batch
// stops it first (the caches drop the step in flight, the samplers take
// back its draws) and runs serially.
type overlapRun struct {
	m   overlapStarter
	log *slog.Logger

	mu     sync.Mutex
	o      *engine.Overlap
	caches []engine.KVCache // o's caches, in its order
	pick   []*Picker        // their Pickers
	// marks[j] are the random states before each draw of member j that
	// no returned token has used yet (the step in flight's; two after a
	// failed Next): Stop resets the sampler to the first.
	marks [][]sample.Mark
	next  []int32 // what o.Next returned last: each member's next token
	idx   []int   // scratch: batch position → o's index
	off   bool    // StartOverlap refused these caches' model kind: never again
	// served counts batches served overlapped, sampled those with a row
	// that is not plain greedy (tests).
	served, sampled int
}

// step serves batch through the overlap and signals its requests, or
// returns false (the overlap stopped) for the serial step.
func (v *overlapRun) step(batch []*stepReq) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.off || slices.ContainsFunc(batch, func(r *stepReq) bool { return r.dev == nil }) {
		v.stopLocked()
		return false
	}
	ctx := context.Background()
	if !v.matches(batch) {
		v.stopLocked()
		if !v.start(ctx, batch) {
			return false
		}
	}
	toks, err := v.o.Next(ctx)
	if err != nil {
		v.stopLocked()
	} else {
		v.next = append(v.next[:0], toks...)
		v.served++
		for j, p := range v.pick {
			if len(v.marks[j]) > 0 { // the returned token used its step's draw
				v.marks[j] = v.marks[j][1:]
			}
			p.accept(toks[j])
		}
	}
	for i, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.picked, r.logits = Picked{Tok: toks[v.idx[i]]}, nil
		}
		r.done <- struct{}{}
	}
	return true
}

// start begins an overlap of batch's members, in batch order.
func (v *overlapRun) start(ctx context.Context, batch []*stepReq) bool {
	n := len(batch)
	caches, toks, specs := make([]engine.KVCache, n), make([]int32, n), make([]engine.SampleSpec, n)
	v.pick, v.marks = v.pick[:0], v.marks[:0]
	sampled := false
	for i, r := range batch {
		caches[i], toks[i] = r.cache, r.tok
		v.pick, v.marks = append(v.pick, r.dev), append(v.marks, nil)
		s := r.dev.sampler.(*sample.Sampler)
		specs[i] = engine.SampleSpec{Params: s.Params(), History: r.dev.history, Counts: s.Counts()}
		if specs[i].Params.Temperature > 0 {
			specs[i].Uniform = func() float64 {
				v.marks[i] = append(v.marks[i], s.Mark())
				return s.Uniform()
			}
		}
		sampled = sampled || !specs[i].Plain()
	}
	o, err := v.m.StartOverlap(ctx, caches, toks, specs)
	if err != nil {
		v.rewind()
		if errors.Is(err, engine.ErrNoOverlap) {
			v.off = true
		}
		return false // the serial step reports any other error
	}
	v.o, v.caches = o, caches
	v.idx = v.idx[:0]
	for i := range batch {
		v.idx = append(v.idx, i)
	}
	if sampled {
		v.sampled++
	}
	return true
}

// matches reports whether batch is exactly the overlap's members, each
// feeding the token it was given last; it fills v.idx.
func (v *overlapRun) matches(batch []*stepReq) bool {
	if v.o == nil || len(batch) != len(v.caches) {
		return false
	}
	v.idx = v.idx[:0]
	for _, r := range batch {
		j := slices.Index(v.caches, r.cache)
		if j < 0 || v.next[j] != r.tok || v.pick[j] != r.dev {
			return false
		}
		v.idx = append(v.idx, j)
	}
	return true
}

// one is step for a lone generation's step (no batcher): ok false when
// v is nil or did not overlap it (the caller steps serially).
func (v *overlapRun) one(ctx context.Context, p *Picker, cache engine.KVCache, tok int32) (out stepOut, ok bool, err error) {
	if v == nil {
		return stepOut{}, false, nil
	}
	if err := ctx.Err(); err != nil {
		return stepOut{}, true, err
	}
	r := &stepReq{cache: cache, tok: tok, dev: p, done: make(chan struct{}, 1)}
	if !v.step([]*stepReq{r}) {
		return stepOut{}, false, nil
	}
	<-r.done
	if r.err != nil {
		return stepOut{}, true, r.err
	}
	return stepOut{picked: &r.picked}, true, nil
}

// release stops the overlap if it holds cache: a member that stops
// stepping gets its cache back without the step in flight.
func (v *overlapRun) release(cache engine.KVCache) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.o != nil && slices.Contains(v.caches, cache) {
		v.stopLocked()
	}
}

func (v *overlapRun) stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopLocked()
}

func (v *overlapRun) stopLocked() {
	if v.o == nil {
		return
	}
	if err := v.o.Stop(); err != nil {
		v.log.Error("overlapped decode: stopping", "err", err)
	}
	v.o = nil
	v.rewind()
	clear(v.caches)
	v.caches = v.caches[:0]
}

// rewind gives each sampler back the draws of the steps whose tokens
// were dropped.
func (v *overlapRun) rewind() {
	for j, ms := range v.marks {
		if len(ms) > 0 {
			v.pick[j].sampler.(*sample.Sampler).Reset(ms[0])
		}
	}
	clear(v.pick)
	v.pick, v.marks = v.pick[:0], v.marks[:0]
}
