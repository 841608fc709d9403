// Package prefill owns the prefill runner's KV producer: for each KV-wire
// request (runners/kvwire) it finds the longest cached prefix of the prompt
// in a memory-bounded LRU keyed by token-block hashes, ships the cached KV
// the decode side lacks, computes the rest with engine.Model.Prefill in
// chunks and emits each chunk's KV for every layer as soon as it is
// evaluated (the kvwire send queue puts chunk i on the wire while chunk i+1
// computes), converting to the wire dtype the decode side asked for. It
// ships positions [start_pos, N-1): the decode side computes the last
// prompt token itself. A request for a layer range (a pipeline stage's,
// PROTOCOL.md §19) is computed from the whole model and its prefix cache
// as any other, and only that range's layers are shipped; requests for the
// same prompt arriving while it computes (the group's other stages) follow
// that computation instead of repeating or queueing behind it (follow.go).
// It must not import supervisor/ or runners/decode.
package prefill

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvconv"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// Model is what the prefill runner needs of *engine.Model.
type Model interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
	NewCache() engine.KVCache
	Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error
}

// Options configures a Producer.
type Options struct {
	Name  string // served model name; requests for another name are a mismatch
	Model Model
	// Chunk is the prefill chunk in tokens (default 256).
	Chunk int
	// CacheBytes bounds the prefix cache (default 1 GiB; <0: no cache).
	CacheBytes int64
	// CacheBlock is the prefix-cache block in tokens (default 64).
	CacheBlock int
	Metrics    *metrics.Runner
	Logger     *slog.Logger
	// Stage is the layers Model holds: a prefill pipeline stage's
	// (engine.LoadOptions.Layers; its caches hold those layers only,
	// cache layer 0 being the model's layer Stage.Start). Zero: every
	// layer. Requests must ask for layers within it.
	Stage engine.LayerRange
}

// Producer implements kvwire.Producer over a model.
type Producer struct {
	o     Options
	info  engine.ModelInfo
	fp    kvwire.Fingerprint
	cache *prefixCache
	m     *metrics.Runner
	log   *slog.Logger

	stage engine.LayerRange // the layers the model (and every cache) holds
	// held is the KV heads [held[0], held[1]) of the model's that every
	// cache holds: a tensor-parallel rank's share (KVHeadRange), else all.
	held [2]int
	pipe StageHook // the prefill pipeline this stage is part of (stagehook.go), or nil

	mu      sync.Mutex
	jobs    []*job                        // prompts being computed that others may follow (follow.go)
	waiters []*waiter                     // requests on a later stage waiting for a computation (await)
	claims  map[*kvwire.Request]*follower // registered by Follow, claimed by Produce
	changed chan struct{}                 // closed (and replaced) when a job opens or ends
	mark    uint64                        // the highest mark OpenMarked opened (stagehook.go)
}

