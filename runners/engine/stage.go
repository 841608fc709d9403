package engine

import (
	"context"
	"errors"
	"fmt"
)

// LayerRange is a pipeline stage's layers [Start, End) (LoadOptions.Layers).
// The zero value is the whole model.
type LayerRange struct{ Start, End int }

// ErrStage is wrapped by calls a pipeline stage cannot serve alone (a
// whole-model Forward on a stage without the embedding or the head).
var ErrStage = errors.New("engine: a pipeline stage")

// stageRange resolves r against n layers.
func stageRange(r LayerRange, n int) (LayerRange, error) {
	if r == (LayerRange{}) {
		return LayerRange{0, n}, nil
	}
	if r.Start < 0 || r.End > n || r.Start >= r.End {
		return r, fmt.Errorf("engine: layer range [%d, %d) of a %d-layer model", r.Start, r.End, n)
	}
	return r, nil
}

// Stage is the layer range the model holds (the whole model unless it was
// loaded with LoadOptions.Layers).
func (m *Model) Stage() LayerRange { return m.stage }

// StageForward runs one chunk of a sequence through the stage's layers,
// appending their KV to c (a cache of the stage's layers, NewCache). The
// first stage takes the tokens; a later stage takes the previous stage's
// hidden states hidden [len(tokens), D] (float32, row-major; tokens still
// give the positions and must be the chunk's). The last stage returns the
// last position's logits [V]; the others their output hidden states
// [len(tokens), D], the next stage's input. On error c is truncated to
// where it was.
func (m *Model) StageForward(ctx context.Context, c KVCache, tokens []int32, hidden []float32) (out []float32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(tokens) == 0 {
		return nil, errors.New("engine: StageForward with no tokens")
	}
	if err := m.checkCache(c, tokens); err != nil {
		return nil, err
	}
	D := m.cfg.Hidden
	switch {
	case m.embed != nil && hidden != nil:
		return nil, fmt.Errorf("%w: the first stage embeds the tokens; it takes no hidden states", ErrStage)
	case m.embed == nil && len(hidden) != len(tokens)*D:
		return nil, fmt.Errorf("%w: %d hidden values for %d tokens of width %d", ErrStage, len(hidden), len(tokens), D)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	err = m.guarded(c, len(tokens), "stage forward", func() (err error) {
		switch {
		case m.head != nil && m.embed != nil:
			m.scr.flat = nil
			err = m.step(c, tokens, true, &out)
		case m.head != nil:
			out, err = m.stageTail(c, tokens, hidden)
		default:
			out, err = m.stageHidden(c, tokens, hidden)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// stageInput is the stage's input rows [n, D]: the embedded tokens or the
// previous stage's hidden states (in the activations' dtype).
func (m *Model) stageInput(s *step, hidden []float32) Array {
	b := m.b
	if m.embed == nil {
		return b.AsType(b.FromFloat32(hidden, s.n, m.cfg.Hidden), m.actDType())
	}
	x := b.Embedding(m.embed.table, b.FromInt32(m.scr.ids, s.n))
	if m.embed.scale != nil {
		x = b.Mul(x, m.embed.scale)
	}
	return x
}

// stageHidden runs a stage without the head and reads its output back.
func (m *Model) stageHidden(c KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	cs, ts := [1]KVCache{c}, [1][]int32{tokens}
	s := m.beginStep(cs[:], ts[:])
	defer m.scr.endStep()
	x := m.stageInput(s, hidden)
	for i, blk := range m.blocks {
		var err error
		if x, err = blk.forward(s, i, x); err != nil {
			return nil, err
		}
	}
	x = m.b.AsType(x, F32)
	if err := m.b.Eval(append([]Array{x}, s.eval...)...); err != nil {
		return nil, err
	}
	return m.b.Float32(x)
}

// stageTail runs the last stage of a pipeline from hidden states: its
// blocks, the final norm and the LM head of the last position.
func (m *Model) stageTail(c KVCache, tokens []int32, hidden []float32) ([]float32, error) {
	cs, ts := [1]KVCache{c}, [1][]int32{tokens}
	s := m.beginStep(cs[:], ts[:])
	defer m.scr.endStep()
	b := m.b
	x := m.stageInput(s, hidden)
	for i, blk := range m.blocks {
		var err error
		if x, err = blk.forward(s, i, x); err != nil {
			return nil, err
		}
	}
	if s.n > 1 {
		x = b.Slice(x, 0, s.n-1, s.n)
	}
	out := b.Linear(b.RMSNorm(x, m.head.norm, m.eps), m.head.out)
	if err := b.Eval(append([]Array{out}, s.eval...)...); err != nil {
		return nil, err
	}
	return b.Float32(out)
}
