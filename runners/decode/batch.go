package decode

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// batcher runs the decode steps of the generations in progress together,
// one Model.ForwardBatch per step (continuous batching: a generation joins
// at its next step and leaves when it ends; prompts are still prefilled
// one at a time, under the model's lock, between steps).
//
// A generation registers with join, then for every token calls step, which
// queues its (cache, token) and waits for the logits. The batcher's loop
// takes the first queued step, waits until every joined generation has
// queued one (or gather has passed: a generation busy elsewhere, e.g.
// writing to a slow client, does not hold the others back for longer),
// then runs them as one batch.
//
// Speculation lives here too: a generation verifying drafts queues its
// last token and the drafts as one chunk (member.stepAll) and the batch
// runs as one forward of every member's chunk (Model.ForwardBatchAllInto:
// k+1 positions for a member verifying k drafts, one for the others),
// each member getting the logits after every position of its chunk. While
// a member drafts with a draft model (member.drafting) the gather waits
// for it a while longer (up to draftWait), so that its verification joins
// the others' step rather than following it alone.
type batcher struct {
	model  Model
	gather time.Duration
	sizes  func(n int) // observes each batch's size; may be nil
	// verified observes each step that verified drafts: its sequences
	// and positions (sequences plus drafted tokens); may be nil.
	verified func(seqs, positions int)
	all      stepAll // the model's every-position batched step; nil: none
	// quorum (tests only): the first batch waits, up to quorumWait, until
	// that many generations have joined and stepped.
	quorum int
	cost   batchCost
	reqs   chan *stepReq

	mu       sync.Mutex
	joined   int
	drafting int // joined members drafting with a draft model
	// wake (buffered 1) tells a gathering batch that a member left or
	// stepped aside: it need not wait for that member's step.
	wake chan struct{}

	stopped chan struct{} // closed when run returns
	// ov overlaps the steps of batches whose tokens the device can pick
	// (overlap.go); nil:
	// every step is serial.
	ov *overlapRun
}

type stepReq struct {
	cache engine.KVCache
	tok   int32
	// feed, when not empty, is the chunk to feed instead of tok (a
	// verification: the last token and the drafts); logits then holds
	// every position's row, one after another.
	feed   []int32
	one    [1]int32 // tok as a chunk, in a batch that verifies
	logits []float32
	st     stepStat
	picked Picked // a PickingModel's pick, when the batcher steps one
	err    error
	done   chan struct{} // buffered (1): the batcher signals, never closes
	buf    []float32     // the generation's own logits row, reused step after step
	// dev is the generation's Picker when its tokens may be picked on the
	// device (overlappable): the batcher may overlap its steps.
	dev *Picker
}

// stepStat is what a step cost and with whom: the forward's time and the
// batch's sequences and positions (a member verifying k drafts adds k+1).
type stepStat struct {
	took            time.Duration
	seqs, positions int
}

// stepAll is the model method a batch that verifies drafts runs
// (engine.Model.ForwardBatchAllInto): every member's chunk in one forward,
// every position's logits.
type stepAll interface {
	ForwardBatchAllInto(ctx context.Context, caches []engine.KVCache, tokens [][]int32, dst []float32) ([][]float32, error)
}

// draftWait bounds how long a batch waits for members drafting with a
// draft model.
const draftWait = 50 * time.Millisecond

// stepBatch is the model method the batcher prefers: every row written
// into dst's storage (engine.Model.ForwardBatchInto), so that a step
// allocates nothing; ForwardBatch is the fallback.
type stepBatch interface {
	ForwardBatchInto(ctx context.Context, caches []engine.KVCache, tokens []int32, dst []float32) ([][]float32, error)
}

func newBatcher(m Model, maxBatch int, gather time.Duration) *batcher {
	all, _ := m.(stepAll)
	return &batcher{model: m, gather: gather, all: all, reqs: make(chan *stepReq, maxBatch), stopped: make(chan struct{}),
		wake: make(chan struct{}, 1)}
}

// overlap makes b overlap the batches it can (before run starts).
func (b *batcher) overlap(log *slog.Logger) {
	if gs, ok := b.model.(overlapStarter); ok {
		b.ov = &overlapRun{m: gs, log: log}
	}
}

