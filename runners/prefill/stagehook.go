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
	_, _, err := p.run(ctx, tokens, 0, 0, nil, limit, compute)
	return err
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

// Computing reports whether a computation of tokens from at most from is
// running (and taking followers).
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

// await is how a request on a later stage gets its prompt: a follower of
// the computation running for it (waiting for one, and asking stage 0 for
// one once, when there is none), or nil when the prefix cache holds it.
func (p *Producer) await(ctx context.Context, req *kvwire.Request, pl *plan) (*follower, error) {
	end := len(req.Tokens) - 1
	asked := false
	for {
		p.mu.Lock()
		have := p.cache.peek(req.Tokens, end, p.info.Recurrent != nil)
		if have >= end {
			p.mu.Unlock()
			return nil, nil
		}
		for _, j := range p.jobs {
			if !j.closed && slices.Equal(j.tokens, req.Tokens) {
				f := p.joinLocked(j, pl, req.StartPos)
				p.mu.Unlock()
				return f, nil
			}
		}
		changed := p.changed
		p.mu.Unlock()
		if !p.pipe.Up() {
			return nil, fmt.Errorf("%w: %s: a link to the other stages is down", kvwire.ErrRemoteInternal, p.pipe.Stage())
		}
		if !asked {
			if err := p.pipe.Want(req.Tokens, have); err != nil {
				return nil, fmt.Errorf("%w: %v", kvwire.ErrRemoteInternal, err)
			}
			asked = true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s waited for the stages upstream: %v", kvwire.ErrRemoteInternal, p.pipe.Stage(), context.Cause(ctx))
		}
	}
}
