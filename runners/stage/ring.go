package stage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// RingConfig configures stage 0.
type RingConfig struct {
	Name  string     // served model name (metrics, logs)
	Link  LinkConfig // this stage (Stage 0)
	Model Layers     // stage 0's layers (the embedding): an engine model or its tensor group
	// Health, when set, is the stage's own condition besides its links
	// (its tensor group whole): while it fails the ring is not linked,
	// and a failure takes a linked ring down.
	Health func() error
	// Listen takes the last stage's link (the picked tokens); Next is
	// stage 1's --stage-listen.
	Listen net.Listener
	Next   string
	// StepTimeout is the longest stage 0 waits for the answer to anything
	// it sent down the ring (default 2 min); past it the ring is taken
	// down (a stage hung) and every request in flight fails.
	StepTimeout time.Duration
	// DType is the hidden states' dtype on the link (DTypeF32 default).
	DType   uint8
	Metrics *Metrics
	Logger  *slog.Logger
	// Lanes is how many decode lanes the decode Server runs over the ring
	// (decode.Laned): 0, one per stage, so that every stage computes a
	// different lane's step at once; 1, the whole batch goes through the
	// stages in lockstep.
	Lanes int
	// TestPace, TEST ONLY, caps this stage's compute at so many tokens/s
	// (each step takes at least its tokens / TestPace): benchmarks make a
	// loaded machine look like hosts of known speeds.
	TestPace float64
	// Group, when set, carries the hidden states over the backend's own
	// group where every stage offers one (see Group); nil: the Step
	// frames carry them.
	Group *Group
	// Fallback, when Group is nil, says why (MLXGroup's Transport): the
	// stage's Transport.
	Fallback Transport
}

// Ring is stage 0 of a pipeline as a decode.PickingModel: the decode
// runner drives it as it drives an engine.Model. Its caches are
// composites (its own stage cache and the sequence's id on the later
// stages, whose Truncate and Free go down the ring in order); its steps
// run stage 0's layers, send the hidden states down the ring and wait for
// the tokens the last stage picked.
type Ring struct {
	cfg RingConfig
	m   Layers
	met *stageMetrics
	log *slog.Logger
	cs  *carry

	mu      sync.Mutex
	out     *Link // nil while the ring is down
	ready   bool  // a probe has gone round the ring since out was set
	epoch   uint64
	pending map[uint64]*pending
	downErr error

	tickets, seqs atomic.Uint64

	// cmu serializes stage 0's steps with their TestPace (the model's
	// own lock serializes the computation, and the engine's caches take
	// it where they make or free backend arrays).
	cmu sync.Mutex
}

type pending struct {
	ch       chan reply
	deadline time.Time
}

// fillTimeout bounds a Fill round the ring: each stage's fetch may take up
// to fillFetchTimeout (a long prompt over a slow link), far past a step's.
const (
	fillFetchTimeout = 10 * time.Minute
	fillTimeout      = 15 * time.Minute
)

type reply struct {
	msg any
	err error
}

var (
	_ decode.PickingModel = (*Ring)(nil)
	_ decode.Laned        = (*Ring)(nil)
)

// NewRing checks cfg and makes stage 0's model.
func NewRing(cfg RingConfig) (*Ring, error) {
	l := &cfg.Link
	switch {
	case l.Stages < 2 || l.Stage != 0:
		return nil, fmt.Errorf("stage: the ring is stage 0 of 2 or more, not %d of %d", l.Stage, l.Stages)
	case cfg.Model == nil || cfg.Listen == nil || cfg.Next == "":
		return nil, errors.New("stage: stage 0 needs its model, a listener and stage 1's address")
	}
	if err := checkCarried(cfg.Group, cfg.Model); err != nil {
		return nil, err
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 2 * time.Minute
	}
	if cfg.DType == 0 {
		cfg.DType = DTypeF32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l.defaults()
	r := &Ring{cfg: cfg, m: cfg.Model, log: cfg.Logger.With("stage", 0), met: cfg.Metrics.bind(cfg.Name, 0),
		pending: map[uint64]*pending{}, downErr: fmt.Errorf("%w: not connected yet", ErrDown)}
	r.cfg.Link.Count = r.met.count
	r.cfg.Link.Wrote = func(d time.Duration) { r.met.link.Add(d.Seconds()) }
	cs, err := newCarry(cfg.Group, cfg.Fallback, l.Stages, r.met, r.log)
	if err != nil {
		return nil, err
	}
	r.cs = cs
	r.cfg.Link.Offer = cs.offered
	return r, nil
}

// Transport is where stage 0's hidden states go, and why not over its
// group when they stay on the stage link.
func (r *Ring) Transport() Transport { return r.cs.transport() }

// Healthy: the whole ring is up (a probe went round it since the links
// were made, and none has failed since).
func (r *Ring) Healthy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A closed link counts at once, before Run has noticed: a request
	// that failed on it must not find the ring healthy.
	return r.out != nil && r.ready && r.out.Err() == nil
}

