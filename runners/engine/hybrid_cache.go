package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// hybridCache is the cache of a model whose layers are of two kinds: the
// full-attention layers keep K and V in a backend KVCache (over those
// layers only), the Gated DeltaNet layers a conv state and a recurrent
// state (deltaState), replaced by each step.
//
// A recurrent state cannot be cut back to an earlier position, so the
// cache keeps the states of a few positions: where the current step began
// (mark, what a failed Forward or Prefill chunk rolls back to), where each
// multi-token step began and ended (prefill chunk boundaries; the end of a
// prompt's prefill, where the next turn of a chat, sharing that prompt,
// resumes) and where remote KV was committed, the last maxSnapshots of
// those. Truncate(n) goes back to
// the latest kept position ≤ n (0 if none), so Len() may end below n:
// callers that reuse a prefix read Len() after Truncate. Recurrent layers
// cross the KV wire as states (RecurrentState): Export and Import of their
// K/V fail.
//
// Its states are backend arrays, and making or freeing one uses the
// backend as a step does (the cpu backend's arena), so every method that
// may do so and is called from outside a step (NewCache, Truncate, Free,
// Commit, ImportState, ExportState) holds the model's lock; a step, which
// holds it already, truncates through truncate.
type hybridCache struct {
	m      *Model
	attn   KVCache      // the full-attention layers, in order
	index  []int        // model layer → attention layer; −1 for a recurrent layer
	states []deltaState // per model layer (zero for attention layers)
	mark   struct {
		n      int
		states []deltaState // nil: no mark
	}
	pending map[int]deltaState // imported states, applied by Commit
	snaps   []snapshot         // kept positions, oldest first
	// last is the token count of the step begun last (0 after a
	// Truncate): the next step's begin keeps a multi-token step's end.
	last int
	// args holds the arrays handed to the backend's variadic Keep and
	// Free (the cache's own: its methods are not called concurrently), so
	// a decode step allocates no argument slices.
	args [2]Array
}

// snapshot is every layer's state after n positions.
type snapshot struct {
	n      int
	states []deltaState
}

// maxSnapshots bounds the positions a hybrid cache keeps (each holds every
// recurrent layer's state).
const maxSnapshots = 4

var errRecurrentLayer = errors.New("engine: the state of a recurrent (Gated DeltaNet) layer cannot be exported or imported yet")

// newHybridCache makes a cache of m; the caller holds m.mu.
func (m *Model) newHybridCache() *hybridCache {
	c := &hybridCache{m: m, index: make([]int, len(m.kinds)), states: make([]deltaState, len(m.kinds))}
	n := 0
	for i := range c.index {
		c.index[i] = -1
		if !m.kinds[i].Recurrent {
			c.index[i] = n
			n++
		}
	}
	g := CacheGeometry{Layers: n, KVHeads: m.rc.KVHeads, HeadDim: m.cfg.HeadDim}
	if n == 0 {
		c.attn = &positions{g: g, dt: m.cacheDT} // a pipeline stage of recurrent layers only
	} else {
		c.attn = m.b.NewKVCache(g, m.cacheDT)
	}
	c.reset()
	return c
}

// positions is the attention part of a hybrid cache whose layers are all
// recurrent (a pipeline stage): it only counts the positions.
type positions struct {
	n  int
	g  CacheGeometry
	dt DType
}

func (p *positions) Len() int { return p.n }
func (p *positions) Append(layer int, k, v Array) (Array, Array) {
	panic(fmt.Sprintf("engine: Append to layer %d of a cache without attention layers", layer))
}
func (p *positions) Truncate(n int)          { p.n = min(p.n, max(n, 0)) }
func (p *positions) CanTruncate(n int) bool  { return n >= 0 && n <= p.n }
func (p *positions) Commit(n int) error      { p.n = n; return nil }
func (p *positions) DType() DType            { return p.dt }
func (p *positions) Geometry() CacheGeometry { return p.g }
func (p *positions) Free()                   {}
func (p *positions) Export(layer, start, n int) ([]byte, []byte, error) {
	return nil, nil, fmt.Errorf("engine: Export of layer %d of a cache without attention layers", layer)
}
func (p *positions) Import(layer, start, n int, k, v []byte) error {
	return fmt.Errorf("engine: Import of layer %d of a cache without attention layers", layer)
}

// reset sets every recurrent layer to the empty state.
func (c *hybridCache) reset() {
	for i, ix := range c.index {
		if ix < 0 {
			c.set(i, c.m.newDeltaState())
		}
	}
}

// set replaces layer i's state (kept on the backend); the old one is
// released unless the mark holds it.
func (c *hybridCache) set(i int, s deltaState) {
	b := c.m.b
	c.args = [2]Array{s.conv, s.rec}
	b.Keep(c.args[:]...)
	c.args = [2]Array{}
	old := c.states[i]
	c.states[i] = s
	c.release(old, i)
}

