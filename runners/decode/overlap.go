package decode

import (
	"context"
	"errors"
	"fmt"
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

// newOverlapRun is m's overlapped decode.
func newOverlapRun(m overlapStarter, log *slog.Logger) *overlapRun {
	return &overlapRun{m: m, log: log}
}

// overlappable returns the generation's Picker when its tokens may be
// picked on the device (engine.SampleSpec: greedy or sample.Sampler's
// temperature, top-k/p, min-p, seeded draws, penalties, logit bias, a
// grammar or tool-call constraint's mask made on the host while the
// device computes the step, logprobs computed on the device), so that
// its steps can be overlapped; nil when a step must be serial: a
// pipeline's picking stage, or a sampler that is not sample.Sampler.
// A speculating generation's plain steps are overlapped too; its
// verifications are serial (see Server.generate).
func overlappable(p *Picker, pm PickingModel) *Picker {
	if p == nil || pm != nil {
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
// back its draws) and runs serially. A member whose max_tokens ends with
// the step in flight is not in the next one (engine.SampleSpec.Steps):
// it leaves without stopping the others.
type overlapRun struct {
	m   overlapStarter
	log *slog.Logger
	req stepReq // one's request, reused

	mu   sync.Mutex
	o    *engine.Overlap
	rows []*ovRow // o's rows in flight, in its order
	read []*ovRow // scratch: the rows of the step Next reads
	idx  []int    // scratch: batch position → rows' index
	off  bool     // StartOverlap refused these caches' model kind: never again
	// served counts batches served overlapped; sampled, constrained and
	// logprobs the overlaps begun with a row that is not plain greedy,
	// with a grammar's mask, with logprobs; dropped the steps stopped in
	// flight, computed for nothing (tests).
	served, sampled, constrained, logprobs, dropped int
}

// ovRow is one member of the overlap.
type ovRow struct {
	cache engine.KVCache
	pick  *Picker
	// marks are the random states before each draw that no returned
	// token has used yet (the step in flight's; two after a failed
	// Next): Stop resets the sampler to the first.
	marks []sample.Mark
	next  int32 // what Next returned last: the member's next token
	// A constrained row's Accept: the constraint's error (the request
	// fails with it) and whether it is complete.
	err  error
	done bool
}

// step serves batch through the overlap and signals its requests, or
// returns false (the overlap stopped) for the serial step. A request with
// last set drains the overlap (engine.Overlap.Drain): its step is the
// last, nothing is queued after it. The stat returned (seqs 0 after an
// error) is the step's for the batch's cost model: untimed
// (stepStat.untimed), since an overlapped step's forward runs while the
// host handles the step before, so its time is not comparable with a
// serial step's, which the verifications a speculating member weighs
// are; nor is an overlap's first step's (its Next queues the second
// step, and on MLX's CPU device read 0.05–1.0 of a step for an extra
// position where serial steps read 0.77). A speculating generation's
// plain step after a verification is serial instead (Server.generate),
// and times the plain step.
func (v *overlapRun) step(batch []*stepReq) (stepStat, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.off || slices.ContainsFunc(batch, func(r *stepReq) bool { return r.dev == nil }) {
		v.stopLocked()
		return stepStat{}, false
	}
	ctx := context.Background()
	st := stepStat{seqs: len(batch), positions: len(batch), untimed: true}
	if !v.matches(batch) {
		v.stopLocked()
		if !v.start(ctx, batch) {
			return stepStat{}, false
		}
	}
	if slices.ContainsFunc(batch, func(r *stepReq) bool { return r.last }) {
		v.o.Drain()
	}
	v.read = append(v.read[:0], v.rows...)
	toks, err := v.o.Next(ctx)
	failed := false
	if err != nil {
		v.stopLocked()
		st = stepStat{}
	} else {
		v.served++
		for j, w := range v.read {
			if len(w.marks) > 0 { // the returned token used its step's draw
				w.marks = w.marks[1:]
			}
			w.next = toks[j]
			w.pick.accept(toks[j])
			failed = failed || w.err != nil
		}
	}
	for i, r := range batch {
		r.st, r.ahead = st, false
		switch {
		case err != nil:
			r.err = err
		case v.read[v.idx[i]].err != nil:
			r.err = fmt.Errorf("constraint: %w", v.read[v.idx[i]].err)
		default:
			w, j := v.read[v.idx[i]], v.idx[i]
			r.picked, r.logits = Picked{Tok: toks[j], Done: w.done}, nil
			if w.pick.logprobs {
				lp, top := v.o.Logprob(j)
				r.picked.Logprob = w.pick.logprobOf(toks[j], lp, top)
			}
		}
	}
	if err == nil {
		// the rows still in flight (those whose max_tokens ended are not)
		in := v.o.Caches()
		v.rows = slices.DeleteFunc(v.rows, func(w *ovRow) bool { return !slices.Contains(in, w.cache) })
		if _, merr := v.o.Failed(); merr != nil || failed || len(v.rows) == 0 {
			v.stopLocked() // a mask failed: the serial step meets the error; or nothing left in flight
		}
	}
	for i, r := range batch {
		r.ahead = r.err == nil && v.o != nil && slices.Contains(v.rows, v.read[v.idx[i]])
		r.done <- struct{}{}
	}
	clear(v.read)
	return st, true
}

// start begins an overlap of batch's members, in batch order.
func (v *overlapRun) start(ctx context.Context, batch []*stepReq) bool {
	n := len(batch)
	caches, toks, specs := make([]engine.KVCache, n), make([]int32, n), make([]engine.SampleSpec, n)
	v.rows = v.rows[:0]
	sampled, constrained, logprobs := false, false, false
	for i, r := range batch {
		w := &ovRow{cache: r.cache, pick: r.dev}
		v.rows = append(v.rows, w)
		caches[i], toks[i] = r.cache, r.tok
		p := r.dev
		s := p.sampler.(*sample.Sampler)
		specs[i] = engine.SampleSpec{Params: s.Params(), History: p.history, Counts: s.Counts(),
			Logprobs: p.logprobs, Top: p.top, Steps: r.left}
		if specs[i].Params.Temperature > 0 {
			specs[i].Uniform = func() float64 {
				w.marks = append(w.marks, s.Mark())
				return s.Uniform()
			}
		}
		if p.cons != nil {
			specs[i].Mask = func(dst []float32) error {
				if w.err != nil || w.done {
					return nil // its generation ends with the token before: the step in flight is dropped
				}
				return p.cons.Mask(dst)
			}
			specs[i].Accept = func(tok int32) error {
				if w.err == nil {
					w.err = p.cons.Accept(tok)
					w.done = w.err == nil && p.cons.Done()
				}
				return nil // the request fails with w.err, not the batch
			}
			constrained = true
		}
		sampled = sampled || !specs[i].Plain()
		logprobs = logprobs || p.logprobs
	}
	o, err := v.m.StartOverlap(ctx, caches, toks, specs)
	if err == nil {
		if _, merr := o.Failed(); merr != nil { // the serial step meets the error
			err = merr
			if serr := o.Stop(); serr != nil {
				v.log.Error("overlapped decode: stopping", "err", serr)
			}
		}
	}
	if err != nil {
		v.rewind()
		if errors.Is(err, engine.ErrNoOverlap) {
			v.off = true
		}
		return false // the serial step reports any other error
	}
	v.o = o
	v.idx = v.idx[:0]
	for i := range batch {
		v.idx = append(v.idx, i)
	}
	if sampled {
		v.sampled++
	}
	if constrained {
		v.constrained++
	}
	if logprobs {
		v.logprobs++
	}
	return true
}

// matches reports whether batch is exactly the overlap's members, each
// feeding the token it was given last; it fills v.idx.
func (v *overlapRun) matches(batch []*stepReq) bool {
	if v.o == nil || len(batch) != len(v.rows) {
		return false
	}
	v.idx = v.idx[:0]
	for _, r := range batch {
		j := slices.IndexFunc(v.rows, func(w *ovRow) bool { return w.cache == r.cache })
		if j < 0 || v.rows[j].next != r.tok || v.rows[j].pick != r.dev {
			return false
		}
		v.idx = append(v.idx, j)
	}
	return true
}

// one is step for a lone generation's step (no batcher): ok false when
// v is nil or did not overlap it (the caller steps serially). left is how
// many steps the generation may still take, this one included (0: no
// bound); last drains the overlap (stepReq.last).
func (v *overlapRun) one(ctx context.Context, p *Picker, cache engine.KVCache, tok int32, left int, last bool) (out stepOut, ok bool, err error) {
	if v == nil {
		return stepOut{}, false, nil
	}
	if err := ctx.Err(); err != nil {
		return stepOut{}, true, err
	}
	v.req = stepReq{cache: cache, tok: tok, dev: p, left: left, last: last, done: v.req.done}
	if v.req.done == nil {
		v.req.done = make(chan struct{}, 1)
	}
	r := &v.req
	if _, ok := v.step([]*stepReq{r}); !ok {
		return stepOut{}, false, nil
	}
	<-r.done
	if r.err != nil {
		return stepOut{}, true, r.err
	}
	return stepOut{picked: &r.picked, stat: r.st, ahead: r.ahead}, true, nil
}

// release stops the overlap if it holds cache in flight: a member that
// stops stepping gets its cache back without the step in flight.
func (v *overlapRun) release(cache engine.KVCache) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.o != nil && slices.ContainsFunc(v.rows, func(w *ovRow) bool { return w.cache == cache }) {
		v.stopLocked()
	}
}

func (v *overlapRun) stop() {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopLocked()
}

func (v *overlapRun) stopLocked() {
	if v.o == nil {
		return
	}
	if len(v.o.Caches()) > 0 {
		v.dropped++
	}
	if err := v.o.Stop(); err != nil {
		v.log.Error("overlapped decode: stopping", "err", err)
	}
	v.o = nil
	v.rewind()
}

// rewind gives each sampler back the draws of the steps whose tokens
// were dropped.
func (v *overlapRun) rewind() {
	for _, w := range v.rows {
		if len(w.marks) > 0 {
			w.pick.sampler.(*sample.Sampler).Reset(w.marks[0])
		}
	}
	clear(v.rows)
	v.rows = v.rows[:0]
}
