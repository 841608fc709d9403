package prefill

import (
	"context"
	"fmt"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// StageHook is what a prefill pipeline stage (runners/prefill/pipeline)
// installs on its Producer with SetStage: on stage 0 a request's
// computation goes through Compute (which passes each chunk's hidden
// states on); on a later stage a request never computes by itself but
// follows the computation the stages upstream feed (Drive), waiting for
// one, or reads the prefix cache (await).
type StageHook interface {
	// Later reports whether this is a stage after the first.
	Later() bool
	// Compute is stage 0's ComputeFunc.
	Compute(ctx context.Context, c engine.KVCache, prompt []int32, from, end int, onChunk func(start, n int) error) error
	// Want asks stage 0 to compute prompt from at most position from.
	Want(prompt []int32, from int) error
	// Stage names the stage in errors ("prefill stage 1/2").
	Stage() string
	// Up reports whether the stage's links to the others are up: a later
	// stage waiting for a computation with a link down would wait for
	// nothing. The hook calls Producer.StageChanged when a link goes down.
	Up() bool
}

// StageChanged wakes the requests waiting on a later stage for a
// computation (await), so that they see a link that went down and fail
// at once instead of waiting for what no stage will send.
func (p *Producer) StageChanged() {
	p.mu.Lock()
	p.notifyLocked()
	p.mu.Unlock()
}

// ComputeFunc computes positions [from, end) of prompt into c (holding
// from), calling onChunk(start, n) after each chunk.
type ComputeFunc func(ctx context.Context, c engine.KVCache, prompt []int32, from, end int, onChunk func(start, n int) error) error

// SetStage makes p a stage of a prefill pipeline (before it serves).
func (p *Producer) SetStage(h StageHook) { p.pipe = h }

// Layers is the model layers p holds (Options.Stage, or every layer).
func (p *Producer) Layers() engine.LayerRange { return p.stage }

// Chunk is p's prefill chunk in tokens.
func (p *Producer) Chunk() int { return p.o.Chunk }

// Drive computes tokens up to len(tokens)−1 from the longest cached prefix
// of at most limit positions with compute, shipping nothing of its own:
// the requests for the prompt follow it and the prefix cache keeps it. A
// prefill pipeline's stages drive what the stage upstream passes on.
func (p *Producer) Drive(ctx context.Context, tokens []int32, limit int, compute ComputeFunc) error {
	_, _, err := p.run(ctx, tokens, 0, 0, nil, limit, compute, nil)
	return err
}

// Computation is a computation Open has opened: the requests for its
// prompt follow it from then on; Run computes it.
type Computation struct {
	p      *Producer
	j      *job
	tokens []int32
	limit  int
}

// Open opens a computation of tokens from at most limit cached positions
// at once (cheap: no cache is copied), so that a request waiting for the
// prompt follows it from now on; Run must follow. A prefill pipeline's
// later stage opens what the stage upstream passes on as it reads it, so
// that what it tells stage 0 it has received (Want) is open here.
func (p *Producer) Open(tokens []int32, limit int) *Computation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &Computation{p: p, j: p.openLocked(tokens, 0, 0, limit), tokens: tokens, limit: limit}
}

// OpenMarked is Open for a stage hook that numbers the computations it
// opens (mark, increasing in the order it opens them): p remembers the
// highest mark in the same step as it opens the computation, and a
// request that registers as waiting for its prompt later names that mark
// in its Want (MarkedWanter), so that the stage computing upstream can
// tell a computation this request will follow (a mark above it) from one
// it will not. A tensor prefill group's follower opens rank 0's
// computations so.
func (p *Producer) OpenMarked(tokens []int32, limit int, mark uint64) *Computation {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mark = max(p.mark, mark)
	return &Computation{p: p, j: p.openLocked(tokens, 0, 0, limit), tokens: tokens, limit: limit}
}

// MarkedWanter is a StageHook whose Wants name the highest mark
// (OpenMarked) p had opened when the asking request registered as waiting
// for a computation of its prompt: every computation with a higher mark
// opened after that, and the request follows the first of them. A hook
// that implements it gets WantMarked instead of Want.
type MarkedWanter interface {
	WantMarked(prompt []int32, from int, seen uint64) error
}

// Run computes c with compute, as Drive does.
func (c *Computation) Run(ctx context.Context, compute ComputeFunc) error {
	_, _, err := c.p.run(ctx, c.tokens, 0, 0, nil, c.limit, compute, c.j)
	return err
}