// probe sends a no-op (a Truncate query for sequence 0, which no stage
// holds) round the ring and marks it ready when it comes back.
func (r *Ring) probe(ctx context.Context, out *Link) {
	_, err := r.call(ctx, 0, func(t uint64) any { return Truncate{Ticket: t, Seq: 0, N: 0, OK: true} })
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil && r.out == out {
		r.ready = true
		r.log.Info("stage ring up", "stages", r.cfg.Link.Stages, "next", r.cfg.Next)
	}
}

// Run keeps the ring up until ctx ends: it dials stage 1, takes the last
// stage's link, and serves the answers until a link fails; then it fails
// everything in flight and starts over.
func (r *Ring) Run(ctx context.Context) error {
	accepted := acceptLinks(ctx, r.cfg.Listen, r.cfg.Link, r.log)
	for ctx.Err() == nil {
		if err := awaitHealth(ctx, r.cfg.Health, r.log); err != nil {
			break
		}
		out, err := dialLoop(ctx, r.cfg.Next, r.cfg.Link, r.log)
		if err != nil {
			break
		}
		in := newest(ctx, accepted, out.Done())
		if in == nil {
			out.Close(ctx.Err())
			if ctx.Err() == nil {
				r.log.Warn("stage link down", "err", out.Err())
			}
			continue
		}
		if _, err := r.cs.decide(ctx, in, out); err != nil {
			in.Close(err)
			out.Close(err)
			r.down(err)
			r.cs.lose(err)
			return err
		}
		r.mu.Lock()
		r.out, r.downErr, r.ready = out, nil, false
		r.epoch++
		r.mu.Unlock()
		go r.probe(ctx, out)
		err = r.serve(ctx, in, out)
		in.Close(err)
		out.Close(err)
		r.down(err)
		if ctx.Err() == nil {
			r.log.Error("stage ring down: requests in flight failed", "err", err)
		}
		if r.cs.joined() {
			// The group cannot be joined again: every stage restarts.
			err = fmt.Errorf("%w: %w", ErrGroupLost, err)
			r.down(err)
			if ctx.Err() == nil {
				r.cs.lose(err)
			}
			return err
		}
	}
	r.down(fmt.Errorf("%w: stopping", ErrDown))
	return nil
}