// release frees s (layer i's) unless the current state, the mark or a
// snapshot holds it.
func (c *hybridCache) release(s deltaState, i int) {
	if s.conv == nil {
		return
	}
	for _, a := range [2]Array{s.conv, s.rec} {
		if !c.holds(i, a) {
			c.args[0] = a
			c.m.b.Free(c.args[:1]...)
			c.args[0] = nil
		}
	}
}

// holds reports whether layer i's current state, the mark or a snapshot
// refers to a.
func (c *hybridCache) holds(i int, a Array) bool {
	if c.states[i].conv == a || c.states[i].rec == a {
		return true
	}
	if c.mark.states != nil && (c.mark.states[i].conv == a || c.mark.states[i].rec == a) {
		return true
	}
	for _, sn := range c.snaps {
		if sn.states[i].conv == a || sn.states[i].rec == a {
			return true
		}
	}
	return false
}

// begin marks the start of a step of tokens positions: Truncate(Len())
// from now on restores the states as they are; a multi-token step's start,
// and the end of the one before if it was one (a prompt's prefill ends
// where the single-token steps begin), are also kept as snapshots.
func (c *hybridCache) begin(tokens int) {
	old := c.mark.states
	c.mark.n, c.mark.states = c.Len(), append([]deltaState(nil), c.states...)
	for i, s := range old {
		c.release(s, i)
	}
	if tokens > 1 || c.last > 1 {
		c.snapshot()
	}
	c.last = tokens
	if p, ok := c.attn.(*positions); ok {
		p.n += tokens // no attention layer appends: the step's positions count here
	}
}

// snapshot keeps the current states at Len() (not at 0: the empty state
// needs no copy). Beyond maxSnapshots it drops the kept position closest
// to the one before it (the oldest among equals; never the newest), so
// what a later Truncate loses by going back to a kept position stays
// small: speculative decoding's verifications, a few positions apart,
// give way before the end of a prompt's prefill (a chunk or a whole
// prompt after the position before it), where a chat's next turn
// resumes; equal prefill chunks drop the oldest as before.
func (c *hybridCache) snapshot() {
	n := c.Len()
	if n == 0 {
		return
	}
	for _, sn := range c.snaps {
		if sn.n == n {
			return
		}
	}
	c.snaps = append(c.snaps, snapshot{n: n, states: append([]deltaState(nil), c.states...)})
	if len(c.snaps) > maxSnapshots {
		drop, gap := 0, c.snaps[0].n
		for i := 1; i < len(c.snaps)-1; i++ {
			if g := c.snaps[i].n - c.snaps[i-1].n; g < gap {
				drop, gap = i, g
			}
		}
		old := c.snaps[drop]
		c.snaps = append(c.snaps[:drop], c.snaps[drop+1:]...)
		for i, s := range old.states {
			c.release(s, i)
		}
	}
}

func (c *hybridCache) Len() int { return c.attn.Len() }

func (c *hybridCache) Append(layer int, k, v Array) (Array, Array) {
	return c.attn.Append(c.index[layer], k, v)
}

// CanTruncate: a hybrid cache can go back anywhere, but Truncate(n) ends at
// the latest kept position ≤ n (0 if none), so Len() may end below n.
func (c *hybridCache) CanTruncate(n int) bool { return n >= 0 && n <= c.Len() }

// Truncate takes the model's lock: it may make a fresh state or free old
// ones.
func (c *hybridCache) Truncate(n int) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.truncate(n)
}

// truncate is Truncate with the model's lock held (a failed step's).
func (c *hybridCache) truncate(n int) {
	c.dropPending()
	c.last = 0
	if n >= c.Len() {
		c.attn.Truncate(n) // drops imports beyond Len, if any
		return
	}
	// The latest kept position ≤ n: the mark or a snapshot.
	best, states := 0, []deltaState(nil)
	if c.mark.states != nil && c.mark.n <= n {
		best, states = c.mark.n, c.mark.states
	}
	for _, sn := range c.snaps {
		if sn.n <= n && sn.n > best {
			best, states = sn.n, sn.states
		}
	}
	// Snapshots past the new end describe positions that are gone.
	kept := c.snaps[:0]
	var dropped []snapshot
	for _, sn := range c.snaps {
		if sn.n <= best {
			kept = append(kept, sn)
		} else {
			dropped = append(dropped, sn)
		}
	}
	c.snaps = kept
	if states == nil {
		c.attn.Truncate(0)
		c.reset()
	} else {
		for i, s := range states {
			if c.index[i] < 0 {
				c.set(i, s)
			}
		}
		c.attn.Truncate(best)
	}
	for _, sn := range dropped {
		for i, s := range sn.states {
			c.release(s, i)
		}
	}
}

func (c *hybridCache) Export(layer, start, n int) ([]byte, []byte, error) {
	if layer < 0 || layer >= len(c.index) {
		return nil, nil, fmt.Errorf("engine: Export of layer %d of %d", layer, len(c.index))
	}
	if c.index[layer] < 0 {
		return nil, nil, fmt.Errorf("layer %d: %w", layer, errRecurrentLayer)
	}
	return c.attn.Export(c.index[layer], start, n)
}

