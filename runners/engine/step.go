package engine

import "slices"

// step is what the blocks of one forward step share: the sequences, their
// rows and positions, and what the step must evaluate besides its output.
// It lives in the Model's scratch (steps are serialized by its mutex) so
// that a warm decode step allocates nothing.
type step struct {
	m       *Model
	b       Backend
	cs      []KVCache // the step's caches (copied: callers' slices stay theirs)
	lens    []int     // each sequence's rows
	starts  []int     // each sequence's first row
	offsets []int     // each sequence's position before the step
	n       int       // rows in all
	batched bool      // more than one sequence: blocks slice and concatenate rows
	// decode: batched with one row per sequence (a decode step): attention
	// runs as one op over every row (Backend.RoPERows, BatchAttention).
	decode bool
	// tail: the block being run is the last of a step that wants no
	// logits: it only fills the caches (nothing reads its output).
	tail bool
	outs []Array // per sequence, reused by each block
	// eval: arrays the step evaluates besides its output (the tail
	// block's K/V, every recurrent layer's new state).
	eval []Array
}

// dims is the scratch's dims (a shape for a variadic op, allocation-free).
func (s *step) dims(ds ...int) []int { return s.m.scr.dims(ds...) }

// rows is sequence i's rows of a [n, …] (a itself with one sequence).
func (s *step) rows(a Array, i int) Array {
	if !s.batched {
		return a
	}
	return s.b.Slice(a, 0, s.starts[i], s.starts[i]+s.lens[i])
}

// join concatenates per-sequence rows back into [n, …].
func (s *step) join(outs []Array) Array {
	if !s.batched {
		return outs[0]
	}
	return s.b.Concat(0, outs...)
}

// stepSeqs runs several sequences' chunks through every block at once:
// toks[s] continues cs[s] at its current length. Embedding, projections
// and MLPs run once over all rows; RoPE, the cache append and attention
// run per sequence. With want lastRows it returns each sequence's last-
// position logits [V]; with everyRow the logits of every position of
// every chunk, in order. With one sequence the graph is the plain one (no
// slicing or concatenation). Every row's result is the same as when its
// sequence runs alone: the backends' ops are row-independent.
func (m *Model) stepSeqs(cs []KVCache, toks [][]int32, want logitRows) ([][]float32, error) {
	wantLogits := want != noRows
	b, scr := m.b, &m.scr
	s := m.beginStep(cs, toks)
	defer scr.endStep()
	out, err := m.stepGraph(s, b.FromInt32(scr.ids, s.dims(s.n)...), want)
	if err != nil || !wantLogits {
		return nil, err
	}
	return m.readLogits(s, out, want)
}

// stepGraph builds the step's graph from ids [n] (I32: the step's tokens,
// host-made or a device array such as the previous step's sampled tokens)
// and returns the logits array [rows, V] unevaluated, leaving in
// m.scr.evalArgs what must be evaluated with it (the logits first). With
// want noRows it evaluates the caches' arrays itself and returns nil.
func (m *Model) stepGraph(s *step, ids Array, want logitRows) (Array, error) {
	wantLogits := want != noRows
	b, scr, cs := m.b, &m.scr, s.cs
	x := b.Embedding(m.embed.table, ids) // [n, D]
	if m.embed.scale != nil {
		x = b.Mul(x, m.embed.scale)
	}
	// Without logits nothing reads the last block's output, only what it
	// puts in the cache: it only fills the cache, and the step evaluates
	// those arrays (and the recurrent states), as mlx-lm's prefill
	// evaluates only the cache.
	for i, blk := range m.blocks {
		s.tail = !wantLogits && i == len(m.blocks)-1
		y, err := blk.forward(s, i, x)
		if err != nil {
			return nil, err
		}
		if !s.tail {
			x = y
		}
	}
	if !wantLogits {
		one := &scr.evalArg
		if len(s.eval) > 0 {
			return nil, b.Eval(s.eval...)
		}
		one[0] = x
		return nil, b.Eval(one[:]...)
	}
	last := x // one row per sequence when every chunk is one token
	if s.n != len(cs) && want != everyRow {
		for i := range cs {
			end := s.starts[i] + s.lens[i]
			s.outs[i] = b.Slice(x, 0, end-1, end) // [1, D]
		}
		last = s.join(s.outs)
	}
	out := b.Linear(b.RMSNorm(last, m.head.norm, m.eps), m.head.out) // [B, V]
	scr.evalArgs = append(append(scr.evalArgs[:0], out), s.eval...)
	return out, nil
}

