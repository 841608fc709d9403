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

// StageStep runs several sequences' chunks through the stage's layers in
// one step, as ForwardBatch does for a whole model: toks[i] continues
// caches[i] at its current length (the caches distinct, every chunk at
// least one token). The first stage embeds the tokens (hidden nil); a
// later stage takes the previous stage's output for all the rows in
// order, hidden [Σ len(toks[i]), D] (float32, row-major). The last stage
// returns each sequence's last-position logits [V] (logits[i], hidden
// nil); the others their output hidden states [Σ len(toks[i]), D], the
// next stage's input (logits nil). Every row is what it would be with
// its sequence alone (the backends' ops are row-independent), so a
// pipeline decoding several sequences together gives each one's tokens
// bit for bit on the cpu backend. The results belong to the caller. On
// error every cache is truncated to where it was.
func (m *Model) StageStep(ctx context.Context, caches []KVCache, toks [][]int32, hidden []float32) (out []float32, logits [][]float32, err error) {
	out, logits, _, err = m.stageStep(ctx, caches, toks, hidden, nil, nil)
	return out, logits, err
}

// Carrier moves a pipeline step's hidden states between neighbouring
// stages on the backend's own transport (an MLX group's send and recv)
// instead of through the host. Its arrays are lazy like the backend's: the
// transfer happens when the array is evaluated, and a receive blocks there
// until the matching send has been evaluated on the previous stage.
type Carrier interface {
	// Recv is the previous stage's output of one step, an array of the
	// given shape and dtype.
	Recv(shape []int, dt DType) Array
	// Send returns an array whose evaluation sends x to the next stage.
	Send(x Array) Array
}

// ErrCarry is wrapped by a carried step's error after which the order of
// the carrier's transfers is unknown (a receive may or may not have been
// consumed, a send may be half done): the stages can no longer agree on
// which array is which step's, and the carrier must be given up.
var ErrCarry = errors.New("engine: a carried step's transfer failed")

// CarryStats are the hidden-state bytes a carried step moved.
type CarryStats struct{ Received, Sent int64 }

// StageStepCarried is StageStep with the hidden states moved by c: a
// stage after the first receives its input rows [Σ len(toks[i]), D] from c
// (in the activations' dtype); a stage before the last computes its
// layers, then calls ready (which must tell the next stage to receive:
// the step's descriptor on the control link) and then sends its output
// with c, returning no hidden states; the last stage returns the logits as
// StageStep does. On an error that does not wrap ErrCarry the receive
// has been consumed (a step refused before its computation still reads
// and drops its input) and nothing was sent, so the carrier stays in
// step with its neighbours; a ready error is returned as is, nothing sent.
func (m *Model) StageStepCarried(ctx context.Context, caches []KVCache, toks [][]int32, c Carrier, ready func() error) (logits [][]float32, st CarryStats, err error) {
	if c == nil {
		return nil, st, errors.New("engine: StageStepCarried without a carrier")
	}
	_, logits, st, err = m.stageStep(ctx, caches, toks, nil, c, ready)
	return logits, st, err
}

// DiscardCarried reads and drops the input of a carried step of rows
// tokens that the stage refuses before computing it (a later stage only),
// so that the carrier's next receive is the next step's. An error wraps
// ErrCarry.
func (m *Model) DiscardCarried(rows int, c Carrier) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.discardCarried(rows, c)
}

// discardCarried is DiscardCarried with m.mu held.
func (m *Model) discardCarried(rows int, c Carrier) (err error) {
	if m.embed != nil || rows <= 0 {
		return nil
	}
	defer recoverInto(&err, "discard a carried step")
	defer func() {
		if err != nil && !errors.Is(err, ErrCarry) {
			err = fmt.Errorf("%w: %w", ErrCarry, err)
		}
	}()
	defer m.b.Free()
	return m.b.Eval(c.Recv([]int{rows, m.cfg.Hidden}, m.actDType()))
}

