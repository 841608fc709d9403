package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// AsyncEvaler is implemented by lazy backends that can start computing
// arrays without waiting for them (MLX's async_eval). Like Eval it ends
// the step's other temporaries; reading an array afterwards (Bytes) waits
// for that array alone. A backend without it is stepped with Eval.
type AsyncEvaler interface {
	AsyncEval(arrays ...Array) error
}

// ErrNoOverlap says that a GreedyOverlap cannot run these caches: the
// overlapped step appends one token that the caller may not want, and a
// recurrent state (hybrid models) cannot drop it again.
var ErrNoOverlap = errors.New("engine: overlapped decode needs caches that can drop a token (no recurrent state)")

// GreedyOverlap runs greedy decode steps of a fixed set of sequences the
// way mlx-lm's generate_step does: each step's next tokens are chosen on
// the device (argmax of its logits, ties to the lowest id, as
// sample.Sampler's greedy rule), and the following step is built from
// those device tokens and queued (AsyncEvaler) before they are read back,
// so the device computes step n+1 while the host handles step n's tokens.
// The tokens are exactly those of Forward followed by a greedy pick on the
// host. Between calls the model is free for other work (each call takes
// its lock); the caches must not be used elsewhere until Stop.
//
// Cache contents: after StartGreedy(tokens) and k calls of Next, the
// caches hold tokens and the first k-1 tokens Next returned, plus the
// step in flight (the k-th); Stop drops that one, so that the caches hold
// what a serial decode that picked the same tokens would. Not safe for
// concurrent use.
type GreedyOverlap struct {
	m      *Model
	caches []KVCache
	starts []int   // each cache's length before the step in flight
	tok    Array   // the step in flight's tokens [B] I32 (kept), nil after Stop
	toks   []int32 // Next's result, reused
	ph     [][]int32
	phTok  []int32
}

// StartGreedy queues the first overlapped step: tokens[i] continues
// caches[i] (one token per sequence, as ForwardBatch). It returns once the
// step is queued; Next returns its tokens. Caches with a recurrent state
// are refused with ErrNoOverlap.
func (m *Model) StartGreedy(ctx context.Context, caches []KVCache, tokens []int32) (o *GreedyOverlap, err error) {
	if len(caches) == 0 || len(caches) != len(tokens) {
		return nil, fmt.Errorf("engine: StartGreedy with %d caches and %d tokens", len(caches), len(tokens))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	for i, c := range caches {
		if slices.Contains(caches[:i], c) {
			return nil, fmt.Errorf("engine: StartGreedy: cache %d appears twice", i)
		}
		if _, ok := c.(*hybridCache); ok {
			return nil, ErrNoOverlap
		}
		if err := m.checkCache(c, tokens[i:i+1]); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o = &GreedyOverlap{m: m, caches: slices.Clone(caches), starts: make([]int, len(caches)),
		toks: make([]int32, len(caches)), ph: make([][]int32, len(caches)), phTok: make([]int32, len(caches))}
	for i := range o.ph {
		o.ph[i] = o.phTok[i : i+1 : i+1]
	}
	copy(o.phTok, tokens)
	if err := o.queue(m.b.FromInt32(o.phTok, len(tokens))); err != nil {
		return nil, err
	}
	return o, nil
}

// queue builds a step of ids [B] over the caches, picks each row's argmax
// on the device and starts evaluating it; o.tok becomes that step's
// tokens. The caller holds m.mu. On failure the caches are truncated to
// where the step began.
func (o *GreedyOverlap) queue(ids Array) (err error) {
	m, b := o.m, o.m.b
	for i, c := range o.caches {
		o.starts[i] = c.Len()
	}
	defer func() {
		if err != nil {
			for i, c := range o.caches {
				truncateHeld(c, o.starts[i])
			}
		}
		b.Free()
	}()
	defer recoverInto(&err, "overlapped step")
	s := m.beginStep(o.caches, o.ph)
	defer m.scr.endStep()
	out, err := m.stepGraph(s, ids, lastRows)
	if err != nil {
		return err
	}
	tok := b.Argmax(out) // [B] I32
	b.Keep(tok)
	args := append(m.scr.evalArgs[:0:0], tok)
	args = append(args, m.scr.evalArgs[1:]...) // the step's other arrays (none without recurrent layers)
	if ae, ok := b.(AsyncEvaler); ok {
		err = ae.AsyncEval(args...)
	} else {
		err = b.Eval(args...)
	}
	if err != nil {
		b.Free(tok)
		return err
	}
	o.tok = tok
	return nil
}

// Next queues the following step, fed with the tokens of the step in
// flight, then reads those tokens back and returns them (one per
// sequence; the slice is o's, valid until the next call). On error the
// caches hold what they held before the call's step.
func (o *GreedyOverlap) Next(ctx context.Context) ([]int32, error) {
	if o.tok == nil {
		return nil, errors.New("engine: GreedyOverlap.Next after Stop")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := o.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	prev, prevStarts := o.tok, slices.Clone(o.starts)
	if err := o.queue(prev); err != nil {
		o.tok = prev
		copy(o.starts, prevStarts)
		return nil, err
	}
	if err := o.read(prev); err != nil {
		return nil, err
	}
	return o.toks, nil
}

// read copies tok's values into o.toks and frees tok.
func (o *GreedyOverlap) read(tok Array) error {
	b := o.m.b
	raw, err := b.Bytes(tok)
	b.Free(tok)
	if err != nil {
		return err
	}
	if len(raw) != 4*len(o.toks) {
		return fmt.Errorf("engine: overlapped step read %d bytes for %d tokens", len(raw), len(o.toks))
	}
	for i := range o.toks {
		o.toks[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return nil
}

// Stop waits for the step in flight, discards its tokens and truncates
// the caches to where that step began. The caches are then the caller's
// again. Stop is idempotent.
func (o *GreedyOverlap) Stop() error {
	if o.tok == nil {
		return nil
	}
	m := o.m
	m.mu.Lock()
	defer m.mu.Unlock()
	tok := o.tok
	o.tok = nil
	err := o.read(tok) // waits: the step's arrays must be done before the caches drop them
	for i, c := range o.caches {
		if !c.CanTruncate(o.starts[i]) {
			err = errors.Join(err, fmt.Errorf("engine: overlapped decode cannot drop the token in flight of cache %d", i))
			continue
		}
		truncateHeld(c, o.starts[i])
	}
	clear(o.caches)
	return err
}