// New makes a Producer.
func New(o Options) *Producer {
	if o.Chunk <= 0 {
		o.Chunk = 256
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = 1 << 30
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New("prefill")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	info := o.Model.Info()
	stage := o.Stage
	if stage == (engine.LayerRange{}) {
		stage = engine.LayerRange{Start: 0, End: info.Layers}
	}
	held := [2]int{0, info.KVHeads}
	if hr, ok := o.Model.(interface{ KVHeadRange() (int, int) }); ok {
		held[0], held[1] = hr.KVHeadRange()
	}
	bpt := int64(2 * (stage.End - stage.Start) * (held[1] - held[0]) * info.HeadDim * info.CacheDType.Size())
	p := &Producer{o: o, info: info, fp: kvwire.Fingerprint(o.Model.Fingerprint()), m: o.Metrics, log: o.Logger,
		stage: stage, held: held, changed: make(chan struct{})}
	p.cache = newPrefixCache(o.CacheBlock, max(o.CacheBytes, 0), bpt)
	if info.Windows != nil {
		// A sliding layer holds at most its ring, whatever the length.
		perLayer := bpt / int64(stage.End-stage.Start)
		windows := info.Windows[stage.Start:stage.End]
		chunk := o.Chunk
		p.cache.sizeOf = func(n int) int64 {
			var pos int64
			for _, w := range windows {
				if w == 0 {
					pos += int64(n)
				} else {
					pos += int64(min(n, engine.SlidingHeldMax(w, chunk)))
				}
			}
			return pos * perLayer
		}
	}
	return p
}

// Close frees the prefix cache.
func (p *Producer) Close() { p.cache.close() }

// CacheStats reports the prefix cache's entries and bytes.
func (p *Producer) CacheStats() (entries int, bytes int64) { return p.cache.stats() }

// CachedPrefix implements kvwire.PrefixProber: how many leading tokens of
// the prompt a Produce starting now would take from the prefix cache
// (never more than it would compute up to, len−1), computing nothing.
func (p *Producer) CachedPrefix(ctx context.Context, req *kvwire.Request) (int, error) {
	if req.Model != p.o.Name {
		return 0, fmt.Errorf("%w: this prefill runner serves %q, not %q", kvwire.ErrMismatch, p.o.Name, req.Model)
	}
	if req.Fingerprint != (kvwire.Fingerprint{}) && req.Fingerprint != p.fp {
		return 0, fmt.Errorf("%w: KV fingerprint differs from this runner's model", kvwire.ErrMismatch)
	}
	if _, _, err := p.layers(req); err != nil {
		return 0, err
	}
	if _, _, err := p.heads(req); err != nil {
		return 0, err
	}
	return p.cache.peek(req.Tokens, len(req.Tokens)-1, p.info.Recurrent != nil), nil
}

// layers is the model layers [a, b) req asks for: its range, or every
// layer. A range beyond the model is a mismatch (the decode side's model
// has more layers than this one).
func (p *Producer) layers(req *kvwire.Request) (a, b int, err error) {
	a, b = 0, p.info.Layers
	if req.HasRange() {
		a, b = req.LayerStart, req.LayerEnd
	}
	if b > p.info.Layers {
		return 0, 0, fmt.Errorf("%w: layers [%d, %d) asked of a %d-layer model", kvwire.ErrMismatch, a, b, p.info.Layers)
	}
	if a < p.stage.Start || b > p.stage.End {
		return 0, 0, fmt.Errorf("%w: layers [%d, %d) asked of a prefill stage holding layers [%d, %d)", kvwire.ErrMismatch, a, b, p.stage.Start, p.stage.End)
	}
	return a, b, nil
}

// heads is the KV heads [a, b) req asks for: its range, or every head. A
// range beyond the model is a mismatch; a model with recurrent layers
// (whose state splits by key heads, not KV heads) cannot serve one. A
// tensor-parallel prefill rank serves heads within its share only.
func (p *Producer) heads(req *kvwire.Request) (a, b int, err error) {
	a, b = 0, p.info.KVHeads
	if req.HasHeads() {
		a, b = req.HeadStart, req.HeadEnd
	}
	if b > p.info.KVHeads {
		return 0, 0, fmt.Errorf("%w: kv heads [%d, %d) asked of a model with %d", kvwire.ErrMismatch, a, b, p.info.KVHeads)
	}
	if a < p.held[0] || b > p.held[1] {
		return 0, 0, fmt.Errorf("%w: kv heads [%d, %d) asked of a tensor-parallel prefill rank holding kv heads [%d, %d) of %d (name each rank's heads: --prefill ADDR#%d:%d)",
			kvwire.ErrMismatch, a, b, p.held[0], p.held[1], p.info.KVHeads, p.held[0], p.held[1])
	}
	if !req.HasHeads() {
		return a, b, nil
	}
	if p.info.Recurrent != nil {
		return 0, 0, fmt.Errorf("%w: kv heads [%d, %d) asked of a model with recurrent layers (not supported)", kvwire.ErrMismatch, req.HeadStart, req.HeadEnd)
	}
	return req.HeadStart, req.HeadEnd, nil
}

// headSlice returns heads [a, b) of an export [heads, t, head_dim] of
// the cache (all of them when a, b is every head).
func headSlice(x []byte, heads, a, b int) []byte {
	if a == 0 && b == heads {
		return x
	}
	per := len(x) / heads
	return x[a*per : b*per]
}

// plan is what one request asks of its prompt: the layers [first, last),
// the wire dtype (wdt the engine dtype exported before an FP8 encoding)
// and the header that describes the stream.
type plan struct {
	first, last int
	h0, h1      int // the KV heads [h0, h1) shipped
	wire        kvwire.DType
	wdt         engine.DType
	fp8         bool
	hdr         kvwire.Header
}

// plan checks req against the model and works out its stream.
func (p *Producer) plan(req *kvwire.Request) (*plan, error) {
	if req.Model != p.o.Name {
		return nil, fmt.Errorf("%w: this prefill runner serves %q, not %q", kvwire.ErrMismatch, p.o.Name, req.Model)
	}
	if req.Fingerprint != (kvwire.Fingerprint{}) && req.Fingerprint != p.fp {
		return nil, fmt.Errorf("%w: KV fingerprint differs from this runner's model", kvwire.ErrMismatch)
	}
	first, last, err := p.layers(req)
	if err != nil {
		return nil, err
	}
	h0, h1, err := p.heads(req)
	if err != nil {
		return nil, err
	}
	n := len(req.Tokens)
	for i, t := range req.Tokens {
		if int(t) >= p.info.Vocab {
			return nil, fmt.Errorf("%w: token %d at %d outside the vocabulary of %d", kvwire.ErrBadRequest, t, i, p.info.Vocab)
		}
	}
	if p.info.MaxPositions > 0 && n > p.info.MaxPositions {
		return nil, fmt.Errorf("%w: %d tokens exceed the model's %d positions", kvwire.ErrBadRequest, n, p.info.MaxPositions)
	}
	cdt := p.info.CacheDType
	pl := &plan{first: first, last: last, h0: h0, h1: h1, wire: req.DType}
	if pl.wire == 0 {
		pl.wire = kvconv.Wire(cdt)
	}
	pl.wdt = kvconv.Engine(pl.wire)
	pl.fp8 = pl.wire == kvwire.DTypeF8E4M3
	if pl.fp8 {
		pl.wdt = cdt // exported as is, then scaled into FP8 per head
	}
	if pl.wdt == 0 {
		return nil, fmt.Errorf("%w: wire dtype %v", kvwire.ErrMismatch, pl.wire)
	}
	// The header describes layers [first, last) only: kinds[i] and the
	// header's layer i are the model's layer first+i.
	kinds := make([]kvwire.LayerKind, last-first)
	for l, r := range p.info.Recurrent {
		if r && l >= first && l < last {
			kinds[l-first] = kvwire.LayerRecurrent
		}
	}
	var windows []int
	if p.info.Windows != nil {
		windows = p.info.Windows[first:last]
	}
	pl.hdr = kvwire.Header{Fingerprint: p.fp, DType: pl.wire, KVHeads: h1 - h0, HeadDim: p.info.HeadDim,
		FirstHead: h0, FirstLayer: first, Kinds: kinds, Windows: windows, TokenStart: req.StartPos, TokenEnd: n - 1}
	return pl, nil
}

// dest is one stream the computing request ships to: its own, or a
// follower's (follow.go). sent counts its payload bytes.
type dest struct {
	pl    *plan
	chunk func(i, start, n int, k, v []byte) error
	state func(i, end int, arrays [][]byte) error
	sent  int64
}

// ship exports positions [from, to) of d's attention layers from cache in
// chunks of at most Chunk tokens (a sliding layer only its window of
// token_end), converted to d's wire dtype.
func (p *Producer) ship(cache engine.KVCache, d *dest, from, to int) error {
	cdt := p.info.CacheDType
	for s := from; s < to; s += p.o.Chunk {
		for i, kind := range d.pl.hdr.Kinds {
			if kind == kvwire.LayerRecurrent {
				continue
			}
			l := d.pl.first + i // the model's layer; the cache's is l − stage.Start
			ls := max(s, d.pl.hdr.LayerStart(i))
			cnt := min(p.o.Chunk, to-s) - (ls - s)
			if cnt <= 0 {
				continue
			}
			k, v, err := cache.Export(l-p.stage.Start, ls, cnt)
			if err != nil {
				return fmt.Errorf("%w: export layer %d: %v", kvwire.ErrRemoteInternal, l, err)
			}
			// A head range ships its heads only (K and V are [heads,
			// cnt, head_dim]: a contiguous part).
			held := p.held[1] - p.held[0]
			k, v = headSlice(k, held, d.pl.h0-p.held[0], d.pl.h1-p.held[0]), headSlice(v, held, d.pl.h0-p.held[0], d.pl.h1-p.held[0])
			if k, err = kvconv.Convert(k, cdt, d.pl.wdt); err != nil {
				return err
			}
			if v, err = kvconv.Convert(v, cdt, d.pl.wdt); err != nil {
				return err
			}
			if d.pl.fp8 {
				if k, err = toFP8(k, cdt, d.pl.h1-d.pl.h0); err != nil {
					return err
				}
				if v, err = toFP8(v, cdt, d.pl.h1-d.pl.h0); err != nil {
					return err
				}
			}
			if err := d.chunk(i, ls, cnt, k, v); err != nil {
				return err
			}
			d.sent += int64(len(k) + len(v))
		}
	}
	return nil
}

// states ships the state after end of each of d's recurrent layers.
func (p *Producer) states(cache engine.KVCache, d *dest, end int) error {
	if p.info.Recurrent == nil {
		return nil
	}
	rs, ok := cache.(engine.RecurrentState)
	if !ok {
		return fmt.Errorf("%w: the cache of a model with recurrent layers has no state", kvwire.ErrRemoteInternal)
	}
	for i, k := range d.pl.hdr.Kinds {
		if k != kvwire.LayerRecurrent {
			continue
		}
		l := d.pl.first + i
		arrays, err := rs.ExportState(l - p.stage.Start)
		if err != nil {
			return fmt.Errorf("%w: export state of layer %d: %v", kvwire.ErrRemoteInternal, l, err)
		}
		if err := d.state(i, end, arrays); err != nil {
			return err
		}
		for _, a := range arrays {
			d.sent += int64(len(a))
		}
	}
	return nil
}

// Produce implements kvwire.Producer. A request the server let follow
// another (Follow) is served from that one's computation. On a later stage
// of a prefill pipeline (pipe.go) a request never computes by itself: it
// sends its header at once (so that the client's progress deadline covers
// the wait for the stages upstream), then follows the computation those
// stages feed (asking for one when none is running) or reads the prefix
// cache. On stage 0 a request for a prompt being computed follows that
// computation, whoever started it.
func (p *Producer) Produce(ctx context.Context, req *kvwire.Request, e *kvwire.Emitter) (err error) {
	t0 := time.Now()
	if f := p.claim(req); f != nil {
		return p.follow(ctx, req, e, f, t0, false)
	}
	pl, err := p.plan(req)
	if err != nil {
		return err
	}
	start, end := pl.hdr.TokenStart, pl.hdr.TokenEnd
	var compute ComputeFunc
	if p.pipe != nil {
		if p.pipe.Later() {
			if err := e.Header(pl.hdr); err != nil {
				return err
			}
			if start >= end {
				return nil
			}
			f, err := p.await(ctx, req, pl)
			if err != nil {
				return err
			}
			if f != nil {
				return p.follow(ctx, req, e, f, t0, true)
			}
			compute = func(context.Context, engine.KVCache, []int32, int, int, func(int, int) error) error {
				return fmt.Errorf("%w: the prefix cache lost the prompt while this request read it", kvwire.ErrRemoteInternal)
			}
		} else {
			compute = p.pipe.Compute
		}
	}
	if p.pipe == nil || !p.pipe.Later() {
		if err := e.Header(pl.hdr); err != nil {
			return err
		}
	}
	if start >= end {
		return nil
	}
	own := &dest{pl: pl, chunk: e.Chunk, state: func(i, end int, a [][]byte) error { return e.State(i, end, a...) }}
	var j *job
	if p.pipe != nil && !p.pipe.Later() {
		// Stage 0: a computation of the prompt running now (another
		// request's, or one a later stage asked for) serves this one too.
		var f *follower
		if j, f = p.leadOrFollow(req.Tokens, start, pl, end); f != nil {
			return p.follow(ctx, req, e, f, t0, true)
		}
	}
	cached, followers, err := p.run(ctx, req.Tokens, start, pl.wire, own, end, compute, j)
	if err != nil {
		return err
	}
	d := time.Since(t0)
	p.m.KVBytes.WithLabelValues("prefill").Add(float64(own.sent))
	p.m.KVDuration.WithLabelValues("prefill").Observe(d.Seconds())
	p.log.Info("prefill served", "req", req.ID, "tokens", len(req.Tokens), "start_pos", start, "cached", cached,
		"computed", max(end-cached, 0), "layers", fmt.Sprintf("%d:%d", pl.first, pl.last), "kv_heads", fmt.Sprintf("%d:%d", pl.h0, pl.h1), "followers", followers,
		"bytes", own.sent, "wire_dtype", pl.wire.String(), "duration", d)
	return nil
}

// run computes tokens up to end = len(tokens)−1 from the longest cached
// prefix of at most limit positions, shipping own (nil: nobody, a
// pipeline's computation nobody asked this stage for) positions from start
// and every follower what it lacks. j, when set, is the job opened for it
// (openLocked); else run opens one. It returns the cached positions used
// and the followers served.
func (p *Producer) run(ctx context.Context, tokens []int32, start int, wire kvwire.DType, own *dest, limit int, compute ComputeFunc, j *job) (cached, followers int, err error) {
	end := len(tokens) - 1
	if j == nil {
		p.mu.Lock()
		j = p.openLocked(tokens, start, wire, limit)
		p.mu.Unlock()
	}
	// A model with recurrent layers reuses only a cached entry that is a
	// whole prefix of the prompt (its state cannot go back to a shorter
	// one); the decode side gets the state after end in State frames.
	// The job promised to compute from at most j.from (what the prefix
	// cache held when it opened): never from later.
	recurrent := p.info.Recurrent != nil
	cache, cached, err := p.cache.acquire(tokens, j.from, p.o.Model.NewCache, recurrent)
	if err != nil {
		p.end(j, err)
		return 0, 0, fmt.Errorf("%w: %v", kvwire.ErrRemoteInternal, err)
	}
	p.mu.Lock()
	j.from = cached
	p.mu.Unlock()
	defer func() {
		// Keep whatever was computed, even after a failure mid-way; the
		// job ends after, so that a request waiting for one (await) finds
		// the prompt in the prefix cache once it is gone.
		if l := cache.Len(); l > 0 {
			p.cache.release(append([]int32(nil), tokens[:l]...), cache)
		} else {
			cache.Free()
		}
		p.end(j, err)
	}()
	if cached > 0 {
		p.m.PrefixHit.WithLabelValues("prefill").Add(float64(cached))
	}
	// The cached KV the decode side lacks goes first.
	if own != nil && start < cached {
		if err := p.ship(cache, own, start, cached); err != nil {
			return cached, 0, err
		}
	}
	if err := p.feed(ctx, cache, j, max(cached, start), false); err != nil {
		return cached, 0, err
	}
	if cached < end {
		onChunk := func(cs, cn int) error {
			from, to := max(cs, start), cs+cn
			if from >= to {
				return nil
			}
			if own != nil {
				if err := p.ship(cache, own, from, to); err != nil {
					return err
				}
			}
			return p.feed(ctx, cache, j, to, false)
		}
		if compute == nil {
			err = p.o.Model.Prefill(ctx, cache, tokens[cached:end], p.o.Chunk, onChunk)
		} else {
			err = compute(ctx, cache, tokens, cached, end, onChunk)
		}
		if err != nil {
			return cached, 0, fmt.Errorf("prefill [%d,%d): %w", cached, end, err)
		}
		p.m.PrefillTokens.WithLabelValues("prefill").Add(float64(end - cached))
	}
	if own != nil {
		if err := p.states(cache, own, end); err != nil {
			return cached, 0, err
		}
	}
	if err := p.feed(ctx, cache, j, end, true); err != nil {
		return cached, 0, err
	}
	return cached, len(j.live), nil
}

// toFP8 scales one K or V export ([heads, t, head_dim] of the cache dtype)
// into an FP8 wire section.
func toFP8(b []byte, cdt engine.DType, heads int) ([]byte, error) {
	from := kvconv.Wire(cdt)
	out := make([]byte, kvwire.FP8Len(heads, len(b)/from.Size()))
	if err := kvwire.EncodeFP8(out, b, from, heads); err != nil {
		return nil, fmt.Errorf("%w: %v", kvwire.ErrRemoteInternal, err)
	}
	return out, nil
}