// carriedBytes is the size of rows hidden-state rows on a carrier.
func (m *Model) carriedBytes(rows int) int64 {
	return int64(rows) * int64(m.cfg.Hidden) * int64(m.actDType().Size())
}

// stageStep is StageStep, and with c StageStepCarried.
func (m *Model) stageStep(ctx context.Context, caches []KVCache, toks [][]int32, hidden []float32, c Carrier, ready func() error) (out []float32, logits [][]float32, st CarryStats, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	for _, t := range toks {
		total += len(t)
	}
	computed := false
	if c != nil && m.embed == nil {
		// A step refused before its computation still consumes its input.
		defer func() {
			if err != nil && !computed {
				if derr := m.discardCarried(total, c); derr != nil {
					err = fmt.Errorf("%w (and its input could not be drained: %w)", err, derr)
				}
			}
		}()
	}
	if len(caches) == 0 || len(caches) != len(toks) {
		return nil, nil, st, fmt.Errorf("engine: StageStep with %d caches and %d chunks", len(caches), len(toks))
	}
	for i, c := range caches {
		if len(toks[i]) == 0 {
			return nil, nil, st, fmt.Errorf("engine: StageStep: chunk %d is empty", i)
		}
		for _, d := range caches[:i] {
			if d == c {
				return nil, nil, st, fmt.Errorf("engine: StageStep: cache %d appears twice", i)
			}
		}
		if err := m.checkCache(c, toks[i]); err != nil {
			return nil, nil, st, err
		}
	}
	D := m.cfg.Hidden
	switch {
	case m.embed != nil && hidden != nil:
		return nil, nil, st, fmt.Errorf("%w: the first stage embeds the tokens; it takes no hidden states", ErrStage)
	case c == nil && m.embed == nil && len(hidden) != total*D:
		return nil, nil, st, fmt.Errorf("%w: %d hidden values for %d tokens of width %d", ErrStage, len(hidden), total, D)
	case c != nil && hidden != nil:
		return nil, nil, st, fmt.Errorf("%w: a carried step takes its hidden states from the carrier", ErrStage)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, st, err
	}
	computed = true
	starts := make([]int, len(caches))
	beginSeqs(caches, starts, toks)
	defer func() { m.endSeqs(caches, starts, err) }()
	var sent bool // ready succeeded: the send may have begun
	if c != nil {
		defer func() {
			// A failure with a receive in the graph, or once the send
			// may have begun, leaves the transfers' order unknown.
			if err != nil && (m.embed == nil || sent) && !errors.Is(err, ErrCarry) {
				err = fmt.Errorf("%w: %w", ErrCarry, err)
			}
		}()
	}
	defer recoverInto(&err, "stage step")
	if c == nil {
		out, logits, err = m.stageSeqs(caches, toks, hidden, nil, nil)
		return out, logits, st, err
	}
	_, logits, err = m.stageSeqs(caches, toks, nil, c, func() error {
		if ready != nil {
			if err := ready(); err != nil {
				return err
			}
		}
		sent = true
		return nil
	})
	if m.embed == nil {
		st.Received = m.carriedBytes(total)
	}
	if sent && err == nil {
		st.Sent = m.carriedBytes(total)
	}
	return nil, logits, st, err
}

