package tensor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// A tensor-parallel prefill group (`exo runner prefill --tensor I/N`):
// every rank holds its share of the model (the same engine split as a
// decode group) and a prefill.Producer with its own KV port and prefix
// cache over that share, whose caches hold the rank's KV heads. A
// computation is always the whole group's, driven by rank 0 over the
// tensor link: rank 0's Producer computes through Compute (a Begin call,
// then one Chunk call per chunk, then an End call), and each follower's
// Producer Drives the same computation from the calls (begin, driveChunks) — so
// every rank computes its heads' KV of every chunk together, and each
// rank's KV port serves the heads it computed: a decode rank's request for
// a head range goes to the prefill rank(s) holding those heads, never
// through rank 0. A request on a follower that finds neither a running
// computation nor its prompt in the prefix cache sends rank 0 a Want
// (frameWant) and follows the computation rank 0 starts for it.
//
// The ranks' prefix caches are kept alike by construction: each caches
// what the group computed, taking the same prefix. A Begin names the
// positions rank 0 takes from its own (from); a follower whose cache holds
// fewer (it was restarted, or evicted differently) refuses, and rank 0
// computes the prompt from position 0 on every rank instead — the first
// computation after a rank rejoins costs the prompt's prefix again, once.

// PrefillLead makes p (rank 0's Producer over its share m) the group's
// driver: its computations run on every rank (p's StageHook), and the
// followers' Wants compute in ctx. Call it before p serves.
func (g *Leader) PrefillLead(ctx context.Context, p *prefill.Producer, m *engine.Model, log *slog.Logger) error {
	if err := checkPrefillModel(m); err != nil {
		return err
	}
	if log == nil {
		log = slog.Default()
	}
	h := &leadHook{g: g, p: p, m: m, ctx: ctx, log: log}
	p.SetStage(h)
	g.mu.Lock()
	g.want = h.wanted
	g.mu.Unlock()
	return nil
}

// checkPrefillModel refuses a share a prefill rank cannot serve: a model
// with recurrent layers (Gated DeltaNet) splits its state by key heads,
// which no KV head range can name.
func checkPrefillModel(m *engine.Model) error {
	if m.Info().Recurrent != nil {
		return errors.New("tensor: a tensor-parallel prefill cannot serve a model with recurrent layers (their state splits by key heads, which a KV head range cannot name): run its prefill as one process")
	}
	return nil
}

// leadHook is rank 0's prefill.StageHook.
type leadHook struct {
	g   *Leader
	p   *prefill.Producer
	m   *engine.Model
	ctx context.Context
	log *slog.Logger

	mu     sync.Mutex
	recent []begun // the last keepBegun computations every follower began
}

// begun is a computation every follower began (and so opened): its id,
// prompt and first position.
type begun struct {
	id     uint64
	tokens []int32
	from   int
}

// keepBegun is how many begun computations rank 0 remembers for the
// Wants that arrive after the computation they meet ended.
const keepBegun = 256

func (h *leadHook) Later() bool   { return false }
func (h *leadHook) Up() bool      { return h.g.Health() == nil }
func (h *leadHook) Stage() string { return fmt.Sprintf("tensor prefill rank 0/%d", h.g.size) }

// Want is a later stage's: rank 0 never waits for another rank.
func (h *leadHook) Want([]int32, int) error { return nil }

