package decode

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// greedyStarter is a model that can run overlapped greedy steps
// (engine.Model: StartGreedy, mlx-lm's generate_step).
type greedyStarter interface {
	StartGreedy(ctx context.Context, caches []engine.KVCache, tokens []int32) (*engine.GreedyOverlap, error)
}

// overlapping reports whether the batcher should overlap m's plain greedy
// steps: m can, and its backend computes asynchronously (MLX). On the
// eager cpu backend an overlapped step gains nothing and every change of
// the batch's members would cost a step computed for nothing.
func overlapping(m Model) bool {
	if _, ok := m.(greedyStarter); !ok {
		return false
	}
	bm, ok := m.(interface{ Backend() engine.Backend })
	if !ok {
		return false
	}
	_, async := bm.Backend().(engine.AsyncEvaler)
	return async
}

// plainGreedy reports whether a generation's tokens are the argmax of the
// model's logits and nothing else reads the logits, so that the device
// may pick them (the overlapped step). Everything else takes the serial
// step, picked on the host: temperature > 0 (its random stream is
// sample.Sampler's PCG on the host; the device cannot draw the same
// values), repetition/presence/frequency penalties and logit bias (they
// change the argmax), a grammar or tool-call constraint (its mask),
// logprobs (they need the logits), speculation and a pipeline's picking
// stage.
func plainGreedy(req *gen.Request, p *Picker, sp *speculator, pm PickingModel) bool {
	sm := req.Sampling
	return p != nil && p.cons == nil && !p.logprobs && sp == nil && pm == nil &&
		sm.Temperature == 0 && (sm.RepetitionPenalty == 0 || sm.RepetitionPenalty == 1) &&
		sm.PresencePenalty == 0 && sm.FrequencyPenalty == 0 && len(sm.LogitBias) == 0
}

// overlapRun is a batcher's overlapped greedy decode: while the batch's
// members stay the same and all are plain greedy, each batch is one
// GreedyOverlap.Next (the step after it already queued); any other batch
// stops it first (the caches drop the step in flight) and runs serially.
type overlapRun struct {
	m   greedyStarter
	log *slog.Logger

	mu     sync.Mutex
	o      *engine.GreedyOverlap
	caches []engine.KVCache // o's caches, in its order
	next   []int32          // what o.Next returned last: each member's next token
	idx    []int            // scratch: batch position → o's index
	off    bool             // StartGreedy refused these caches' model kind: never again
	served int              // batches served overlapped (tests)
}

// step serves batch through the overlap and signals its requests, or
// returns false (the overlap stopped) for the serial step.
func (v *overlapRun) step(batch []*stepReq) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.off || slices.ContainsFunc(batch, func(r *stepReq) bool { return !r.greedy }) {
		v.stopLocked()
		return false
	}
	ctx := context.Background()
	if !v.matches(batch) {
		v.stopLocked()
		caches, toks := make([]engine.KVCache, len(batch)), make([]int32, len(batch))
		for i, r := range batch {
			caches[i], toks[i] = r.cache, r.tok
		}
		o, err := v.m.StartGreedy(ctx, caches, toks)
		if err != nil {
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
	}
	toks, err := v.o.Next(ctx)
	if err != nil {
		v.stopLocked()
	} else {
		v.next = append(v.next[:0], toks...)
		v.served++
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

// matches reports whether batch is exactly the overlap's members, each
// feeding the token it was given last; it fills v.idx.
func (v *overlapRun) matches(batch []*stepReq) bool {
	if v.o == nil || len(batch) != len(v.caches) {
		return false
	}
	v.idx = v.idx[:0]
	for _, r := range batch {
		j := slices.Index(v.caches, r.cache)
		if j < 0 || v.next[j] != r.tok {
			return false
		}
		v.idx = append(v.idx, j)
	}
	return true
}

// one is step for a lone generation's step (no batcher): ok false when
// v is nil or did not overlap it (the caller steps serially).
func (v *overlapRun) one(ctx context.Context, cache engine.KVCache, tok int32) (out stepOut, ok bool, err error) {
	if v == nil {
		return stepOut{}, false, nil
	}
	if err := ctx.Err(); err != nil {
		return stepOut{}, true, err
	}
	r := &stepReq{cache: cache, tok: tok, greedy: true, done: make(chan struct{}, 1)}
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
	clear(v.caches)
	v.caches = v.caches[:0]
}