// down fails everything in flight with err and marks the ring down.
func (r *Ring) down(err error) {
	if !errors.Is(err, ErrDown) {
		err = fmt.Errorf("%w: %w", ErrDown, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out, r.downErr, r.ready = nil, err, false
	for t, p := range r.pending {
		p.ch <- reply{err: err}
		delete(r.pending, t)
	}
	r.met.inFlight.Set(0)
}

// serve dispatches the last stage's answers until a link fails or a
// ticket waits past StepTimeout.
func (r *Ring) serve(ctx context.Context, in, out *Link) error {
	go drainBack(out) // stage 1's link carries only keepalives and errors back
	go func() {
		select {
		case <-out.Done():
			in.Close(out.Err())
		case <-in.Done():
		}
	}()
	stop := context.AfterFunc(ctx, func() { in.Close(ctx.Err()) })
	defer stop()
	go r.watch(in, out)
	go watchHealth(r.cfg.Health, in, out)
	for {
		msg, err := in.Recv()
		if err != nil {
			return err
		}
		var t uint64
		switch m := msg.(type) {
		case Picks:
			t = m.Ticket
		case Ack:
			t = m.Ticket
		case Truncate:
			t = m.Ticket
		case Fill:
			t = m.Ticket
		case ErrorFrame:
			if m.Ticket == 0 {
				return remoteError(m.Code, m.Reason)
			}
			t, msg = m.Ticket, remoteError(m.Code, m.Reason)
		default:
			return fmt.Errorf("%w: a %T frame from the last stage", ErrCorrupt, msg)
		}
		r.mu.Lock()
		if p := r.pending[t]; p != nil {
			delete(r.pending, t)
			p.ch <- reply{msg: msg}
		}
		r.met.inFlight.Set(float64(len(r.pending)))
		r.mu.Unlock()
	}
}

// watch takes the ring down when an answer is overdue (a stage hung
// without its links noticing).
func (r *Ring) watch(in, out *Link) {
	tick := time.NewTicker(min(time.Second, r.cfg.StepTimeout/4))
	defer tick.Stop()
	for {
		select {
		case <-in.Done():
			return
		case <-out.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		late := false
		for _, p := range r.pending {
			late = late || time.Now().After(p.deadline)
		}
		r.mu.Unlock()
		if late {
			err := fmt.Errorf("%w: an answer from the ring is overdue (%v for a step, %v for a remote fill): a stage hung?", ErrDown, r.cfg.StepTimeout, fillTimeout)
			out.Close(err)
			in.Close(err)
			return
		}
	}
}

// send sends a ticketed message down the ring for a sequence of the
// given epoch (0: any) and returns its ticket's reply channel.
func (r *Ring) send(epoch uint64, ticket uint64, msg any) (chan reply, error) {
	r.mu.Lock()
	out := r.out
	if out == nil {
		err := r.downErr
		r.mu.Unlock()
		return nil, err
	}
	if epoch != 0 && epoch != r.epoch {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: the sequence began before the ring was rebuilt", ErrDown)
	}
	timeout := r.cfg.StepTimeout
	if _, ok := msg.(Fill); ok {
		timeout = fillTimeout
	}
	p := &pending{ch: make(chan reply, 1), deadline: time.Now().Add(timeout)}
	r.pending[ticket] = p
	r.met.inFlight.Set(float64(len(r.pending)))
	r.mu.Unlock()
	if err := out.Send(msg); err != nil {
		r.forget(ticket)
		return nil, fmt.Errorf("%w: %w", ErrDown, err)
	}
	return p.ch, nil
}

func (r *Ring) forget(ticket uint64) {
	r.mu.Lock()
	delete(r.pending, ticket)
	r.met.inFlight.Set(float64(len(r.pending)))
	r.mu.Unlock()
}

// wait waits for a ticket's reply.
func (r *Ring) wait(ctx context.Context, ticket uint64, ch chan reply) (any, error) {
	select {
	case rep := <-ch:
		if rep.err != nil {
			return nil, rep.err
		}
		if e, ok := rep.msg.(*RemoteError); ok {
			return nil, e
		}
		return rep.msg, nil
	case <-ctx.Done():
		r.forget(ticket)
		return nil, ctx.Err()
	}
}

func (r *Ring) call(ctx context.Context, epoch uint64, mk func(ticket uint64) any) (any, error) {
	t := r.tickets.Add(1)
	ch, err := r.send(epoch, t, mk(t))
	if err != nil {
		return nil, err
	}
	return r.wait(ctx, t, ch)
}

// currentEpoch is the ring's epoch while it is up, 0 while down.
func (r *Ring) currentEpoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		return 0
	}
	return r.epoch
}

// Lanes is how many decode lanes the Server runs (decode.Laned).
func (r *Ring) Lanes() int {
	if r.cfg.Lanes > 0 {
		return r.cfg.Lanes
	}
	return r.cfg.Link.Stages
}

// Info describes the whole model (every stage's layers).
func (r *Ring) Info() engine.ModelInfo { return r.m.Info() }

// Fingerprint is the model's KV fingerprint.
func (r *Ring) Fingerprint() engine.Fingerprint { return r.m.Fingerprint() }

// NewCache makes a sequence: stage 0's cache and an id for the others'.
func (r *Ring) NewCache() engine.KVCache {
	return &seqCache{r: r, local: r.m.NewCache(), id: r.seqs.Add(1)}
}

var errLogits = errors.New("stage: a pipeline's logits live on its last stage (use ForwardPick)")

// Forward is refused: the logits are on the last stage.
func (r *Ring) Forward(ctx context.Context, c engine.KVCache, tokens []int32) ([]float32, error) {
	return nil, errLogits
}

// ForwardBatch is refused: the logits are on the last stage.
func (r *Ring) ForwardBatch(ctx context.Context, caches []engine.KVCache, tokens []int32) ([][]float32, error) {
	return nil, errLogits
}

func (r *Ring) seq(c engine.KVCache) (*seqCache, error) {
	sc, ok := c.(*seqCache)
	if !ok || sc.r != r {
		return nil, fmt.Errorf("stage: a cache of type %T is not one of this ring's", c)
	}
	return sc, sc.ready()
}

// Prefill runs tokens through the pipeline in chunks of at most chunk
// tokens (0: engine default), without waiting for a chunk to leave the
// ring before stage 0 computes the next (chunk i on stage 2 while chunk
// i+1 is on stage 1); at most Stages+1 chunks are in flight. It returns
// once every chunk is in every stage's cache.
func (r *Ring) Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error {
	sc, err := r.seq(c)
	if err != nil {
		return err
	}
	if chunk <= 0 {
		chunk = engine.DefaultPrefillChunk
	}
	type flight struct {
		t  uint64
		ch chan reply
	}
	var fl []flight
	defer func() {
		for _, f := range fl {
			r.forget(f.t)
		}
	}()
	window := r.cfg.Link.Stages + 1
	for len(tokens) > 0 {
		if len(fl) >= window {
			if _, err := r.wait(ctx, fl[0].t, fl[0].ch); err != nil {
				return fmt.Errorf("pipeline prefill: %w", err)
			}
			fl = fl[1:]
		}
		n := min(chunk, len(tokens))
		pos := sc.local.Len()
		t, ch, err := r.stepSeqs(ctx, []*seqCache{sc}, [][]int32{tokens[:n]}, false)
		if err != nil {
			return fmt.Errorf("pipeline prefill: %w", err)
		}
		fl = append(fl, flight{t, ch})
		tokens = tokens[n:]
		if onChunk != nil {
			if err := onChunk(pos, n); err != nil {
				return err
			}
		}
	}
	for len(fl) > 0 {
		if _, err := r.wait(ctx, fl[0].t, fl[0].ch); err != nil {
			return fmt.Errorf("pipeline prefill: %w", err)
		}
		fl = fl[1:]
	}
	return nil
}

// stepSeqs runs one step of stage 0's layers for the sequences and sends
// it down the ring; pick asks the last stage for each one's token.
func (r *Ring) stepSeqs(ctx context.Context, seqs []*seqCache, toks [][]int32, pick bool) (uint64, chan reply, error) {
	locals := make([]engine.KVCache, len(seqs))
	step := &Step{DType: r.cfg.DType, Seqs: make([]StepSeq, len(seqs))}
	epoch := seqs[0].epoch
	for i, sc := range seqs {
		if sc.epoch != epoch {
			return 0, nil, fmt.Errorf("%w: sequences of two ring epochs in one step", ErrDown)
		}
		locals[i] = sc.local
		step.Seqs[i] = StepSeq{Seq: sc.id, Pos: sc.local.Len(), N: len(toks[i]), Pick: pick}
		step.Tokens = append(step.Tokens, toks[i]...)
	}
	t0 := time.Now()
	if c := r.cs.carrier(); c != nil {
		return r.stepCarried(ctx, c, epoch, locals, toks, step, t0)
	}
	r.cmu.Lock()
	hidden, _, err := r.m.StageStep(ctx, locals, toks, nil)
	pace(r.cfg.TestPace, len(step.Tokens), t0)
	r.cmu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	r.met.stepped(t0, time.Now())
	step.Hidden = hidden
	step.Ticket = r.tickets.Add(1)
	ch, err := r.send(epoch, step.Ticket, step)
	if err != nil {
		for i, sc := range seqs { // what stage 0 computed never left it
			sc.local.Truncate(step.Seqs[i].Pos)
		}
		return 0, nil, err
	}
	return step.Ticket, ch, nil
}

// stepCarried is stepSeqs over the group: the Step goes down the ring
// without hidden states (DTypeGroup) once stage 0's layers are computed,
// and the hidden states follow over the carrier, in the same order as the
// Steps (the engine sends both under the model's lock). On a failure the
// engine has put stage 0's caches back; one that leaves the carrier's
// order unknown loses the group.
func (r *Ring) stepCarried(ctx context.Context, c engine.Carrier, epoch uint64, locals []engine.KVCache, toks [][]int32, step *Step, t0 time.Time) (uint64, chan reply, error) {
	step.DType = DTypeGroup
	var ch chan reply
	r.cmu.Lock()
	_, st, err := r.m.(carried).StageStepCarried(ctx, locals, toks, c, func() error {
		step.Ticket = r.tickets.Add(1)
		var err error
		ch, err = r.send(epoch, step.Ticket, step)
		return err
	})
	pace(r.cfg.TestPace, len(step.Tokens), t0)
	r.cmu.Unlock()
	r.cs.count(st)
	if err != nil {
		if errors.Is(err, engine.ErrCarry) {
			r.down(err)
			r.cs.lose(err)
		}
		if ch != nil {
			r.forget(step.Ticket)
		}
		return 0, nil, err
	}
	r.met.stepped(t0, time.Now())
	return step.Ticket, ch, nil
}

// StartPicking installs req's Picker on the last stage.
func (r *Ring) StartPicking(ctx context.Context, c engine.KVCache, req *gen.Request, st chat.Start, history []int32) error {
	sc, err := r.seq(c)
	if err != nil {
		return err
	}
	var body OpenBody
	body.Request, body.Start.Reasoning, body.History = req, st.Reasoning, history
	b, err := json.Marshal(&body)
	if err != nil {
		return fmt.Errorf("stage: open: %w", err)
	}
	_, err = r.call(ctx, sc.epoch, func(t uint64) any { return Open{Ticket: t, Seq: sc.id, Body: b} })
	return err
}

// ForwardPick runs tokens through the pipeline and returns the token the
// last stage picked after them.
func (r *Ring) ForwardPick(ctx context.Context, c engine.KVCache, tokens []int32) (decode.Picked, error) {
	sc, err := r.seq(c)
	if err != nil {
		return decode.Picked{}, err
	}
	if len(tokens) > 1 { // all but the last position only fill the caches
		if err := r.Prefill(ctx, c, tokens[:len(tokens)-1], 0, nil); err != nil {
			return decode.Picked{}, err
		}
		tokens = tokens[len(tokens)-1:]
	}
	t, ch, err := r.stepSeqs(ctx, []*seqCache{sc}, [][]int32{tokens}, true)
	if err != nil {
		return decode.Picked{}, err
	}
	msg, err := r.wait(ctx, t, ch)
	if err != nil {
		return decode.Picked{}, err
	}
	ps, err := picksOf(msg, []*seqCache{sc})
	if err != nil {
		return decode.Picked{}, err
	}
	return ps[0], nil
}

// ForwardBatchPick runs one decode step of several sequences (one
// micro-batch: the Server's lanes keep the stages busy with each other's
// steps) and returns each one's pick.
func (r *Ring) ForwardBatchPick(ctx context.Context, caches []engine.KVCache, tokens []int32) ([]decode.Picked, error) {
	if len(caches) == 0 || len(caches) != len(tokens) {
		return nil, fmt.Errorf("stage: ForwardBatchPick with %d caches and %d tokens", len(caches), len(tokens))
	}
	seqs := make([]*seqCache, len(caches))
	toks := make([][]int32, len(caches))
	for i, c := range caches {
		sc, err := r.seq(c)
		if err != nil {
			return nil, err
		}
		seqs[i], toks[i] = sc, tokens[i:i+1]
	}
	t, ch, err := r.stepSeqs(ctx, seqs, toks, true)
	if err != nil {
		return nil, err
	}
	msg, err := r.wait(ctx, t, ch)
	if err != nil {
		return nil, err
	}
	return picksOf(msg, seqs)
}

func picksOf(msg any, seqs []*seqCache) ([]decode.Picked, error) {
	p, ok := msg.(Picks)
	if !ok || len(p.Picks) != len(seqs) {
		return nil, fmt.Errorf("%w: the answer to a step of %d sequences is %T", ErrCorrupt, len(seqs), msg)
	}
	out := make([]decode.Picked, len(seqs))
	for i, pk := range p.Picks {
		if pk.Seq != seqs[i].id {
			return nil, fmt.Errorf("%w: pick %d is for sequence %d, not %d", ErrCorrupt, i, pk.Seq, seqs[i].id)
		}
		out[i] = decode.Picked{Tok: pk.Tok, Done: pk.Done, Logprob: pk.Logprob}
	}
	return out, nil
}

// seqCache is one sequence of the pipeline: stage 0's cache and the id
// of the sequence's caches on the later stages. Truncate and Free go down
// the ring in order with the sequence's steps. A sequence from before the
// ring was last rebuilt is stale: its later stages' caches are gone, so
// it can only be reset (to an empty sequence under a new id).
type seqCache struct {
	r     *Ring
	local engine.KVCache
	id    uint64
	epoch uint64 // the ring epoch its later stages' caches belong to (0: none yet)
}

// ready adopts the ring's epoch for a sequence with nothing on the
// later stages yet, and refuses a stale one.
func (c *seqCache) ready() error {
	cur := c.r.currentEpoch()
	switch {
	case cur == 0:
		return c.r.downError()
	case c.epoch == cur:
		return nil
	case c.local.Len() == 0:
		c.epoch = cur
		return nil
	}
	return fmt.Errorf("%w: the sequence began before the ring was rebuilt", ErrDown)
}

func (r *Ring) downError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.downErr != nil {
		return r.downErr
	}
	return ErrDown
}