// wanted is rank 0's answer to a follower's Want: compute tokens from at
// most from (the follower's cached prefix), unless a computation of them
// from there is running, or one the follower had not opened when its
// request registered (an id above seen) began on every rank — the
// request follows that one, however soon it ended, and a Want read after
// it ended is stale.
func (h *leadHook) wanted(rank int, tokens []int32, from int, seen uint64) {
	if len(tokens) < 2 || from >= len(tokens) || outsideVocab(tokens, h.m.Info().Vocab) {
		h.log.Warn("tensor prefill: a rank's Want names tokens outside the model", "rank", rank, "tokens", len(tokens), "from", from)
		return
	}
	passed := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return slices.ContainsFunc(h.recent, func(b begun) bool {
			return b.id > seen && b.from <= from && slices.Equal(b.tokens, tokens)
		})
	}
	// Following a running computation or opening one is one step on the
	// Producer: a request for the prompt on rank 0 that arrives meanwhile
	// follows this one, or this Want is answered by the request's.
	computed, err := h.p.DriveUnless(h.ctx, tokens, from, h.Compute, passed)
	if err != nil {
		h.log.Warn("tensor prefill: a computation rank asked for failed", "rank", rank, "tokens", len(tokens), "err", err)
	}
	if !computed {
		h.log.Debug("tensor prefill: a rank's Want is answered by a computation running or begun since", "rank", rank, "tokens", len(tokens), "from", from)
	}
}

func outsideVocab(tokens []int32, vocab int) bool {
	for _, t := range tokens {
		if t < 0 || int(t) >= vocab {
			return true
		}
	}
	return false
}

// begin starts a computation of prompt from from on every follower and
// returns its id. Ids are taken in the order the Begins go out, so a
// follower opens them in increasing order (its Wants' seen).
func (h *leadHook) begin(ctx context.Context, prompt []int32, from int) (uint64, error) {
	h.g.callMu.Lock()
	defer h.g.callMu.Unlock()
	id := h.g.nextID.Add(1)
	err := h.g.call(ctx, &call{op: opBegin, ids: []uint64{id}, n: from, tokens: prompt}, true, func(context.Context) error { return nil })
	if err == nil {
		// Before the computation can end (rank 0's job closes after
		// Compute returns): a Want that finds it closed finds it here.
		h.mu.Lock()
		h.recent = append(h.recent, begun{id: id, tokens: prompt, from: from})
		if len(h.recent) > keepBegun {
			h.recent = slices.Delete(h.recent, 0, len(h.recent)-keepBegun)
		}
		h.mu.Unlock()
	}
	return id, err
}

// end ends computation id on every follower (abort: it failed). A broken
// group's followers ended theirs when their links dropped.
func (h *leadHook) end(id uint64, abort bool) {
	n := 0
	if abort {
		n = 1
	}
	h.g.callMu.Lock()
	defer h.g.callMu.Unlock()
	_ = h.g.call(context.Background(), &call{op: opEnd, ids: []uint64{id}, n: n}, true, func(context.Context) error { return nil })
}