// readLogits evaluates the step's logits out (with m.scr.evalArgs) and
// reads them into the scratch's rows.
func (m *Model) readLogits(s *step, out Array, want logitRows) ([][]float32, error) {
	b, scr, cs := m.b, &m.scr, s.cs
	if err := b.Eval(scr.evalArgs...); err != nil {
		return nil, err
	}
	var f []float32
	var err error
	if r, ok := b.(float32IntoReader); ok {
		f, err = r.Float32Into(scr.flat[:0], out)
	} else {
		var g []float32
		if g, err = b.Float32(out); err == nil {
			f = append(scr.flat[:0], g...)
		}
	}
	scr.flat = nil
	if err != nil {
		return nil, err
	}
	nrows := len(cs)
	if want == everyRow {
		nrows = s.n
	}
	V := len(f) / nrows
	logits := grow(&scr.logits, nrows)
	for i := range logits {
		logits[i] = f[i*V : (i+1)*V : (i+1)*V]
	}
	return logits, nil
}

// logitRows is which positions' logits a step returns.
type logitRows uint8

const (
	noRows   logitRows = iota // none: the step only fills the caches
	lastRows                  // each sequence's last position
	everyRow                  // every position of every sequence, in order (verification)
)

// beginStep sets up the scratch's step for toks[i] continuing cs[i] (the
// caller defers m.scr.endStep).
func (m *Model) beginStep(cs []KVCache, toks [][]int32) *step {
	scr := &m.scr
	s := &scr.st
	*s = step{m: m, b: m.b, cs: grow(&scr.cs, len(cs)), lens: grow(&scr.lens, len(cs)), batched: len(cs) > 1, eval: s.eval[:0],
		starts: grow(&scr.rowStarts, len(cs)), offsets: grow(&scr.offsets, len(cs)), outs: grow(&scr.outs, len(cs))}
	copy(s.cs, cs)
	all := scr.ids[:0]
	for i, t := range toks {
		s.starts[i], s.offsets[i], s.lens[i] = s.n, cs[i].Len(), len(t)
		s.n += len(t)
		all = append(all, t...)
	}
	scr.ids = all
	s.decode = s.batched && s.n == len(cs)
	return s
}

// perm102 swaps the first two of three axes ([L, H, Dh] ↔ [H, L, Dh]).
// Read-only.
var perm102 = []int{1, 0, 2}

// float32IntoReader is implemented by backends that can copy an array's
// float32 values into a caller's buffer (the cpu backend), sparing the
// copy Float32 returns.
type float32IntoReader interface {
	Float32Into(dst []float32, a Array) ([]float32, error)
}

// stepScratch is what a step needs on the host besides arrays, kept on
// the Model (steps are serialized by its mutex) and reused, so that a
// decode step allocates nothing once warm.
type stepScratch struct {
	st        step
	starts    []int     // ForwardBatchInto: each cache's length before the step
	toks      [][]int32 // ForwardBatchInto: each sequence's token
	rowStarts []int     // stepSeqs: each sequence's first row
	cs        []KVCache // stepSeqs: the step's caches
	lens      []int     // stepSeqs: each sequence's rows
	offsets   []int     // stepSeqs: each sequence's position
	ids       []int32
	outs      []Array
	logits    [][]float32
	flat      []float32 // the caller's logits buffer for this step
	evalArg   [1]Array
	oneCache  [1]KVCache
	pairs     []int32  // MoE: each (token, expert) pair's token
	dimBuf    [4]int   // dims: a shape handed to a variadic op
	arrBuf    [4]Array // arrays: arrays handed to a variadic op
	evalArgs  []Array  // what a step with extra arrays evaluates
}

// endStep drops the arrays and caller slices a step left in the scratch.
func (s *stepScratch) endStep() {
	clear(s.st.outs)
	clear(s.st.eval)
	s.st.eval = s.st.eval[:0]
	clear(s.st.cs)
	clear(s.evalArgs[:cap(s.evalArgs)])
	s.evalArg[0] = nil
}

// dims returns ds in the scratch's own storage: a shape passed to a
// Backend's variadic op (an interface call) is otherwise heap-allocated
// at every call. Backends copy shapes they keep, so one buffer serves
// every call of a step.
func (s *stepScratch) dims(ds ...int) []int {
	if len(ds) > len(s.dimBuf) {
		return slices.Clone(ds)
	}
	n := copy(s.dimBuf[:], ds)
	return s.dimBuf[:n]
}

// arrays is dims for the arrays of a variadic op (Concat).
func (s *stepScratch) arrays(xs ...Array) []Array {
	if len(xs) > len(s.arrBuf) {
		return slices.Clone(xs)
	}
	n := copy(s.arrBuf[:], xs)
	return s.arrBuf[:n]
}

// grow returns (*s)[:n], reallocating *s when its capacity is less.
func grow[T any](s *[]T, n int) []T {
	if cap(*s) < n {
		*s = make([]T, n)
	}
	*s = (*s)[:n]
	return *s
}