// member is one joined generation: its step request (and logits row) is
// reused for every step, so stepping allocates nothing.
type member struct {
	b    *batcher
	req  stepReq
	once sync.Once
	// dev: the generation's Picker when its tokens may be picked on the
	// device (overlappable), so that its steps may be overlapped and
	// return the picked token, not logits; nil otherwise.
	dev *Picker
}

// joinMember registers a generation; leave must be called once when it
// stops stepping.
func (b *batcher) joinMember() *member {
	b.mu.Lock()
	b.joined++
	b.mu.Unlock()
	return &member{b: b, req: stepReq{done: make(chan struct{}, 1)}}
}

func (m *member) leave() {
	m.once.Do(func() {
		if m.b.ov != nil && m.req.cache != nil {
			m.b.ov.release(m.req.cache) // the cache without the step in flight
		}
		m.b.mu.Lock()
		m.b.joined--
		m.b.mu.Unlock()
		m.b.woken()
	})
}

// woken tells a gathering batch to count its members again.
func (b *batcher) woken() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// aside takes the member out of the batch's count until back: it is
// running a step of its own (a speculative verification) and the batch
// must not wait for its next step.
func (m *member) aside() {
	m.b.mu.Lock()
	m.b.joined--
	m.b.mu.Unlock()
	m.b.woken()
}

func (m *member) back() {
	m.b.mu.Lock()
	m.b.joined++
	m.b.mu.Unlock()
}

// drafting marks the member as drafting with a draft model (on) or done
// drafting: the batch waits a while longer for its next step (draftWait)
// instead of running without it.
func (m *member) drafting(on bool) {
	m.b.mu.Lock()
	if on {
		m.b.drafting++
	} else {
		m.b.drafting--
	}
	m.b.mu.Unlock()
}

func (b *batcher) anyDrafting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drafting > 0
}

// join is joinMember for callers that step through batcher.step.
func (b *batcher) join() (leave func()) { return b.joinMember().leave }

func (b *batcher) members() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.joined
}

// step appends tok to cache as part of the next batch and returns the
// logits after it (a PickingModel's pick instead). It always waits for
// the batch it joined: the cache is in use until then. The logits are the
// member's own row: valid until its next step.
func (m *member) step(cache engine.KVCache, tok int32) (stepOut, error) {
	b, r := m.b, &m.req
	r.cache, r.tok, r.feed, r.logits, r.err, r.dev = cache, tok, nil, nil, nil, m.dev
	select {
	case b.reqs <- r:
	case <-b.stopped:
		return stepOut{}, errBatcherStopped
	}
	select {
	case <-r.done:
		if r.err != nil {
			return stepOut{}, r.err
		}
		if r.logits == nil {
			return stepOut{picked: &r.picked, stat: r.st}, nil
		}
		return stepOut{logits: r.logits, stat: r.st}, nil
	case <-b.stopped:
		// run has returned; it finishes every batch it starts, so r was
		// never taken.
		return stepOut{}, errBatcherStopped
	}
}

// stepAll feeds the chunk feed (the last token and the drafts) to cache
// as part of the next batch and returns the logits after each of its
// positions, one row of V after another (the member's own storage, valid
// until its next step), and what the step cost. The batcher must have a
// stepAll model (b.all).
func (m *member) stepAll(cache engine.KVCache, feed []int32) ([]float32, stepStat, error) {
	b, r := m.b, &m.req
	r.cache, r.tok, r.feed, r.logits, r.err, r.dev = cache, feed[0], feed, nil, nil, nil
	select {
	case b.reqs <- r:
	case <-b.stopped:
		return nil, stepStat{}, errBatcherStopped
	}
	select {
	case <-r.done:
		r.feed = nil
		return r.logits, r.st, r.err
	case <-b.stopped:
		return nil, stepStat{}, errBatcherStopped
	}
}

// step is a one-off member's step (tests and callers without a member).
func (b *batcher) step(cache engine.KVCache, tok int32) ([]float32, error) {
	m := &member{b: b, req: stepReq{done: make(chan struct{}, 1)}}
	out, err := m.step(cache, tok)
	return out.logits, err
}

var errBatcherStopped = errors.New("decode: server closed")

