package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
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
// Logprobs are computed on the device with the tokens (RowLogprober).
//
// A constrained row (SampleSpec.Mask: a grammar) needs step n's token on
// the host before step n+1's mask exists, so a batch with one is split in
// two graphs: Next queues step n+1's forward from the device tokens of
// step n, reads step n's tokens, tells each row's Accept and asks its
// Mask while the device runs that forward, then queues a small graph that
// applies the masks and picks. The device waits only for that small graph.
//
// A backend without RowSampler (cpu) picks on the host, from the
// evaluated logits, with sample.Sampler itself (and sample.Logprobs).
// Between calls the model is free for other work (each call takes its
// lock); the caches must not be used elsewhere until Stop.
//
// Cache contents: after StartOverlap(tokens) and k calls of Next, the
// caches hold tokens and the first k-1 tokens Next returned, plus the
// step in flight (the k-th); Stop drops that one, so that the caches hold
// what a serial decode that picked the same tokens would. A row whose
// SampleSpec.Steps are used up is not in the following steps (Caches
// lists the rows in flight): its cache holds what a serial decode's
// holds after its last token, with nothing to drop. The step in flight
// has drawn its Uniform already: the caller puts that draw back
// (sample.Sampler.Reset) when it stops. Not safe for concurrent use.
type Overlap struct {
	m *Model
	// The rows of the step in flight (after Next: of the next one).
	caches []KVCache
	starts []int // each cache's length before the step in flight
	specs  []SampleSpec
	left   []int // steps each row may take after the one in flight (-1: no bound)
	ph     [][]int32
	phTok  []int32

	fl   flight // the step in flight; fl.tok nil: none
	toks []int32
	// Next's logprobs, by row of its tokens (lp: some row wants them).
	lpc []float64
	lpt [][]sample.TokenLogprob
	lp  bool
	top int // the most top logprobs a row wants

	plain bool          // every row greedy without penalties or mask: the argmax
	split bool          // some row is constrained: forward and pick are two graphs
	rs    RowSampler    // the device's sampler; nil: picked on the host
	rl    RowLogprober  // the device's logprobs; nil: computed on the host
	sa    *SampleArrays // rs's inputs (kept arrays), made at the first step
	u     []float32     // a step's uniforms (rs)
	mask  []float32     // a step's masks (B×V), made on the host
	bad   []error       // a row's Mask failed (Failed)
	// The host's picks (no RowSampler): a Sampler per row with the
	// row's counts, and the row's history.
	ref  []*sample.Sampler
	hist [][]int32
	pick []int32
	// Reused step after step by Next: the rows' state before the call
	// (put back if the step cannot be queued: restore; also the rows of
	// the step Next reads), the rows that take the next step, and
	// launch's arrays.
	saved rowState
	keep  []int32
	args  []Array
}

// flight is a queued step's arrays (kept).
type flight struct {
	tok        Array // [B] I32
	lc, li, lv Array // RowLogprobs' chosen, ids, vals (nil: none, or on the host)
	// With top logprobs, what the host reads back in two arrays rather
	// than four: ints the tokens then the ids [B + B·top] I32, floats
	// the chosen values then the top ones [B + B·top] F32.
	ints, floats Array
	// host: the logprobs computed on the host (no RowLogprober).
	hostC []float64
	hostT [][]sample.TokenLogprob
}