// DriveUnless is stage 0's answer to a Want: Drive, unless a computation
// of tokens from at most limit runs now, or passed reports (called with
// p's lock held, so that no computation opens meanwhile) that one the
// asking stage had not yet received when it asked was passed on: the
// asking stage gets that one. It reports whether it computed.
func (p *Producer) DriveUnless(ctx context.Context, tokens []int32, limit int, compute ComputeFunc, passed func() bool) (bool, error) {
	p.mu.Lock()
	for _, j := range p.jobs {
		if !j.closed && j.from <= limit && slices.Equal(j.tokens, tokens) {
			p.mu.Unlock()
			return false, nil
		}
	}
	if passed() {
		p.mu.Unlock()
		return false, nil
	}
	j := p.openLocked(tokens, 0, 0, limit)
	p.mu.Unlock()
	_, _, err := p.run(ctx, tokens, 0, 0, nil, limit, compute, j)
	return true, err
}

// Computing reports whether a computation of tokens from at most from is
// running (and taking followers). DriveUnless checks this and opens a
// computation in one step.
func (p *Producer) Computing(tokens []int32, from int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, j := range p.jobs {
		if !j.closed && j.from <= from && slices.Equal(j.tokens, tokens) {
			return true
		}
	}
	return false
}

// Cached is how many leading positions of tokens (at most limit) the
// prefix cache would give a computation starting now.
func (p *Producer) Cached(tokens []int32, limit int) int {
	return p.cache.peek(tokens, limit, p.info.Recurrent != nil)
}

// Idle reports whether no computation is running on p (every job has
// ended, its tokens counted in the metrics).
func (p *Producer) Idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.jobs) == 0
}

// waiter is a request on a later stage waiting for a computation of its
// prompt: the next job opened for the prompt takes it as a follower
// (openLocked), however soon that job ends.
type waiter struct {
	tokens []int32
	pl     *plan
	start  int
	got    chan *follower // buffered: the follower, once a job took it
}

// await is how a request on a later stage gets its prompt: a follower of
// the computation running for it, or nil when the prefix cache holds it.
// When there is neither it registers as a waiter, which the next
// computation of the prompt takes, and asks stage 0 for one (once).
func (p *Producer) await(ctx context.Context, req *kvwire.Request, pl *plan) (f *follower, err error) {
	end := len(req.Tokens) - 1
	var w *waiter
	var seen uint64 // p.mark when w registered
	defer func() {
		if w == nil {
			return
		}
		p.mu.Lock()
		p.waiters = slices.DeleteFunc(p.waiters, func(x *waiter) bool { return x == w })
		p.mu.Unlock()
		// A job took it after all: follow that one, or tell it this
		// request is gone.
		select {
		case got := <-w.got:
			if f == nil && err == nil {
				f = got
			} else {
				close(got.done)
			}
		default:
		}
	}()
	for {
		if w != nil {
			select {
			case f := <-w.got:
				w = nil
				return f, nil
			default:
			}
		}
		p.mu.Lock()
		have := p.cache.peek(req.Tokens, end, p.info.Recurrent != nil)
		if have >= end {
			p.mu.Unlock()
			return nil, nil
		}
		ending := false // a computation of the prompt is ending: the prefix cache may have it next
		for _, j := range p.jobs {
			if slices.Equal(j.tokens, req.Tokens) {
				if !j.closed {
					f := p.joinLocked(j, pl, req.StartPos)
					p.mu.Unlock()
					return f, nil
				}
				ending = true
			}
		}
		ask := false
		if w == nil && !ending {
			w = &waiter{tokens: req.Tokens, pl: pl, start: req.StartPos, got: make(chan *follower, 1)}
			p.waiters = append(p.waiters, w)
			ask, seen = true, p.mark
		}
		changed := p.changed
		p.mu.Unlock()
		if !p.pipe.Up() {
			return nil, fmt.Errorf("%w: %s: a link to the other stages is down", kvwire.ErrRemoteInternal, p.pipe.Stage())
		}
		if ask {
			// Asked after registering: a computation that begins from
			// now on takes this request, however soon it ends.
			var err error
			if mw, ok := p.pipe.(MarkedWanter); ok {
				err = mw.WantMarked(req.Tokens, have, seen)
			} else {
				err = p.pipe.Want(req.Tokens, have)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %v", kvwire.ErrRemoteInternal, err)
			}
		}
		var got <-chan *follower
		if w != nil {
			got = w.got
		}
		select {
		case f := <-got:
			w = nil
			return f, nil
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s waited for the stages upstream: %v", kvwire.ErrRemoteInternal, p.pipe.Stage(), context.Cause(ctx))
		}
	}
}