// stageSeqs is StageStep's step (m.mu held, the caches begun).
//
// With a carrier c, a later stage's input is c's receive (evaluated with
// the step: a failure then wraps ErrCarry), and a stage without the head
// evaluates its output, calls ready and sends it with c (a failed send
// wraps ErrCarry; a ready error is returned as is).
func (m *Model) stageSeqs(caches []KVCache, toks [][]int32, hidden []float32, c Carrier, ready func() error) ([]float32, [][]float32, error) {
	b := m.b
	s := m.beginStep(caches, toks)
	defer m.scr.endStep()
	var x Array
	if c != nil && m.embed == nil {
		x = c.Recv([]int{s.n, m.cfg.Hidden}, m.actDType())
	} else {
		x = m.stageInput(s, hidden)
	}
	carryErr := func(err error) error {
		if c != nil && m.embed == nil && err != nil && !errors.Is(err, ErrCarry) {
			return fmt.Errorf("%w: %w", ErrCarry, err)
		}
		return err
	}
	for i, blk := range m.blocks {
		var err error
		if x, err = blk.forward(s, i, x); err != nil {
			return nil, nil, carryErr(err)
		}
	}
	if m.head == nil && c != nil {
		x = b.AsType(x, m.actDType())
		if err := b.Eval(append([]Array{x}, s.eval...)...); err != nil {
			return nil, nil, carryErr(err)
		}
		if err := ready(); err != nil {
			return nil, nil, err
		}
		if err := b.Eval(c.Send(x)); err != nil {
			return nil, nil, fmt.Errorf("%w: send: %w", ErrCarry, err)
		}
		return nil, nil, nil
	}
	if m.head == nil {
		x = b.AsType(x, F32)
		if err := b.Eval(append([]Array{x}, s.eval...)...); err != nil {
			return nil, nil, err
		}
		out, err := b.Float32(x)
		return out, nil, err
	}
	last := x // one row per sequence when every chunk is one token
	if s.n != len(caches) {
		for i := range caches {
			end := s.starts[i] + len(toks[i])
			s.outs[i] = b.Slice(x, 0, end-1, end) // [1, D]
		}
		last = s.join(s.outs)
	}
	out := b.Linear(b.RMSNorm(last, m.head.norm, m.eps), m.head.out) // [B, V]
	if err := b.Eval(append([]Array{out}, s.eval...)...); err != nil {
		return nil, nil, carryErr(err)
	}
	f, err := b.Float32(out)
	if err != nil {
		return nil, nil, err
	}
	V := len(f) / len(caches)
	logits := make([][]float32, len(caches))
	for i := range logits {
		logits[i] = f[i*V : (i+1)*V : (i+1)*V]
	}
	return nil, logits, nil
}

// SendHidden sends rows rows of host hidden states (a prefill pipeline
// stage's output, [rows, D] float32) to the next stage with c, evaluated
// at once; the result is the bytes sent. An error wraps ErrCarry: the
// order of the carrier's transfers is then unknown.
func (m *Model) SendHidden(c Carrier, hidden []float32, rows int) (n int64, err error) {
	if rows <= 0 || len(hidden) != rows*m.cfg.Hidden {
		return 0, fmt.Errorf("engine: SendHidden of %d values as %d rows of %d", len(hidden), rows, m.cfg.Hidden)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer wrapCarry(&err)
	defer recoverInto(&err, "send carried hidden states")
	defer m.b.Free()
	if err := m.b.Eval(c.Send(m.b.FromFloat32(hidden, rows, m.cfg.Hidden))); err != nil {
		return 0, err
	}
	return int64(len(hidden)) * 4, nil
}

// RecvHidden receives rows rows of the previous stage's hidden states
// ([rows, D] float32, SendHidden's) from c onto the host; n is the bytes
// received. An error wraps ErrCarry.
func (m *Model) RecvHidden(c Carrier, rows int) (hidden []float32, n int64, err error) {
	if rows <= 0 {
		return nil, 0, fmt.Errorf("engine: RecvHidden of %d rows", rows)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer wrapCarry(&err)
	defer recoverInto(&err, "receive carried hidden states")
	defer m.b.Free()
	h, err := m.b.Float32(c.Recv([]int{rows, m.cfg.Hidden}, F32))
	if err != nil {
		return nil, 0, err
	}
	if len(h) != rows*m.cfg.Hidden {
		return nil, 0, fmt.Errorf("engine: received %d hidden values for %d rows of %d", len(h), rows, m.cfg.Hidden)
	}
	return h, int64(len(h)) * 4, nil
}

func wrapCarry(err *error) {
	if *err != nil && !errors.Is(*err, ErrCarry) {
		*err = fmt.Errorf("%w: %w", ErrCarry, *err)
	}
}
