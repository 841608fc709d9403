package decode

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
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
	// left is how many steps the generation may still take, this one
	// included (its max_tokens; 0: no bound): an overlap queues none past
	// them.
	left int
	// last: an overlap running this step queues no step after it
	// (engine.Overlap.Drain): the generation verifies drafts next, and
	// the step it would queue would be dropped.
	last bool
	// ahead (the batcher's answer): the step was overlapped and the
	// generation's next one is already in flight, fed with its token.
	ahead bool
}

// stepStat is what a step cost and with whom: the forward's time and the
// batch's sequences and positions (a member verifying k drafts adds k+1).
type stepStat struct {
	took            time.Duration
	seqs, positions int
	// wall: the step's time as its caller saw it, when that differs from
	// took (a plain step's share of a batch's forward); batchCost pairs
	// consecutive steps by it (0: took).
	wall time.Duration
	// untimed: took is not a serial forward's time (an overlapped step
	// after its overlap's first: its forward ran while the host handled
	// the step before, see overlapRun.step); the cost model counts the
	// step but takes no time from it.
	untimed bool
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
		b.ov = newOverlapRun(gs, log)
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
	// left and last: stepReq.left and last for the member's next step.
	left int
	last bool
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
	r.cache, r.tok, r.feed, r.logits, r.err, r.dev, r.left, r.last, r.ahead = cache, tok, nil, nil, nil, m.dev, m.left, m.last, false
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
			return stepOut{picked: &r.picked, stat: r.st, ahead: r.ahead}, nil
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
	r.cache, r.tok, r.feed, r.logits, r.err, r.dev, r.left, r.last, r.ahead = cache, feed[0], feed, nil, nil, nil, 0, false, false
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
		// (if running) stops for its batch (its members' last step drained
		// it, so that nothing in flight is dropped: stepReq.last).
		if b.ov != nil {
			if st, ok := b.ov.step(batch); ok {
				if st.seqs > 0 {
					b.cost.observe(st)
				}
				clear(caches)
				continue
			}
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

// batchCost is what a step of the batch takes by its total positions P
// (every member one, a member verifying k drafts k+1). A member choosing
// its draft length weighs the tokens it expects against what its
// positions add to the step every member waits for, at the size that step
// will have (line): an extra position costs more in a larger step on a
// compute-bound backend (0.33 of a sequence's share at 12 positions, 0.68
// at 36 on the cpu backend with SmolLM2), so one average cost drafts too
// much in a full batch and too little alone.
//
// What an extra position costs is measured between consecutive steps of
// different sizes (a fraction of a second apart, so under the same load):
// the larger one's time over the smaller's, less 1, per position — a
// share of the step's time, which a load that slows every step alike
// leaves as it is; line takes the median of the latest such pairs around
// the size asked about. A size's own time is the median of its latest
// steps (it scales a draft model's forward against the step). A least-squares fit of times against sizes
// measured at different moments read a position as free under this
// machine's changing load; medians of time-paired differences follow
// neither a spike nor a drift.
//
// With every member drafting there would be no plain step to measure
// against: the batch asks its members for one (plainDue) when its size
// has none yet and every batchRemeasure steps. It also keeps the batch's
// share of drafted tokens accepted (a member counts the others' expected
// tokens with it).
type batchCost struct {
	mu    sync.Mutex
	t     []posSamples // by P: the latest step times (seconds)
	count []int        // by P: the steps observed, timed or not
	since int          // steps since the last plain one
	due   bool         // the members' next step should be plain
	// drafted and accepted: decayed counts of the members' drafted
	// tokens and those accepted (prior: half).
	drafted, accepted float64
	// pairs: the latest consecutive steps' sizes and relative cost per
	// position (a ring, np written so far); prev: the last step.
	pairs   [costPairs]costPair
	np      int
	prevP   int
	prevT   float64
	prevAt  time.Time
	scratch []float64
	// memo: line's answers since the last observe (a member's plan asks
	// for 2 + k lines a step, every member of a batch about the same
	// ones; each is a median over up to costPairs pairs).
	memo map[[2]int]costLine
	// now is the clock that pairs consecutive steps (nil: time.Now;
	// tests set it).
	now func() time.Time
}

// costSamples: the step times kept per size (their median is the size's).
const costSamples = 9

// costPairs: the consecutive-step pairs kept; costMinPairs: fewer around
// the size asked about and line takes every pair kept.
const (
	costPairs    = 256
	costMinPairs = 5
)

// costPairGap: consecutive steps further apart than this (idle between)
// are not paired.
const costPairGap = 200 * time.Millisecond

// batchRemeasure: every so many steps of a batch one is plain (its
// members draft nothing), to keep the plain step's time measured.
const batchRemeasure = 32

// maxCostPositions bounds the sizes batchCost keeps (a larger step counts
// as this one).
const maxCostPositions = 1024

// costSlopeFloor: an extra position costs at least this share of a
// position's average time (a step bound by reading the weights is close
// to it).
const costSlopeFloor = 0.02

// costPrior: an extra position's cost, in a position's average, until two
// sizes have been paired.
const costPrior = 0.25

// costWindow: line takes the pairs within this many positions of the
// range it is asked about.
const costWindow = 4

type posSamples struct {
	s [costSamples]float64
	n int
}

func (p *posSamples) add(t float64) {
	p.s[p.n%costSamples] = t
	p.n++
}

func (p *posSamples) median() float64 {
	var v [costSamples]float64
	n := copy(v[:], p.s[:min(p.n, costSamples)])
	return median(v[:n])
}

// costPair is two consecutive steps: their sizes and what a position
// adds to the smaller one, a share of its time (d).
type costPair struct {
	lo, hi int
	d      float64
}

func (c *batchCost) observe(st stepStat) {
	t, B, P := st.took.Seconds(), max(st.seqs, 1), min(max(st.positions, 1), maxCostPositions)
	now := time.Now()
	if c.now != nil {
		now = c.now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.memo)
	if len(c.t) <= P {
		c.t = append(c.t, make([]posSamples, P+1-len(c.t))...)
		c.count = append(c.count, make([]int, P+1-len(c.count))...)
	}
	c.count[P]++
	if st.untimed {
		// An overlapped step: no time, and the steps around it are not
		// consecutive serial ones; it is a plain step all the same.
		c.prevP = 0
		if P <= B {
			c.since, c.due = 0, false
		}
		return
	}
	c.t[P].add(t)
	if c.prevP > 0 && c.prevP != P && now.Sub(c.prevAt)-cmp.Or(st.wall, st.took) < costPairGap && t > 0 && c.prevT > 0 {
		lo, hi, tl, th := c.prevP, P, c.prevT, t
		if lo > hi {
			lo, hi, tl, th = hi, lo, th, tl
		}
		c.pairs[c.np%costPairs] = costPair{lo, hi, (th/tl - 1) / float64(hi-lo)}
		c.np++
	}
	c.prevP, c.prevT, c.prevAt = P, t, now
	if P <= B {
		c.since, c.due = 0, false
		return
	}
	c.since++
	c.due = B >= len(c.t) || c.t[B].n == 0 || c.since >= batchRemeasure
}

// plainDue reports whether the batch wants its members' next step plain.
func (c *batchCost) plainDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.due
}

// verified counts a member's verification: k drafted tokens, ok of them
// accepted.
func (c *batchCost) verified(k, ok int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drafted == 0 {
		c.drafted, c.accepted = 2, 1
	}
	c.drafted = batchDecay*c.drafted + float64(k)
	c.accepted = batchDecay*c.accepted + float64(ok)
}

// batchDecay: the weight of the past in the batch's acceptance, per
// verification of any member.
const batchDecay = 0.95

// acceptance is the batch's share of drafted tokens accepted.
func (c *batchCost) acceptance() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drafted == 0 {
		return 0.5
	}
	return c.accepted / c.drafted
}