// reset empties the sequence everywhere, under a new id.
func (c *seqCache) reset() {
	if c.epoch != 0 && c.epoch == c.r.currentEpoch() {
		c.r.sendDrop(c.id)
	}
	c.localTruncate(0)
	c.id, c.epoch = c.r.seqs.Add(1), 0
}

func (c *seqCache) localTruncate(n int) { c.local.Truncate(n) }

func (r *Ring) sendDrop(id uint64) {
	r.mu.Lock()
	out := r.out
	r.mu.Unlock()
	if out != nil {
		out.Send(Drop{Seq: id}) // a failure takes the ring down; nothing else to do
	}
}

func (c *seqCache) Len() int { return c.local.Len() }

func (c *seqCache) Append(layer int, k, v engine.Array) (engine.Array, engine.Array) {
	return c.local.Append(layer, k, v)
}

// CanTruncate asks every stage (one round trip).
func (c *seqCache) CanTruncate(n int) bool {
	if n == 0 {
		return true
	}
	if n > c.local.Len() || !c.local.CanTruncate(n) || c.ready() != nil || c.epoch == 0 {
		return false
	}
	msg, err := c.r.call(context.Background(), c.epoch, func(t uint64) any {
		return Truncate{Ticket: t, Seq: c.id, N: n, OK: true, Len: c.local.Len()}
	})
	tr, ok := msg.(Truncate)
	return err == nil && ok && tr.OK
}