// run serves steps until ctx ends.
func (b *batcher) run(ctx context.Context) {
	defer close(b.stopped)
	if b.ov != nil {
		defer b.ov.stop()
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*stepReq, 0, cap(b.reqs))
	// Reused step after step: the batch's caches and tokens, and the
	// model's logits storage (ForwardBatchInto).
	caches := make([]engine.KVCache, 0, cap(b.reqs))
	toks := make([]int32, 0, cap(b.reqs))
	// The model's logits for a whole batch land in flat (room for the
	// largest batch, made once), rows views of it.
	sb, into := b.model.(stepBatch)
	pm, picking := b.model.(PickingModel)
	vocab := 0
	if into {
		vocab = max(b.model.Info().Vocab, 0)
	}
	flat := make([]float32, cap(b.reqs)*vocab)
	rows := make([][]float32, 0, cap(b.reqs))
	var all allScratch // a verifying batch's (stepAll)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-b.reqs:
			batch = append(batch, r)
		}
		if b.quorum > 0 {
			batch = b.awaitQuorum(ctx, batch)
		}
		timer.Reset(b.gather)
		extra := int(draftWait / max(b.gather, time.Microsecond)) // gathers more while members draft
	gather:
		for len(batch) < cap(b.reqs) && len(batch) < b.members() {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			case <-b.wake: // a member left: count again
			case <-timer.C:
				if extra > 0 && b.anyDrafting() {
					extra--
					timer.Reset(b.gather)
					continue
				}
				break gather
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		caches, toks = caches[:0], toks[:0]
		positions := 0
		for _, r := range batch {
			caches, toks = append(caches, r.cache), append(toks, r.tok)
			positions += max(1, len(r.feed))
		}
		if b.sizes != nil {
			b.sizes(len(batch))
		}
		// A verifying member is never overlappable (dev nil): the overlap
		// (if running) stops for its batch.
		if b.ov != nil && b.ov.step(batch) {
			clear(caches)
			continue
		}
		if positions > len(batch) {
			if b.verified != nil {
				b.verified(len(batch), positions)
			}
			all = b.stepAll(batch, caches, all, positions)
			clear(caches)
			continue
		}
		var logits [][]float32
		var picked []Picked
		var err error
		t0 := time.Now()
		if picking {
			picked, err = pm.ForwardBatchPick(context.Background(), caches, toks)
		} else if into && vocab > 0 {
			// The model writes every row into flat's storage (it has room
			// for the largest batch). The row slices it returns are its
			// own scratch, which another generation's prefill may reuse
			// as soon as it returns, so the rows are read from flat.
			if _, err = sb.ForwardBatchInto(context.Background(), caches, toks, flat[:0]); err == nil {
				logits = rows[:0]
				for i := range batch {
					logits = append(logits, flat[i*vocab:(i+1)*vocab:(i+1)*vocab])
				}
				rows = logits
			}
		} else {
			logits, err = b.model.ForwardBatch(context.Background(), caches, toks)
		}
		st := stepStat{took: time.Since(t0), seqs: len(batch), positions: positions}
		if err == nil {
			b.cost.observe(st)
		}
		for i, r := range batch {
			r.st = st
			if err != nil {
				r.err = err
			} else if picking {
				r.picked, r.logits = picked[i], nil
			} else {
				// Each generation reads its row after the batcher has
				// moved on: a copy into the row it owns.
				r.buf = append(r.buf[:0], logits[i]...)
				r.logits = r.buf
			}
			r.done <- struct{}{}
		}
		clear(caches) // hold no cache past its step
	}
}

// quorumWait bounds batcher.quorum's wait.
const quorumWait = 30 * time.Second

// awaitQuorum gathers the first batch until b.quorum steps are queued (or
// quorumWait passed), then drops the quorum.
func (b *batcher) awaitQuorum(ctx context.Context, batch []*stepReq) []*stepReq {
	deadline := time.NewTimer(quorumWait)
	defer deadline.Stop()
	for len(batch) < min(b.quorum, cap(b.reqs)) {
		select {
		case r := <-b.reqs:
			batch = append(batch, r)
		case <-deadline.C:
			b.quorum = 0
			return batch
		case <-ctx.Done():
			b.quorum = 0
			return batch
		}
	}
	b.quorum = 0
	return batch
}