func (c *hybridCache) Import(layer, start, n int, k, v []byte) error {
	if layer < 0 || layer >= len(c.index) {
		return fmt.Errorf("engine: Import of layer %d of %d", layer, len(c.index))
	}
	if c.index[layer] < 0 {
		return fmt.Errorf("layer %d: %w", layer, errRecurrentLayer)
	}
	return c.attn.Import(c.index[layer], start, n, k, v)
}

// Commit applies the imported attention KV and the staged states together.
func (c *hybridCache) Commit(n int) error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	recurrent := 0
	for _, ix := range c.index {
		if ix < 0 {
			recurrent++
		}
	}
	if n > c.Len() && len(c.pending) != recurrent {
		return fmt.Errorf("engine: commit to %d with states for %d of %d recurrent layers", n, len(c.pending), recurrent)
	}
	if err := c.attn.Commit(n); err != nil {
		return err
	}
	for i, s := range c.pending {
		c.set(i, s)
	}
	c.pending = nil
	c.snapshot() // where remote KV ended: a later turn can resume here
	return nil
}

func (c *hybridCache) Recurrent(layer int) bool {
	return layer >= 0 && layer < len(c.index) && c.index[layer] < 0
}

// stateSizes are the element counts of a recurrent layer's two arrays.
func (c *hybridCache) stateSizes() (conv, rec int) {
	g := &c.m.rc // this rank's heads
	C := 2*g.LinearKeyHeads*g.LinearKeyDim + g.LinearValueHeads*g.LinearValueDim
	return (g.LinearConvKernel - 1) * C, g.LinearValueHeads * g.LinearValueDim * g.LinearKeyDim
}

func (c *hybridCache) ExportState(layer int) (out [][]byte, err error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer recoverInto(&err, "export state")
	if !c.Recurrent(layer) {
		return nil, fmt.Errorf("engine: ExportState of layer %d, which is not recurrent", layer)
	}
	st := c.states[layer]
	for _, a := range []Array{st.conv, st.rec} {
		f, err := c.m.b.Float32(a)
		if err != nil {
			return nil, err
		}
		raw := make([]byte, 4*len(f))
		for i, v := range f {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		out = append(out, raw)
	}
	return out, nil
}

func (c *hybridCache) ImportState(layer int, arrays [][]byte) (err error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	defer recoverInto(&err, "import state")
	if !c.Recurrent(layer) {
		return fmt.Errorf("engine: ImportState of layer %d, which is not recurrent", layer)
	}
	nc, nr := c.stateSizes()
	if len(arrays) != 2 || len(arrays[0]) != 4*nc || len(arrays[1]) != 4*nr {
		sizes := make([]int, len(arrays))
		for i, a := range arrays {
			sizes[i] = len(a)
		}
		return fmt.Errorf("engine: layer %d state arrays of %v bytes, want [%d %d]", layer, sizes, 4*nc, 4*nr)
	}
	g := &c.m.rc // this rank's heads
	C := nc / (g.LinearConvKernel - 1)
	b := c.m.b
	st := deltaState{
		conv: b.AsType(b.FromBytes(arrays[0], []int{g.LinearConvKernel - 1, C}, F32), c.m.actDType()),
		rec:  b.FromBytes(arrays[1], []int{g.LinearValueHeads, g.LinearValueDim, g.LinearKeyDim}, F32),
	}
	b.Keep(st.conv, st.rec)
	if c.pending == nil {
		c.pending = map[int]deltaState{}
	}
	if old, ok := c.pending[layer]; ok {
		b.Free(old.conv, old.rec)
	}
	c.pending[layer] = st
	return nil
}

// dropPending frees staged states (a failed stream's).
func (c *hybridCache) dropPending() {
	for _, s := range c.pending {
		c.m.b.Free(s.conv, s.rec)
	}
	c.pending = nil
}
func (c *hybridCache) DType() DType { return c.attn.DType() }

// Geometry is the model's: every layer counts, so the engine's checks and
// the wire see the model's layer count.
func (c *hybridCache) Geometry() CacheGeometry {
	g := c.attn.Geometry()
	g.Layers = len(c.index)
	return g
}

func (c *hybridCache) Free() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.dropPending()
	c.attn.Free()
	for i, s := range c.states {
		if s.conv != nil {
			c.m.b.Free(s.conv, s.rec)
		}
		c.states[i] = deltaState{}
	}
	for _, s := range c.mark.states {
		if s.conv != nil {
			c.m.b.Free(s.conv, s.rec)
		}
	}
	c.mark.states = nil
	for _, sn := range c.snaps {
		for _, s := range sn.states {
			if s.conv != nil {
				c.m.b.Free(s.conv, s.rec)
			}
		}
	}
	c.snaps = nil
}