// Truncate truncates every stage's cache to n (or, where a recurrent
// layer must go further back, to the longest length every stage can
// hold); a failure resets the sequence.
func (c *seqCache) Truncate(n int) {
	if n == 0 || c.ready() != nil || c.epoch == 0 {
		c.reset()
		return
	}
	for range 4 {
		if !c.local.CanTruncate(n) {
			break
		}
		c.localTruncate(n)
		n0 := c.local.Len()
		msg, err := c.r.call(context.Background(), c.epoch, func(t uint64) any {
			return Truncate{Ticket: t, Seq: c.id, N: n, Apply: true, OK: true, Len: n0}
		})
		tr, ok := msg.(Truncate)
		if err != nil || !ok || !tr.OK {
			break
		}
		if tr.Len == n {
			return // every stage holds n
		}
		n = tr.Len
		if n == 0 {
			c.reset()
			return
		}
	}
	c.r.log.Warn("stage: a sequence's stages could not agree on a truncation; reset", "seq", c.id)
	c.reset()
}

// Free frees stage 0's cache and the later stages'.
func (c *seqCache) Free() {
	if c.epoch != 0 && c.epoch == c.r.currentEpoch() {
		c.r.sendDrop(c.id)
	}
	c.local.Free()
}

var errNoImport = errors.New("stage: a pipeline's sequences take no imported KV (remote prefill into a pipeline is not supported yet)")

func (c *seqCache) Export(layer, start, n int) ([]byte, []byte, error) { return nil, nil, errNoImport }
func (c *seqCache) Import(layer, start, n int, k, v []byte) error      { return errNoImport }
func (c *seqCache) Commit(n int) error                                 { return errNoImport }
func (c *seqCache) DType() engine.DType                                { return c.local.DType() }
func (c *seqCache) Geometry() engine.CacheGeometry                     { return c.local.Geometry() }

// pace sleeps until a step of n tokens begun at t0 has taken n/rate
// (rate 0: no pacing).
func pace(rate float64, n int, t0 time.Time) {
	if rate > 0 {
		time.Sleep(time.Until(t0.Add(time.Duration(float64(n) / rate * float64(time.Second)))))
	}
}
