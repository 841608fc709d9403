package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/exo-pd/exo-pd/runners/sample"
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

// Overlap runs decode steps of a fixed set of sequences the way mlx-lm's
// generate_step does: each step's next tokens are chosen on the device
// (SampleSpec: argmax, or sample.Sampler's rules with penalties, logit
// bias, temperature, top-k/p, min-p and a draw from the host's seeded
// stream), and the following step is built from those device tokens and
// queued (AsyncEvaler) before they are read back, so the device computes
// step n+1 while the host handles step n's tokens. Greedy tokens are
// exactly those of Forward followed by a pick on the host; sampled ones
// are too but for float rounding at a draw's boundary (the device
// computes the probabilities in float32, sample.Sampler in float64).
// A backend without RowSampler (cpu) picks on the host, from the
// evaluated logits, with sample.Sampler itself. Between calls the model is
// free for other work (each call takes its lock); the caches must not be
// used elsewhere until Stop.
//
// Cache contents: after StartOverlap(tokens) and k calls of Next, the
// caches hold tokens and the first k-1 tokens Next returned, plus the
// step in flight (the k-th); Stop drops that one, so that the caches hold
// what a serial decode that picked the same tokens would. The step in
// flight has drawn its Uniform already: the caller puts that draw back
// (sample.Sampler.Reset) when it stops. Not safe for concurrent use.
type Overlap struct {
	m      *Model
	caches []KVCache
	starts []int   // each cache's length before the step in flight
	tok    Array   // the step in flight's tokens [B] I32 (kept), nil after Stop
	toks   []int32 // Next's result, reused
	ph     [][]int32
	phTok  []int32

	specs []SampleSpec
	plain bool          // every row greedy without penalties: the argmax
	rs    RowSampler    // the device's sampler; nil: picked on the host
	sa    *SampleArrays // rs's inputs (kept arrays), made at the first step
	u     []float32     // a step's uniforms (rs)
	// The host's picks (no RowSampler): a Sampler per row with the
	// row's counts, and the row's history.
	ref  []*sample.Sampler
	hist [][]int32
	pick []int32
}

// GreedyOverlap is an Overlap whose rows are all plain greedy.
type GreedyOverlap = Overlap

// StartGreedy is StartOverlap with every row plain greedy.
func (m *Model) StartGreedy(ctx context.Context, caches []KVCache, tokens []int32) (*Overlap, error) {
	return m.StartOverlap(ctx, caches, tokens, nil)
}