// line is what a step of P0 + k positions takes, in seconds, as t0 +
// slope·k for k from 0 to span; ok false while no step is measured. The
// slope, a share ρ of t0, is the median over the pairs kept within
// costWindow of P0 … P0 + span (every pair when fewer than costMinPairs
// are there) of each pair's d moved from its smaller size to P0 (d/(1 +
// d·(P0 − lo)): exact where a step's time is linear in its positions);
// costPrior of a position's share when nothing is paired, at least
// costSlopeFloor of it. t0 is the median time of the measured size nearest
// P0, moved to P0 along the slope.
func (c *batchCost) line(P0, span int) (t0, slope float64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]int{P0, span}
	if l, hit := c.memo[key]; hit {
		return l.t0, l.slope, l.ok
	}
	t0, slope, ok = c.lineLocked(P0, span)
	if c.memo == nil {
		c.memo = map[[2]int]costLine{}
	}
	c.memo[key] = costLine{t0, slope, ok}
	return t0, slope, ok
}

// costLine is one of line's answers.
type costLine struct {
	t0, slope float64
	ok        bool
}

// lineLocked is line without the memo; c.mu is held.
func (c *batchCost) lineLocked(P0, span int) (t0, slope float64, ok bool) {
	q := 0 // the measured size nearest P0
	for p := 1; p < len(c.t); p++ {
		if c.t[p].n > 0 && (q == 0 || abs(p-P0) < abs(q-P0)) {
			q = p
		}
	}
	if q == 0 {
		return 0, 0, false
	}
	pairs := c.pairs[:min(c.np, costPairs)]
	at := func(sl []float64, pr costPair) []float64 {
		if x := 1 + pr.d*float64(P0-pr.lo); x > 0 {
			sl = append(sl, pr.d/x)
		}
		return sl
	}
	lo, hi := P0-costWindow, P0+span+costWindow
	sl := c.scratch[:0]
	for _, pr := range pairs {
		if pr.lo >= lo && pr.hi <= hi {
			sl = at(sl, pr)
		}
	}
	if len(sl) < costMinPairs {
		sl = sl[:0]
		for _, pr := range pairs {
			sl = at(sl, pr)
		}
	}
	rho := costPrior / float64(P0)
	if len(sl) > 0 {
		rho = max(median(sl), costSlopeFloor/float64(P0))
	}
	c.scratch = sl
	x := 1 + rho*float64(q-P0)
	if x <= 0 {
		return 0, 0, false
	}
	t0 = c.t[q].median() / x
	return t0, rho * t0, true
}

func abs(x int) int { return max(x, -x) }

// steps returns how many steps of each size were observed (index P),
// timed or not.
func (c *batchCost) steps() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.count)
}

// median sorts v and returns its median (v not empty).
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
