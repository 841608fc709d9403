package decode

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvconv"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// A tensor-parallel prefill group (runners/tensor, `exo runner prefill
// --tensor I/N`) serves each rank's KV heads from that rank's KV port. A
// decode runner names the ranks as ADDR#H0:H1 entries of --prefill (the
// rank holding KV heads [H0, H1); ADDR#I/N: rank I of N, whose heads are
// the I-th N-th of the model's, the supervisor's form); each decode cache (a whole model's, or
// a tensor-parallel decode rank's share, KVHeadRange) asks every prefill
// rank holding some of its heads for those, at once: one rank when the
// cache's heads lie inside one rank's (a decode group of N_d ranks over a
// prefill group of N_p ranks that divides N_d), else one piece per rank,
// whose chunks are assembled head by head into the cache (headFill). All
// pieces commit together or the cache goes back to start.

// parseHeads parses "H0:H1" (0 ≤ H0 < H1).
func parseHeads(s string) (a, b int, err error) {
	a, b, ok := cutInts(s, ":")
	if !ok || a < 0 || b <= a {
		return 0, 0, fmt.Errorf("kv heads %q: want H0:H1 with 0 ≤ H0 < H1", s)
	}
	return a, b, nil
}

// parseRank parses "I/N" (0 ≤ I < N).
func parseRank(s string) (i, n int, err error) {
	i, n, ok := cutInts(s, "/")
	if !ok || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("tensor rank %q: want I/N with 0 ≤ I < N", s)
	}
	return i, n, nil
}

// cutInts parses "A<sep>B" as two integers.
func cutInts(s, sep string) (a, b int, ok bool) {
	x, y, ok := strings.Cut(s, sep)
	if !ok {
		return 0, 0, false
	}
	a, err1 := strconv.Atoi(x)
	b, err2 := strconv.Atoi(y)
	return a, b, err1 == nil && err2 == nil
}

// headParts resolves ADDR#I/N parts into KV heads of a model with
// kvHeads heads (rank I of N holds [I·H/N, (I+1)·H/N)); parts of heads
// are returned as they are.
func headParts(parts []PrefillPart, kvHeads int) ([]PrefillPart, error) {
	out := make([]PrefillPart, len(parts))
	for i, p := range parts {
		out[i] = p
		if p.Ranks == 0 {
			continue
		}
		if kvHeads%p.Ranks != 0 {
			return nil, fmt.Errorf("%w: a tensor-parallel prefill group of %d ranks cannot split this model's %d KV heads", kvwire.ErrMismatch, p.Ranks, kvHeads)
		}
		per := kvHeads / p.Ranks
		out[i].Start, out[i].End, out[i].Ranks = p.Start*per, (p.Start+1)*per, 0
	}
	return out, nil
}

// modelHeads is the KV heads [a, b) of the whole model's that m's caches
// hold: a tensor-parallel rank's share, else every head.
func modelHeads(m interface{ Info() engine.ModelInfo }) (a, b int) {
	if hr, ok := m.(interface{ KVHeadRange() (int, int) }); ok {
		return hr.KVHeadRange()
	}
	return 0, m.Info().KVHeads
}

// headFill fills cache from the ranks of a tensor-parallel prefill group
// (r.Parts with Heads): one head-range request per rank holding some of
// the cache's heads, at once, each piece assembled into the cache; all
// committed together, or cache goes back to start when any fails.
func (r *KVRemote) headFill(ctx context.Context, reqID string, prompt []int32, start int, cache engine.KVCache) (RemoteStats, error) {
	x, y := modelHeads(r.Model)
	parts, err := headParts(r.Parts, r.Model.Info().KVHeads)
	if err != nil {
		return RemoteStats{}, err
	}
	var jobs []PrefillPart
	for _, p := range parts {
		if a, b := max(p.Start, x), min(p.End, y); a < b {
			jobs = append(jobs, PrefillPart{Start: a, End: b, Endpoints: p.Endpoints, Heads: true})
		}
	}
	covered := x
	for _, p := range jobs {
		if p.Start != covered {
			return RemoteStats{}, fmt.Errorf("%w: no prefill rank holds kv head %d", kvwire.ErrNoEndpoint, covered)
		}
		covered = p.End
	}
	if covered != y {
		return RemoteStats{}, fmt.Errorf("%w: no prefill rank holds kv head %d", kvwire.ErrNoEndpoint, covered)
	}
	if info := r.Model.Info(); info.Recurrent != nil {
		return RemoteStats{}, fmt.Errorf("%w: kv heads of a model with recurrent layers (a tensor-parallel prefill cannot serve it)", kvwire.ErrMismatch)
	}
	pieces := make([][2]int, len(jobs))
	for i, p := range jobs {
		pieces[i] = [2]int{p.Start - x, p.End - p.Start}
	}
	asm := newAssembler(cache, start, pieces)
	fetches := make([]partFetch, len(jobs))
	for i, p := range jobs {
		req, exp := wireRequest(r.Model, reqID, r.Name, prompt, start)
		req.HeadStart, req.HeadEnd, exp.KVHeads = p.Start, p.End, p.End-p.Start
		req.DType, req.Deadline, req.Streams = r.wireDType(cache), fetchDeadline(r.Deadline), r.Streams
		fetches[i] = partFetch{req: req, exp: exp, endpoints: p.Endpoints, what: fmt.Sprintf("prefill rank of kv heads %d:%d", p.Start, p.End),
			sink: &pieceSink{asm: asm, piece: i, heads: p.End - p.Start}}
	}
	total, end, err := r.fetchParts(ctx, fetches, "prefill ranks")
	if err == nil {
		err = asm.complete(end)
	}
	return total, commitParts(cache, prompt, start, end, err)
}