// StartOverlap queues the first overlapped step: tokens[i] continues
// caches[i] (one token per sequence, as ForwardBatch), picked by specs[i]
// (nil: all plain greedy). It returns once the step is queued; Next
// returns its tokens. Caches with a recurrent state are refused with
// ErrNoOverlap, and so are rows that are not plain greedy on a lazy
// backend that cannot sample on the device.
func (m *Model) StartOverlap(ctx context.Context, caches []KVCache, tokens []int32, specs []SampleSpec) (o *Overlap, err error) {
	if len(caches) == 0 || len(caches) != len(tokens) || (specs != nil && len(specs) != len(caches)) {
		return nil, fmt.Errorf("engine: StartOverlap with %d caches, %d tokens and %d specs", len(caches), len(tokens), len(specs))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	for i, c := range caches {
		if slices.Contains(caches[:i], c) {
			return nil, fmt.Errorf("engine: StartOverlap: cache %d appears twice", i)
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
	o = &Overlap{m: m, caches: slices.Clone(caches), starts: make([]int, len(caches)),
		toks: make([]int32, len(caches)), ph: make([][]int32, len(caches)), phTok: make([]int32, len(caches)),
		specs: slices.Clone(specs), plain: true}
	if o.specs == nil {
		o.specs = make([]SampleSpec, len(caches))
	}
	for i := range o.specs {
		sp := &o.specs[i]
		if sp.Params.Temperature > 0 && sp.Uniform == nil {
			return nil, fmt.Errorf("engine: StartOverlap: row %d samples without a Uniform", i)
		}
		o.plain = o.plain && sp.Plain()
	}
	if !o.plain {
		if rs, ok := m.b.(RowSampler); ok && rs.CanSampleRows() {
			o.rs = rs
			o.u = make([]float32, len(caches))
		} else if _, lazy := m.b.(AsyncEvaler); lazy {
			return nil, ErrNoOverlap
		} else {
			o.hostSamplers()
		}
	}
	for i := range o.ph {
		o.ph[i] = o.phTok[i : i+1 : i+1]
	}
	copy(o.phTok, tokens)
	if err := o.queue(m.b.FromInt32(o.phTok, len(tokens))); err != nil {
		o.freeInputs()
		return nil, err
	}
	return o, nil
}

// hostSamplers makes each row's Sampler and history for hostPick.
func (o *Overlap) hostSamplers() {
	n := len(o.specs)
	o.ref, o.hist, o.pick = make([]*sample.Sampler, n), make([][]int32, n), make([]int32, n)
	for i := range o.specs {
		sp := &o.specs[i]
		p := sp.Params
		p.RandomSeed = false // the draws are Uniform's
		o.ref[i] = sample.New(p)
		for id, c := range sp.Counts {
			for range c {
				o.ref[i].Observe(id)
			}
		}
		o.hist[i] = slices.Clone(sp.History)
	}
}

// queue builds a step of ids [B] over the caches, picks each row's token
// on the device and starts evaluating it; o.tok becomes that step's
// tokens. The caller holds m.mu. On failure the caches are truncated to
// where the step began.
func (o *Overlap) queue(ids Array) (err error) {
	m, b := o.m, o.m.b
	for i, c := range o.caches {
		o.starts[i] = c.Len()
	}
	var tok, seen, counts Array
	defer func() {
		if err != nil {
			for i, c := range o.caches {
				truncateHeld(c, o.starts[i])
			}
			for _, a := range []Array{tok, seen, counts} {
				if a != nil {
					b.Free(a)
				}
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
	switch {
	case o.plain:
		tok = b.Argmax(out) // [B] I32
	case o.rs != nil:
		if o.sa == nil {
			o.sa = SampleInputs(b, o.specs, out.Shape()[1])
		}
		o.sa.U = nil
		if o.sa.Sampled {
			for i := range o.specs {
				o.u[i] = 0
				if o.specs[i].Params.Temperature > 0 {
					o.u[i] = float32(o.specs[i].Uniform())
				}
			}
			o.sa.U = b.FromFloat32(o.u, len(o.u))
		}
		tok, seen, counts = o.rs.SampleRows(out, o.sa)
	default:
		if tok, err = o.hostPick(out); err != nil {
			return err
		}
	}
	b.Keep(tok)
	args := append(m.scr.evalArgs[:0:0], tok)
	for _, a := range []Array{seen, counts} {
		if a != nil {
			b.Keep(a)
			args = append(args, a)
		}
	}
	args = append(args, m.scr.evalArgs[1:]...) // the step's other arrays (none without recurrent layers)
	if ae, ok := b.(AsyncEvaler); ok {
		err = ae.AsyncEval(args...)
	} else {
		err = b.Eval(args...)
	}
	if err != nil {
		return err
	}
	if seen != nil {
		b.Free(o.sa.Seen)
		o.sa.Seen = seen
	}
	if counts != nil {
		b.Free(o.sa.Counts)
		o.sa.Counts = counts
	}
	o.tok = tok
	return nil
}

// hostPick evaluates the step's logits out and picks each row's token
// with the rows' own Samplers (a backend without RowSampler).
func (o *Overlap) hostPick(out Array) (Array, error) {
	m, b := o.m, o.m.b
	if err := b.Eval(m.scr.evalArgs...); err != nil {
		return nil, err
	}
	f, err := b.Float32(out)
	if err != nil {
		return nil, err
	}
	V := len(f) / len(o.specs)
	for i := range o.specs {
		row := f[i*V : (i+1)*V]
		if o.specs[i].Params.Temperature > 0 {
			o.pick[i] = o.ref[i].SampleWith(row, o.hist[i], o.specs[i].Uniform())
		} else {
			o.pick[i] = o.ref[i].Sample(row, o.hist[i])
		}
		o.hist[i] = append(o.hist[i], o.pick[i])
	}
	return b.FromInt32(o.pick, len(o.pick)), nil
}

// freeInputs releases the device sampler's inputs.
func (o *Overlap) freeInputs() {
	if o.sa != nil {
		o.sa.Free(o.m.b)
		o.sa = nil
	}
}

// Next queues the following step, fed with the tokens of the step in
// flight, then reads those tokens back and returns them (one per
// sequence; the slice is o's, valid until the next call). On error the
// caches hold what they held before the call's step.
func (o *Overlap) Next(ctx context.Context) ([]int32, error) {
	if o.tok == nil {
		return nil, errors.New("engine: Overlap.Next after Stop")
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
func (o *Overlap) read(tok Array) error {
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
func (o *Overlap) Stop() error {
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
	o.freeInputs()
	return err
}