// Compute implements prefill.StageHook: positions [from, end) of prompt
// into c (rank 0's share, holding from) on every rank, chunk by chunk,
// onChunk after each.
func (h *leadHook) Compute(ctx context.Context, c engine.KVCache, prompt []int32, from, end int, onChunk func(start, n int) error) (err error) {
	prompt = prompt[:end+1]
	first := from // where the computation starts on every rank
	id, err := h.begin(ctx, prompt, from)
	if err != nil {
		h.end(id, true)
		if !errors.Is(err, ErrRank) || ctx.Err() != nil {
			return err
		}
		// A follower's prefix cache lacks rank 0's prefix: every rank
		// computes the prompt from position 0.
		h.log.Info("tensor prefill: a rank's prefix cache differs from rank 0's: computing the prompt from position 0 on every rank", "from", from, "err", err)
		c.Truncate(0)
		first = 0
		if id, err = h.begin(ctx, prompt, 0); err != nil {
			h.end(id, true)
			return err
		}
	}
	defer func() { h.end(id, err != nil) }()
	chunk := h.p.Chunk()
	// [first, from) again without shipping (a rank lacked it), then
	// [from, end), each chunk shipped as it is computed.
	for _, seg := range [][2]int{{first, from}, {from, end}} {
		for s := seg[0]; s < seg[1]; s += chunk {
			n := min(chunk, seg[1]-s)
			part := prompt[s : s+n]
			h.g.callMu.Lock()
			err := h.g.call(ctx, &call{op: opChunk, ids: []uint64{id}, tokens: part}, false, func(ctx context.Context) error {
				return h.m.Prefill(ctx, c, part, n, nil)
			})
			h.g.callMu.Unlock()
			if err != nil {
				return err
			}
			if seg[0] == from {
				if err := onChunk(s, n); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// PrefillFollow makes p (this follower's Producer over its share m) a
// rank of a tensor prefill group: it computes what rank 0's Begin, Chunk
// and End calls say, and its requests that find no computation ask rank 0
// for one (p's StageHook). Call it before Run.
func (f *Follower) PrefillFollow(p *prefill.Producer, m *engine.Model) error {
	if err := checkPrefillModel(m); err != nil {
		return err
	}
	f.pre = p
	p.SetStage(followHook{f})
	return nil
}

// followHook is a follower's prefill.StageHook.
type followHook struct{ f *Follower }

func (h followHook) Later() bool { return true }
func (h followHook) Up() bool    { return h.f.Health() == nil }
func (h followHook) Stage() string {
	return fmt.Sprintf("tensor prefill rank %d/%d", h.f.rank, h.f.size)
}

func (h followHook) Compute(context.Context, engine.KVCache, []int32, int, int, func(int, int) error) error {
	return fmt.Errorf("tensor prefill rank %d computes only what rank 0 drives", h.f.rank)
}

// Want sends rank 0 a Want for tokens from at most from that names no
// computation as seen (rank 0 computes unless one is running). The
// Producer calls WantMarked instead.
func (h followHook) Want(tokens []int32, from int) error {
	return h.WantMarked(tokens, from, math.MaxUint64)
}

// WantMarked implements prefill.MarkedWanter: it sends rank 0 a Want for
// tokens from at most from, naming seen, the highest computation id this
// rank had opened when the asking request registered.
func (h followHook) WantMarked(tokens []int32, from int, seen uint64) error {
	h.f.mu.Lock()
	l := h.f.live
	h.f.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w: rank %d is not linked to rank 0", ErrGroup, h.f.rank)
	}
	return l.write(frameWant, encodeWant(tokens, from, seen))
}

// want = seen u64 | from u32 | n u32 | tokens i32[n]
func encodeWant(tokens []int32, from int, seen uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, seen)
	b = binary.LittleEndian.AppendUint32(b, uint32(from))
	return appendTokens(b, tokens)
}

func decodeWant(b []byte) (tokens []int32, from int, seen uint64, err error) {
	r := &reader{b: b}
	seen = r.u64()
	from = int(r.u32())
	n := r.u32()
	if n < 2 || n > maxCallTokens || uint32(from) >= n {
		return nil, 0, 0, fmt.Errorf("%w: a Want of %d tokens from %d", ErrLink, n, from)
	}
	tokens = r.tokens(int(n))
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, 0, 0, fmt.Errorf("%w: a Want: %w", ErrLink, r.err)
	}
	return tokens, from, seen, nil
}

// drive is one computation rank 0 drives on a follower: a goroutine in
// the follower's Producer.Drive, fed each chunk by the call loop.
type drive struct {
	in       chan driveMsg
	ready    chan error    // the Begin's outcome (once)
	computed chan error    // each chunk's computation
	done     chan struct{} // closed when Drive returns; err set before
	abort    chan struct{} // closed when the link drops
	err      error
}

type driveMsg struct {
	tokens []int32 // a chunk; nil: the end
	abort  bool
}

var errAborted = errors.New("tensor prefill: rank 0 aborted the computation")

// begin runs a Begin call: Drive tokens from from, once the prefix cache
// is seen to hold exactly from positions.
func (f *Follower) begin(ctx context.Context, m *engine.Model, id uint64, tokens []int32, from int) error {
	if f.pre == nil {
		return fmt.Errorf("tensor: rank %d is not a prefill rank", f.rank)
	}
	if _, dup := f.drives[id]; dup {
		return fmt.Errorf("tensor: prefill computation %d began twice", id)
	}
	if have := f.pre.Cached(tokens, from); have != from {
		return fmt.Errorf("tensor prefill rank %d: its prefix cache holds %d of the %d positions rank 0 starts from", f.rank, have, from)
	}
	d := &drive{in: make(chan driveMsg), ready: make(chan error, 1), computed: make(chan error, 1),
		done: make(chan struct{}), abort: make(chan struct{})}
	f.drives[id] = d
	// Opened here, marked with its id, before the ack: a request that
	// registers as waiting for the prompt from now on follows it, and one
	// that registered before names a lower id in its Want.
	c := f.pre.OpenMarked(tokens, from, id)
	go func() {
		defer close(d.done)
		d.err = c.Run(ctx, func(ctx context.Context, c engine.KVCache, prompt []int32, got, end int, onChunk func(int, int) error) error {
			if got != from {
				err := fmt.Errorf("tensor prefill rank %d: its prefix cache gave %d of the %d positions rank 0 starts from", f.rank, got, from)
				d.ready <- err
				return err
			}
			d.ready <- nil
			return f.driveChunks(ctx, m, d, c, from, end, onChunk)
		})
	}()
	select {
	case err := <-d.ready:
		if err != nil {
			delete(f.drives, id)
		}
		return err
	case <-d.done:
		delete(f.drives, id)
		if d.err == nil {
			d.err = errors.New("the computation ended before it began")
		}
		return d.err
	}
}

// driveChunks computes the chunks the call loop hands it into c (holding
// from) until the End. Once begun, every chunk is computed whatever
// happens to this rank's requests (the ranks' all_sums pair up): a failure
// to ship is returned at the end.
func (f *Follower) driveChunks(ctx context.Context, m *engine.Model, d *drive, c engine.KVCache, from, end int, onChunk func(int, int) error) error {
	var shipErr error
	for {
		var msg driveMsg
		select {
		case msg = <-d.in:
		case <-d.abort:
			return fmt.Errorf("%w: rank %d's link to rank 0 dropped mid-computation", ErrGroup, f.rank)
		}
		if msg.tokens == nil {
			if msg.abort {
				return errAborted
			}
			if c.Len() != end {
				return fmt.Errorf("tensor prefill rank %d: the computation ended at %d of %d", f.rank, c.Len(), end)
			}
			return shipErr
		}
		s, n := c.Len(), len(msg.tokens)
		err := m.Prefill(ctx, c, msg.tokens, n, nil)
		d.computed <- err
		if err != nil {
			return err
		}
		if shipErr == nil && s+n > from {
			shipErr = onChunk(max(s, from), s+n-max(s, from))
		}
	}
}

// chunk runs a Chunk call: the drive computes it (on its goroutine; the
// call's all_sums pair with rank 0's there).
func (f *Follower) chunk(id uint64, tokens []int32) error {
	d := f.drives[id]
	if d == nil {
		return fmt.Errorf("tensor: a chunk of prefill computation %d, which is not running here", id)
	}
	select {
	case d.in <- driveMsg{tokens: tokens}:
	case <-d.done:
		delete(f.drives, id)
		return fmt.Errorf("tensor prefill rank %d: the computation ended: %w", f.rank, d.err)
	}
	return <-d.computed
}

// endDrive runs an End call; it does not wait for the Producer to finish
// shipping.
func (f *Follower) endDrive(id uint64, abort bool) error {
	d := f.drives[id]
	if d == nil {
		return nil
	}
	delete(f.drives, id)
	select {
	case d.in <- driveMsg{abort: abort}:
	case <-d.done:
	}
	return nil
}

// dropDrives aborts every computation (the link dropped).
func (f *Follower) dropDrives() {
	for id, d := range f.drives {
		close(d.abort)
		delete(f.drives, id)
	}
}