// pieceSink is one prefill rank's stream of a head-split fill: its
// chunks, widened or converted into the cache dtype, go to the assembler
// as its piece (heads [h0, h0+heads) of the cache's).
type pieceSink struct {
	asm          *assembler
	piece, heads int
	conv         cacheSink // dtype conversion only (its cache is the assembler's)
	begun        bool
	end          int
}

func (s *pieceSink) Begin(h *kvwire.Header) error {
	s.conv = cacheSink{cache: s.asm.cache, start: s.asm.start}
	if err := s.conv.begin(h, 0, s.heads, true); err != nil {
		return err
	}
	s.begun = true
	return nil
}

func (s *pieceSink) Chunk(layer, tokenStart, tokenCount int, k, v []byte) error {
	var err error
	if s.conv.fp8 {
		if k, err = s.conv.widen(k, tokenCount); err != nil {
			return err
		}
		if v, err = s.conv.widen(v, tokenCount); err != nil {
			return err
		}
	}
	if dt := s.asm.cache.DType(); s.conv.wire != dt {
		if k, err = kvconv.Convert(k, s.conv.wire, dt); err != nil {
			return err
		}
		if v, err = kvconv.Convert(v, s.conv.wire, dt); err != nil {
			return err
		}
	}
	return s.asm.add(s.piece, layer, tokenStart, tokenCount, k, v)
}

func (s *pieceSink) State(layer, _ int, _ [][]byte) error {
	return fmt.Errorf("%w: recurrent state for layer %d in a head-split fill", kvwire.ErrMismatch, layer)
}

func (s *pieceSink) Done(t kvwire.Totals) error {
	s.end = t.TokenEnd
	return nil
}

func (s *pieceSink) began() bool { return s.begun }
func (s *pieceSink) ended() int  { return s.end }

// Rollback leaves the imported KV to headFill, which truncates the whole
// cache once every piece's stream has ended.
func (s *pieceSink) Rollback() {}

// assembler merges head pieces into a cache: per layer, each piece's
// chunks of the positions not imported yet; positions every piece has
// arrived for are imported at once (Import takes every head of the cache),
// copied once into a scratch buffer that Import copies from. A single
// piece is imported as it arrives.
type assembler struct {
	cache  engine.KVCache
	start  int
	heads  int      // the cache's KV heads
	row    int      // bytes of one head's row (head_dim × the cache dtype)
	pieces [][2]int // each piece's first head (of the cache's) and head count, in head order
	mu     sync.Mutex
	layers []asmLayer
	kb, vb []byte   // scratch of the import being assembled
	free   [][]byte // buffers of imported chunks, for the next ones
}

type asmLayer struct {
	base   int // the first position not imported
	seen   bool
	have   []int        // per piece: positions received end here
	chunks [][]asmChunk // per piece: chunks holding positions ≥ base
}

// asmChunk is a piece's chunk: K and V [heads, count, head_dim] of
// positions [start, start+count).
type asmChunk struct {
	start, count int
	k, v         []byte
	owned        bool // k and v are the assembler's (else the caller's, during add)
}