func (f *flight) free(b Backend) {
	for _, a := range []Array{f.tok, f.lc, f.li, f.lv, f.ints, f.floats} {
		if a != nil {
			b.Free(a)
		}
	}
	*f = flight{}
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
// ErrNoOverlap, and so are rows that are not plain greedy (or want
// logprobs) on a lazy backend that cannot sample (or compute logprobs) on
// the device. A row's Mask failing fails StartOverlap.
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
	n := len(caches)
	o = &Overlap{m: m, caches: slices.Clone(caches), starts: make([]int, n), left: make([]int, n),
		toks: make([]int32, n), ph: make([][]int32, n), phTok: make([]int32, n),
		specs: slices.Clone(specs), plain: true}
	if o.specs == nil {
		o.specs = make([]SampleSpec, n)
	}
	for i := range o.specs {
		sp := &o.specs[i]
		if sp.Params.Temperature > 0 && sp.Uniform == nil {
			return nil, fmt.Errorf("engine: StartOverlap: row %d samples without a Uniform", i)
		}
		o.plain = o.plain && sp.Plain()
		o.split = o.split || sp.Mask != nil
		if sp.Logprobs {
			o.lp, o.top = true, max(o.top, min(sp.Top, sample.MaxTopLogprobs))
		}
		o.left[i] = -1
		if sp.Steps > 0 {
			o.left[i] = sp.Steps - 1
		}
	}
	_, lazy := m.b.(AsyncEvaler)
	rs, _ := m.b.(RowSampler)
	if rs != nil && !rs.CanSampleRows() {
		rs = nil
	}
	if rl, ok := m.b.(RowLogprober); ok && rs != nil {
		o.rl = rl // the mlx backend has both, or neither
	}
	switch {
	case (o.plain && (!o.lp || o.rl != nil)) || (rs != nil && (!o.lp || o.rl != nil)):
		if !o.plain {
			o.rs = rs
			o.u = make([]float32, n)
		}
	case lazy:
		return nil, ErrNoOverlap
	default:
		o.plain = false
		o.hostSamplers()
	}
	if o.lp {
		o.lpc, o.lpt = make([]float64, n), make([][]sample.TokenLogprob, n)
	}
	for i := range o.ph {
		o.ph[i] = o.phTok[i : i+1 : i+1]
	}
	copy(o.phTok, tokens)
	ids := m.b.FromInt32(o.phTok, n)
	if o.split {
		err = o.queueSplit(ids, nil)
	} else {
		err = o.queue(ids)
	}
	if err != nil {
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
// (on the device where it can) and starts evaluating it: o.fl becomes
// that step. The caller holds m.mu. On failure the caches are truncated
// to where the step began.
func (o *Overlap) queue(ids Array) (err error) {
	m, b := o.m, o.m.b
	for i, c := range o.caches {
		o.starts[i] = c.Len()
	}
	var fl flight
	var seen, counts Array
	defer func() {
		if err != nil {
			o.truncate()
			fl.free(b)
			for _, a := range []Array{seen, counts} {
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
	fl, seen, counts, err = o.pickGraph(out, m.scr.evalArgs)
	if err != nil {
		return err
	}
	// the step's other arrays (none without recurrent layers)
	return o.launch(&fl, seen, counts, m.scr.evalArgs[1:])
}

// queueSplit builds a step of ids [B] over the caches and queues its
// forward alone (the logits kept); then, once before is done (Next reads
// the previous step's tokens and tells Accept; nil: nothing to do), asks
// the rows' masks while the device computes the forward and queues the
// pick. On failure the caches are truncated to where the step began.
func (o *Overlap) queueSplit(ids Array, before func() error) (err error) {
	m, b := o.m, o.m.b
	for i, c := range o.caches {
		o.starts[i] = c.Len()
	}
	var out Array
	var fl flight
	var seen, counts Array
	defer func() {
		if err != nil {
			if out != nil {
				_ = b.Eval(out) // the forward must be done before its cache rows go
			}
			o.truncate()
			fl.free(b)
			for _, a := range []Array{seen, counts} {
				if a != nil {
					b.Free(a)
				}
			}
		}
		if out != nil {
			b.Free(out)
		}
		b.Free()
	}()
	defer recoverInto(&err, "overlapped step")
	err = func() error {
		s := m.beginStep(o.caches, o.ph)
		defer m.scr.endStep()
		o1, err := m.stepGraph(s, ids, lastRows)
		if err != nil {
			return err
		}
		out = o1
		b.Keep(out)
		if ae, ok := b.(AsyncEvaler); ok {
			return ae.AsyncEval(m.scr.evalArgs...)
		}
		return b.Eval(m.scr.evalArgs...)
	}()
	if err != nil {
		return err
	}
	if before != nil {
		if err := before(); err != nil {
			return err
		}
	}
	o.fillMasks(out.Shape()[1])
	fl, seen, counts, err = o.pickGraph(out, []Array{out})
	if err != nil {
		return err
	}
	return o.launch(&fl, seen, counts, nil)
}

// truncate drops the step being queued from the caches.
func (o *Overlap) truncate() {
	for i, c := range o.caches {
		truncateHeld(c, o.starts[i])
	}
}

// fillMasks asks each constrained row's Mask for the step (V tokens a
// row) into o.mask. A row whose Mask fails does not fail the step (the
// other rows go on): its error is recorded for Failed, the one way it
// reaches the caller, and the row is left unconstrained; the caller stops
// before using its token.
func (o *Overlap) fillMasks(V int) {
	B := len(o.caches)
	if cap(o.mask) < B*V {
		o.mask = make([]float32, B*V)
	}
	o.mask = o.mask[:B*V]
	clear(o.mask)
	if len(o.bad) != B {
		o.bad = make([]error, B)
	}
	clear(o.bad)
	for i := range o.specs {
		if f := o.specs[i].Mask; f != nil {
			row := o.mask[i*V : (i+1)*V]
			if err := f(row); err != nil {
				o.bad[i] = err
				clear(row)
			}
		}
	}
}

// Failed returns the first error of a row's Mask during the last call
// (StartOverlap or Next) and the row (of the step in flight): that row's
// token in flight is not constrained, and the caller must Stop before
// taking it (the serial path then meets the error itself).
func (o *Overlap) Failed() (int, error) {
	for i, err := range o.bad {
		if err != nil {
			return i, err
		}
	}
	return -1, nil
}

// pickGraph builds the pick of each row's token from the step's logits
// out [B, V] (and its logprobs); eval is what must be evaluated for the
// host to read out (the host's pick).
func (o *Overlap) pickGraph(out Array, eval []Array) (fl flight, seen, counts Array, err error) {
	b := o.m.b
	var maskArr Array
	if o.split && o.rs != nil {
		V := out.Shape()[1]
		maskArr = b.FromFloat32(o.mask, len(o.caches), V)
	}
	switch {
	case o.plain:
		fl.tok = b.Argmax(out) // [B] I32
	case o.rs != nil:
		if o.sa == nil {
			o.sa = SampleInputs(b, o.specs, out.Shape()[1])
		}
		// the step's own inputs (swept with the step) on a copy: the
		// backend may read sa after SampleRows returns
		sa := *o.sa
		sa.U, sa.Mask = nil, maskArr
		if sa.Sampled {
			for i := range o.specs {
				o.u[i] = 0
				if o.specs[i].Params.Temperature > 0 {
					o.u[i] = float32(o.specs[i].Uniform())
				}
			}
			sa.U = b.FromFloat32(o.u[:len(o.specs)], len(o.specs))
		}
		fl.tok, seen, counts = o.rs.SampleRows(out, &sa)
	default:
		if fl.tok, err = o.hostPick(out, eval, &fl); err != nil {
			return fl, nil, nil, err
		}
		return fl, nil, nil, nil
	}
	if o.lp && o.rl != nil {
		o.top = min(o.top, out.Shape()[1])
		fl.lc, fl.li, fl.lv = o.rl.RowLogprobs(out, fl.tok, o.top)
		if fl.li != nil {
			B := len(o.caches)
			fl.ints = b.Concat(0, fl.tok, b.Reshape(b.AsType(fl.li, I32), B*o.top))
			fl.floats = b.Concat(0, b.AsType(fl.lc, F32), b.Reshape(b.AsType(fl.lv, F32), B*o.top))
		}
	}
	return fl, seen, counts, nil
}

// launch keeps the step's arrays and starts evaluating them (with the
// step's other arrays extra); o.fl becomes the step.
func (o *Overlap) launch(fl *flight, seen, counts Array, extra []Array) error {
	b := o.m.b
	args := o.args[:0]
	for _, a := range []Array{fl.tok, fl.lc, fl.li, fl.lv, fl.ints, fl.floats, seen, counts} {
		if a != nil {
			b.Keep(a)
			args = append(args, a)
		}
	}
	args = append(args, extra...)
	var err error
	if ae, ok := b.(AsyncEvaler); ok {
		err = ae.AsyncEval(args...)
	} else {
		err = b.Eval(args...)
	}
	clear(args)
	o.args = args[:0]
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
	o.fl = *fl
	return nil
}

// hostPick evaluates the step's logits out and picks each row's token
// with the rows' own Samplers (a backend without RowSampler), masked by
// the rows' masks, and computes the rows' logprobs into fl.
func (o *Overlap) hostPick(out Array, eval []Array, fl *flight) (Array, error) {
	b := o.m.b
	if err := b.Eval(eval...); err != nil {
		return nil, err
	}
	f, err := b.Float32(out)
	if err != nil {
		return nil, err
	}
	B := len(o.caches)
	V := len(f) / B
	if o.lp {
		fl.hostC, fl.hostT = make([]float64, B), make([][]sample.TokenLogprob, B)
	}
	var masked []float32
	for i := range o.specs {
		row := f[i*V : (i+1)*V]
		pr := row
		if o.specs[i].Mask != nil && o.mask != nil {
			masked = append(masked[:0], row...)
			for j, v := range o.mask[i*V : (i+1)*V] {
				if v < 0 {
					masked[j] = float32(math.Inf(-1))
				}
			}
			pr = masked
		}
		if o.specs[i].Params.Temperature > 0 {
			o.pick[i] = o.ref[i].SampleWith(pr, o.hist[i], o.specs[i].Uniform())
		} else {
			o.pick[i] = o.ref[i].Sample(pr, o.hist[i])
		}
		o.hist[i] = append(o.hist[i], o.pick[i])
		if o.lp && o.specs[i].Logprobs {
			fl.hostC[i], fl.hostT[i] = sample.Logprobs(row, o.pick[i], o.specs[i].Top)
		}
	}
	return b.FromInt32(o.pick[:B], B), nil
}

// freeInputs releases the device sampler's inputs.
func (o *Overlap) freeInputs() {
	if o.sa != nil {
		o.sa.Free(o.m.b)
		o.sa = nil
	}
}

// Caches returns the rows of the step in flight, in order: those whose
// tokens the next Next returns (nil when no step is in flight).
func (o *Overlap) Caches() []KVCache {
	if o.fl.tok == nil {
		return nil
	}
	return o.caches
}

// Next queues the following step (of the rows that may still take one),
// fed with the tokens of the step in flight, then reads those tokens
// back and returns them (one per row of Caches before the call; the slice
// is o's, valid until the next call). Each row's Accept is told its
// token; a constrained batch's masks are asked then (see Overlap). On
// error the caches hold what they held before the call's step. After the
// last step (every row's Steps used up) no step is queued and Caches is
// empty.
func (o *Overlap) Next(ctx context.Context) ([]int32, error) {
	if o.fl.tok == nil {
		return nil, errors.New("engine: Overlap.Next with no step in flight (after Stop, or after the rows' last step)")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m, b := o.m, o.m.b
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	prev := o.fl
	o.save()
	prevSpecs := o.saved.specs // Accept's, by row of prev
	o.fl = flight{}
	// the rows that take the next step
	o.keep = o.keep[:0]
	for i, l := range o.left {
		if l != 0 {
			o.keep = append(o.keep, int32(i))
		}
	}
	// read: prev's tokens were read (prev is freed and its tokens are in
	// o.toks, or lost with the error of reading them).
	read := false
	readPrev := func() error {
		read = true
		if err := o.read(&prev, prevSpecs); err != nil {
			return err
		}
		for i := range prevSpecs {
			if f := prevSpecs[i].Accept; f != nil {
				if err := f(o.toks[i]); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if len(o.keep) == 0 { // every row's last step: nothing to queue
		err := readPrev()
		clear(o.caches)
		clear(o.saved.caches)
		o.caches, o.specs, o.left = o.caches[:0], o.specs[:0], o.left[:0]
		o.freeInputs()
		if err != nil {
			return nil, err
		}
		return o.toks[:len(prevSpecs)], nil
	}
	ids := prev.tok
	if len(o.keep) < len(o.caches) {
		idx := b.FromInt32(o.keep, len(o.keep))
		ids = b.Take(prev.tok, idx)
		var sa *SampleArrays
		if o.sa != nil {
			sa = o.sa.takeRows(b, idx)
		}
		o.compact(o.keep, sa)
	}
	for i := range o.left {
		if o.left[i] > 0 {
			o.left[i]--
		}
	}
	var err error
	readErr := error(nil)
	if o.split {
		err = o.queueSplit(ids, func() error { readErr = readPrev(); return readErr })
	} else {
		if err = o.queue(ids); err == nil {
			readErr = readPrev()
		}
	}
	switch {
	case err != nil && !read:
		// nothing queued and the step in flight not read: back to it
		o.restore()
		o.fl = prev
		return nil, err
	case err != nil:
		// the step in flight was read (its tokens are lost with the
		// error) and the next one did not start: nothing is in flight
		return nil, err
	case readErr != nil:
		return nil, readErr
	}
	if old := o.saved.sa; old != nil && old != o.sa {
		old.Free(b) // compacted: o.sa took its rows
	}
	return o.toks[:len(prevSpecs)], nil
}

// rowState is the rows' host state, kept across a Next that may fail.
type rowState struct {
	caches []KVCache
	starts []int
	specs  []SampleSpec
	left   []int
	phTok  []int32
	ref    []*sample.Sampler
	hist   [][]int32
	sa     *SampleArrays
}

// save copies the rows' state into o.saved (its buffers reused).
func (o *Overlap) save() {
	r := &o.saved
	r.caches = append(r.caches[:0], o.caches...)
	r.starts = append(r.starts[:0], o.starts...)
	r.specs = append(r.specs[:0], o.specs...)
	r.left = append(r.left[:0], o.left...)
	r.phTok = append(r.phTok[:0], o.phTok...)
	r.ref = append(r.ref[:0], o.ref...)
	r.hist = append(r.hist[:0], o.hist...)
	r.sa = o.sa
}

// restore puts back the rows' state save kept.
func (o *Overlap) restore() {
	r := &o.saved
	if o.sa != r.sa && o.sa != nil {
		o.sa.Free(o.m.b)
	}
	o.caches = append(o.caches[:0], r.caches...)
	o.starts = append(o.starts[:0], r.starts...)
	o.specs = append(o.specs[:0], r.specs...)
	o.left = append(o.left[:0], r.left...)
	o.phTok = append(o.phTok[:0], r.phTok...)
	if o.ref != nil {
		o.ref = append(o.ref[:0], r.ref...)
		o.hist = append(o.hist[:0], r.hist...)
	}
	o.sa = r.sa
	o.placeholders()
}

// placeholders points each row's ph at its phTok.
func (o *Overlap) placeholders() {
	o.ph = o.ph[:0]
	for i := range o.phTok {
		o.ph = append(o.ph, o.phTok[i:i+1:i+1])
	}
}

// compact keeps the rows keep (ascending) of the host state, in place;
// sa (nil: no device inputs) replaces o.sa, whose rows it took.
func (o *Overlap) compact(keep []int32, sa *SampleArrays) {
	n := len(keep)
	for d, s := range keep { // d ≤ s: in place
		o.caches[d], o.starts[d], o.specs[d], o.left[d], o.phTok[d] = o.caches[s], o.starts[s], o.specs[s], o.left[s], o.phTok[s]
		if o.ref != nil {
			o.ref[d], o.hist[d] = o.ref[s], o.hist[s]
		}
	}
	clear(o.caches[n:]) // hold no cache, nor a spec's functions, past them
	clear(o.specs[n:])
	o.caches, o.starts, o.specs, o.left, o.phTok = o.caches[:n], o.starts[:n], o.specs[:n], o.left[:n], o.phTok[:n]
	if o.ref != nil {
		o.ref, o.hist = o.ref[:n], o.hist[:n]
	}
	o.placeholders()
	if sa != nil {
		o.sa = sa // the old one is freed by Next once the step is queued
	}
}

// read waits for fl's tokens (and logprobs), copies them into o.toks
// (and o.lpc, o.lpt) for its rows (specs), and frees fl.
func (o *Overlap) read(fl *flight, specs []SampleSpec) error {
	b, n := o.m.b, len(specs)
	defer fl.free(b)
	toks := fl.tok
	if fl.ints != nil {
		toks = fl.ints // the tokens, then the top ids
	}
	raw, err := b.Bytes(toks)
	if err != nil {
		return err
	}
	if len(raw) < 4*n || (fl.ints == nil && len(raw) != 4*n) {
		return fmt.Errorf("engine: overlapped step read %d bytes for %d tokens", len(raw), n)
	}
	for i := range n {
		o.toks[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if !o.lp {
		return nil
	}
	if fl.hostC != nil {
		copy(o.lpc, fl.hostC)
		copy(o.lpt, fl.hostT)
		return nil
	}
	if fl.lc == nil {
		return nil
	}
	var c, vals []float32
	var ids []byte
	if fl.floats != nil {
		f, err := b.Float32(fl.floats) // the chosen values, then the top ones
		if err != nil {
			return err
		}
		if len(f) < n {
			return fmt.Errorf("engine: overlapped step read %d logprobs for %d tokens", len(f), n)
		}
		c, vals, ids = f[:n], f[n:], raw[4*n:]
	} else if c, err = b.Float32(fl.lc); err != nil {
		return err
	}
	if len(c) != n || len(ids) != 4*n*o.top || len(vals) != n*o.top {
		return fmt.Errorf("engine: overlapped step read %d logprobs and %d top for %d tokens", len(c), len(vals), n)
	}
	for i := range n {
		o.lpc[i] = float64(c[i])
		o.lpt[i] = o.lpt[i][:0]
		if math.IsNaN(o.lpc[i]) { // no finite logit (sample.Logprobs: -Inf, no top)
			o.lpc[i] = math.Inf(-1)
			continue
		}
		k := min(o.top, specs[i].Top)
		for j := range k {
			at := i*o.top + j
			o.lpt[i] = append(o.lpt[i], sample.TokenLogprob{ID: int32(binary.LittleEndian.Uint32(ids[4*at:])), Logprob: float64(vals[at])})
		}
	}
	return nil
}

// Drain makes the step in flight the last one: the next Next reads its
// tokens and queues none (every row leaves, as at the end of its Steps),
// so that the caches keep that step and nothing is computed for nothing.
// A caller that must run a step of another shape next (a speculative
// verification) drains instead of stopping, which would drop the step.
func (o *Overlap) Drain() {
	for i := range o.left {
		o.left[i] = 0
	}
}

// Logprob returns the logprob of the i-th token the last Next returned
// and its row's top alternatives (sample.Logprobs's numbers, computed in
// float32 on the device; the slice is o's, valid until the next call),
// for a row whose SampleSpec asked for them.
func (o *Overlap) Logprob(i int) (float64, []sample.TokenLogprob) {
	if !o.lp || i >= len(o.lpc) {
		return math.Inf(-1), nil
	}
	return o.lpc[i], o.lpt[i]
}

// Stop waits for the step in flight, discards its tokens and truncates
// the caches to where that step began. The caches are then the caller's
// again. Stop is idempotent.
func (o *Overlap) Stop() error {
	m := o.m
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	if o.fl.tok != nil {
		_, err = m.b.Bytes(o.fl.tok) // waits: the step's arrays must be done before the caches drop them
		o.fl.free(m.b)
		for i, c := range o.caches {
			if !c.CanTruncate(o.starts[i]) {
				err = errors.Join(err, fmt.Errorf("engine: overlapped decode cannot drop the token in flight of cache %d", i))
				continue
			}
			truncateHeld(c, o.starts[i])
		}
	}
	clear(o.caches)
	clear(o.saved.caches)
	clear(o.saved.specs)
	o.caches = o.caches[:0]
	o.freeInputs()
	return err
}