// allScratch is what a verifying batch reuses step after step: the
// chunks and the logits of every position.
type allScratch struct {
	chunks [][]int32
	flat   []float32
}

// stepAll runs a batch in which members verify drafts: one forward of
// every member's chunk (its feed, or its one token), each member's rows
// copied into its own buffer. It returns the scratch for the next one.
func (b *batcher) stepAll(batch []*stepReq, caches []engine.KVCache, sc allScratch, positions int) allScratch {
	V := b.model.Info().Vocab
	sc.chunks = sc.chunks[:0]
	for _, r := range batch {
		ch := r.feed
		if len(ch) == 0 {
			r.one[0] = r.tok
			ch = r.one[:]
		}
		sc.chunks = append(sc.chunks, ch)
	}
	if cap(sc.flat) < positions*V {
		sc.flat = make([]float32, 0, positions*V)
	}
	t0 := time.Now()
	var err error
	if b.all == nil {
		err = errors.New("decode: the model cannot verify drafts in a batch")
	} else {
		_, err = b.all.ForwardBatchAllInto(context.Background(), caches, sc.chunks, sc.flat[:0])
	}
	st := stepStat{took: time.Since(t0), seqs: len(batch), positions: positions}
	if err == nil {
		b.cost.observe(st)
	}
	off := 0
	for i, r := range batch {
		n := len(sc.chunks[i])
		r.st = st
		if err != nil {
			r.err = err
		} else {
			// The rows are read after the batcher has moved on: a copy
			// into the member's own storage.
			r.buf = append(r.buf[:0], sc.flat[off*V:(off+n)*V]...)
			r.logits = r.buf
		}
		off += n
		r.done <- struct{}{}
	}
	clear(sc.chunks)
	return sc
}

// batchCost is a batcher's measure of what verifying drafts costs its
// steps: a plain step's time by batch size (every member one position),
// and an extra position's cost — what a step of P positions and B
// sequences takes beyond the plain step of B, per extra position, over
// one sequence's share of that plain step (B·(T/plain(B) − 1)/(P − B)) —
// averaged over every verifying step, whichever member drafted. Every
// member waits for the positions any of them verifies, so a member's
// draft pays only if it yields more than that cost for every position.
// With every member drafting there would be no plain step to measure
// against: the batch asks its members for one (plainDue) when its size
// has none yet and every batchRemeasure steps.
type batchCost struct {
	mu    sync.Mutex
	plain []float64 // a plain step's seconds by batch size (moving averages; 0: unmeasured)
	cost  float64   // an extra position's cost (moving average)
	n     int       // verifying steps measured
	since int       // steps since the last plain one
	due   bool      // the members' next step should be plain
}

// batchRemeasure: every so many steps of a batch one is plain (its
// members draft nothing), to keep the plain step's time measured.
const batchRemeasure = 32

func (c *batchCost) observe(st stepStat) {
	t, B, P := st.took.Seconds(), max(st.seqs, 1), st.positions
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.plain) <= B {
		c.plain = append(c.plain, make([]float64, B+1-len(c.plain))...)
	}
	p := &c.plain[B]
	if P <= B {
		if *p == 0 {
			*p = t
		} else {
			*p += specAlpha * (t - *p)
		}
		c.since, c.due = 0, false
		return
	}
	c.since++
	c.due = *p == 0 || c.since >= batchRemeasure
	if *p == 0 {
		return
	}
	x := min(max(float64(B)*(t / *p - 1)/float64(P-B), 0), 4)
	if c.n == 0 {
		c.cost = x
	} else {
		c.cost += specAlpha * (x - c.cost)
	}
	c.n++
}

// plainDue reports whether the batch wants its members' next step plain.
func (c *batchCost) plainDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.due
}

// at is the measure for a batch of B sequences: a plain step's seconds
// per sequence, and an extra position's cost in those units; ok false
// until both are measured.
func (c *batchCost) at(B int) (step, cost float64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 || B >= len(c.plain) || c.plain[B] == 0 {
		return 0, 0, false
	}
	return c.plain[B] / float64(B), c.cost, true
}