// own copies b into a buffer of the assembler's, a recycled one when one
// is large enough.
func (a *assembler) own(b []byte) []byte {
	for i := len(a.free) - 1; i >= 0; i-- {
		if f := a.free[i]; cap(f) >= len(b) {
			a.free = append(a.free[:i], a.free[i+1:]...)
			return append(f[:0], b...)
		}
	}
	return append([]byte(nil), b...)
}

func newAssembler(cache engine.KVCache, start int, pieces [][2]int) *assembler {
	g := cache.Geometry()
	heads := 0
	for _, p := range pieces {
		heads += p[1]
	}
	a := &assembler{cache: cache, start: start, heads: heads, row: g.HeadDim * cache.DType().Size(), pieces: pieces, layers: make([]asmLayer, g.Layers)}
	for i := range a.layers {
		a.layers[i] = asmLayer{have: make([]int, len(pieces)), chunks: make([][]asmChunk, len(pieces))}
	}
	return a
}

// add takes piece pi's chunk of layer (k, v: [n, count, head_dim] in the
// cache dtype) and imports what every piece now has.
func (a *assembler) add(pi, layer, start, count int, k, v []byte) error {
	n := a.pieces[pi][1]
	if layer < 0 || layer >= len(a.layers) || count <= 0 || len(k) != n*count*a.row || len(v) != len(k) {
		return fmt.Errorf("%w: chunk of layer %d [%d,+%d) with %d bytes for %d heads", kvwire.ErrCorrupt, layer, start, count, len(k), n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l := &a.layers[layer]
	if !l.seen {
		// Every piece's first chunk of a layer starts where the layer's
		// stream does (the same header); the first one seen sets it.
		l.seen, l.base = true, start
		for i := range l.have {
			l.have[i] = start
		}
	}
	if start != l.have[pi] {
		return fmt.Errorf("%w: layer %d, kv heads from %d: chunk at %d, want %d", kvwire.ErrCorrupt, layer, a.pieces[pi][0], start, l.have[pi])
	}
	l.have[pi] += count
	if len(a.pieces) == 1 {
		if err := a.cache.Import(layer, start, count, k, v); err != nil {
			return fmt.Errorf("inject layer %d [%d,+%d): %w", layer, start, count, err)
		}
		l.base += count
		return nil
	}
	l.chunks[pi] = append(l.chunks[pi], asmChunk{start: start, count: count, k: k, v: v})
	if err := a.merge(l, layer); err != nil {
		return err
	}
	// The client may reuse k and v once Chunk returns: what is left of
	// this chunk is copied.
	if cs := l.chunks[pi]; len(cs) > 0 && !cs[len(cs)-1].owned {
		c := &cs[len(cs)-1]
		c.k, c.v, c.owned = a.own(c.k), a.own(c.v), true
	}
	return nil
}

// merge imports the positions of layer l that every piece has.
func (a *assembler) merge(l *asmLayer, layer int) error {
	end := l.have[0]
	for _, e := range l.have {
		end = min(end, e)
	}
	if end <= l.base {
		return nil
	}
	cnt := end - l.base
	size := a.heads * cnt * a.row
	if cap(a.kb) < size {
		a.kb, a.vb = make([]byte, size), make([]byte, size)
	}
	kb, vb := a.kb[:size], a.vb[:size]
	for i, p := range a.pieces {
		h0, ph := p[0], p[1]
		cs := l.chunks[i]
		used := 0
		for _, c := range cs {
			from, to := max(l.base, c.start), min(end, c.start+c.count)
			if from < to {
				rows := (to - from) * a.row
				for j := range ph {
					src := (j*c.count + from - c.start) * a.row
					dst := ((h0+j)*cnt + from - l.base) * a.row
					copy(kb[dst:dst+rows], c.k[src:src+rows])
					copy(vb[dst:dst+rows], c.v[src:src+rows])
				}
			}
			if c.start+c.count <= end {
				used++
				if c.owned && len(a.free) < 64 {
					a.free = append(a.free, c.k, c.v)
				}
			}
		}
		l.chunks[i] = cs[used:]
	}
	if err := a.cache.Import(layer, l.base, cnt, kb, vb); err != nil {
		return fmt.Errorf("inject layer %d [%d,+%d): %w", layer, l.base, cnt, err)
	}
	l.base = end
	return nil
}

// complete checks that every layer that got chunks has every head's up to
// end.
func (a *assembler) complete(end int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, l := range a.layers {
		if l.seen && l.base != end {
			return fmt.Errorf("%w: layer %d assembled up to %d of %d (a piece fell short)", kvwire.ErrCorrupt, i, l.base, end)
		}
	}
	return nil
}
