// Package pipeline owns a prefill pipeline's stage runtime (PROTOCOL.md
// "Prefill stage link", contract C4): the links between the stages of a
// prefill model split by layers and what flows on them. It drives a
// prefill.Producer per stage (through prefill.StageHook) and must not
// touch the decode side or supervisor/.
//
// A prefill pipeline (PROTOCOL.md "Prefill stage link") splits a prefill
// model's layers over N stage processes, each with its own Producer, KV
// port and prefix cache for its layers. Stage 0 computes a prompt from its
// tokens (for its own requests, or when a later stage asks for it) and
// passes each chunk's hidden states down the stage link; stage k computes
// its layers from them chunk by chunk (chunk i on stage k while chunk i+1
// is on stage k−1) and passes its own output on. Every stage ships its
// layers' KV on the KV-wire connections that asked it for the prompt:
// those that arrive while the computation runs follow it, those that come
// after read the prefix cache, and one that finds neither on a later stage
// registers as waiting (the next computation of its prompt takes it) and
// sends a Want round the ring to stage 0, which computes the prompt again
// from where that stage's cache stops unless a computation the asking
// stage will receive runs or was passed on after the last of that prompt
// it had seen (numbered computations: each stage computes a prompt once). The links form a ring as a decode
// pipeline's do (contract C1): stage k dials stage k+1 and the last stage
// dials stage 0, which carries only Wants.
package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/prefill"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// StageModel is what a prefill pipeline stage needs of its model
// (*engine.Model loaded with engine.LoadOptions.Layers).
type StageModel interface {
	prefill.Model
	Stage() engine.LayerRange
	StageForward(ctx context.Context, c engine.KVCache, tokens []int32, hidden []float32) ([]float32, error)
}

// PipeConfig configures one stage of a prefill pipeline.
type PipeConfig struct {
	Stage, Stages int
	// Listen is where the link from the previous stage (stage 0: from
	// the last) is accepted; Next is the next stage's Listen.
	Listen, Next string
	// Secret, when set, authenticates the links (as the KV wire).
	Secret []byte
	// Listener, when set, is used instead of listening on Listen.
	Listener net.Listener
	Logger   *slog.Logger
	// Group, when set, carries the hidden states over the backend's own
	// group (MLX's ring: stage.MLXGroup) where every stage offers one
	// (Hello flag GROUP, as a decode pipeline's stages agree); nil or not
	// agreed: they go in the stage link's Steps. Its OnLost must end the
	// process (a joined group cannot be joined again).
	Group *stage.Group
	// Fallback, when Group is nil, says why (stage.MLXGroup's Transport):
	// the stage's Transport.
	Fallback stage.Transport
	// Metrics, when set, counts the hidden-state bytes carried over the
	// group in LinkBytes (exo_stage_link_bytes_total, model Name,
	// transport the Group's); the stage link's own frames are not counted.
	Metrics *stage.Metrics
	Name    string
}

// carriedModel is what a stage whose hidden states go over a group needs
// of its model (*engine.Model).
type carriedModel interface {
	SendHidden(c engine.Carrier, hidden []float32, rows int) (int64, error)
	RecvHidden(c engine.Carrier, rows int) ([]float32, int64, error)
}

// Pipe is one stage's end of a prefill pipeline.
type Pipe struct {
	cfg   PipeConfig
	p     *prefill.Producer
	model StageModel
	link  stage.LinkConfig
	last  bool
	ids   atomic.Uint64
	log   *slog.Logger

	origins atomic.Uint64 // stage 0: the last computation number given

	mu     sync.Mutex
	next   *stage.Link // to the next stage, nil while down
	up     *stage.Link // from the previous stage, the newest
	in     map[uint64]*inStream
	got    []origin // a later stage: the computations received, the newest last
	floor  uint64   // a later stage: the highest origin dropped from got
	recent []origin // stage 0: the computations passed on, the newest last

	hooks atomic.Pointer[testHooks] // nil outside tests

	// The group (cfg.Group): offered while offer holds; decided once
	// both links are up (carrier set when joined), then closed.
	offer      atomic.Bool
	decideOnce sync.Once
	decided    chan struct{}
	carrier    engine.Carrier
	lostOnce   sync.Once
	sendMu     sync.Mutex // a carried Step's frame and its transfer, in order
	sent, recv atomic.Int64
	tr         *stage.TransportReport // where the hidden states go, and why
}

// testHooks let a test order what races: beforeOut runs as a later
// stage's computation from upstream starts, before it is passed on;
// wantDone runs once stage 0 has answered a Want (computed: it computed).
type testHooks struct {
	beforeOut func(tokens []int32, origin uint64)
	wantDone  func(computed bool)
}

// origin is a computation stage 0 passed on (or a later stage received):
// its number, prompt and first position.
type origin struct {
	n      uint64
	tokens []int32
	from   int
}

// keepRecent is how many computations stage 0 remembers to answer Wants:
// a Want that names a computation older than these computes again.
const keepRecent = 256

// inStream is one computation flowing in from the previous stage.
type inStream struct {
	tokens []int32
	from   int
	origin uint64
	ch     chan any // *stage.Step, stage.Ack, error
}

// pipeMsg is an Open frame's body on the prefill stage link.
type pipeMsg struct {
	Kind   string  `json:"kind"` // "begin" or "want"
	Tokens []int32 `json:"tokens"`
	From   int     `json:"from"`
	// Origin (begin) is the number stage 0 gave the computation, passed
	// on unchanged by every stage; Seen (want) is the highest Origin of a
	// computation of Tokens the asking stage had received when it asked. Numbers grow (from the
	// clock at stage 0's start, so a restarted stage 0 continues above).
	Origin uint64 `json:"origin,omitempty"`
	Seen   uint64 `json:"seen,omitempty"`
}

// NewPipe makes p a stage of a prefill pipeline over model, which p's
// Options.Model must be. Run starts its links.
func NewPipe(p *prefill.Producer, model StageModel, cfg PipeConfig) (*Pipe, error) {
	if cfg.Stages < 2 || cfg.Stage < 0 || cfg.Stage >= cfg.Stages {
		return nil, fmt.Errorf("prefill pipeline: stage %d of %d", cfg.Stage, cfg.Stages)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	info := model.Info()
	r := model.Stage()
	if r == (engine.LayerRange{}) {
		r = engine.LayerRange{Start: 0, End: info.Layers}
	}
	if r != p.Layers() {
		return nil, fmt.Errorf("prefill pipeline: the producer holds layers %v, the model %v", p.Layers(), r)
	}
	link, err := stage.NewLinkConfig(cfg.Stage, cfg.Stages, r, model, cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("prefill pipeline: %w", err)
	}
	pp := &Pipe{cfg: cfg, p: p, model: model, last: cfg.Stage == cfg.Stages-1, in: map[uint64]*inStream{},
		log: cfg.Logger.With("prefill_stage", fmt.Sprintf("%d/%d", cfg.Stage, cfg.Stages)), link: link}
	pp.origins.Store(uint64(time.Now().UnixNano()))
	pp.decided = make(chan struct{})
	if cfg.Group != nil {
		if _, ok := model.(carriedModel); !ok {
			return nil, fmt.Errorf("prefill pipeline: a Group needs a model that carries hidden states (%T does not)", model)
		}
	}
	offer, t, err := stage.OfferGroup(cfg.Group, cfg.Stages, cfg.Fallback)
	if err != nil {
		return nil, fmt.Errorf("prefill pipeline: %w", err)
	}
	if cfg.Group != nil && !offer {
		pp.log.Warn("prefill pipeline: hidden states stay on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail, "transport", cfg.Group.Transport)
	}
	pp.tr = stage.NewTransportReport(cfg.Metrics, cfg.Name, cfg.Stage, t)
	pp.offer.Store(offer)
	pp.link.Offer = pp.offer.Load
	p.SetStage(pp)
	return pp, nil
}

// Carried is the hidden-state bytes this stage sent and received over its
// group (0 while they go over the stage link).
func (pp *Pipe) Carried() (sent, received int64) { return pp.sent.Load(), pp.recv.Load() }

// Transport is where the hidden states go (the group's transport once
// joined, "tcp" on the stage link, "pending" while undecided), and why
// not over the group when they stay on the stage link.
func (pp *Pipe) Transport() stage.Transport { return pp.tr.Get() }

// decide runs once both links are up, the first time: it joins the group
// when this stage and both neighbours offered it, or settles on the stage
// link for the life of the process. A join that fails or does not finish
// within the Group's JoinTimeout loses the group.
func (pp *Pipe) decide(ctx context.Context, up, next *stage.Link) {
	pp.decideOnce.Do(func() {
		go func() {
			c, err := pp.join(ctx, up, next)
			pp.carrier = c
			close(pp.decided)
			if err != nil {
				pp.lose(err)
			}
		}()
	})
}

func (pp *Pipe) join(ctx context.Context, up, next *stage.Link) (engine.Carrier, error) {
	g := pp.cfg.Group
	if g == nil || !pp.offer.Load() {
		return nil, nil
	}
	c, t, err := stage.JoinAgreed(ctx, g, up, next, pp.log)
	if err != nil {
		return nil, err
	}
	if c == nil {
		pp.offer.Store(false) // for the life of the process
	}
	pp.tr.Set(t)
	return c, nil
}

// joined is the carrier once the group is joined (nil otherwise).
func (pp *Pipe) joined() engine.Carrier {
	select {
	case <-pp.decided:
		return pp.carrier
	default:
		return nil
	}
}

// lose reports a lost group once (the Group's OnLost ends the process).
func (pp *Pipe) lose(err error) {
	if pp.cfg.Group == nil {
		return
	}
	if !errors.Is(err, stage.ErrGroupLost) {
		err = fmt.Errorf("%w: %w", stage.ErrGroupLost, err)
	}
	pp.lostOnce.Do(func() {
		pp.log.Error("prefill pipeline: the stages' group is lost; this runner must restart with every stage", "err", err)
		pp.cfg.Group.OnLost(err)
	})
}

// pair is both links when both are up.
func (pp *Pipe) pair() (up, next *stage.Link) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.up == nil || pp.next == nil {
		return nil, nil
	}
	return pp.up, pp.next
}

// linked decides on the group once both links are up.
func (pp *Pipe) linked(ctx context.Context) {
	if up, next := pp.pair(); up != nil {
		pp.decide(ctx, up, next)
	}
}

// SetListener makes Run accept on l instead of listening on Listen.
func (pp *Pipe) SetListener(l net.Listener) { pp.cfg.Listener = l }

// Run accepts the link from the previous stage and keeps the one to the
// next dialled until ctx ends.
func (pp *Pipe) Run(ctx context.Context) error {
	l := pp.cfg.Listener
	if l == nil {
		var err error
		if l, err = net.Listen("tcp", pp.cfg.Listen); err != nil {
			return fmt.Errorf("prefill pipeline: listen %s: %w", pp.cfg.Listen, err)
		}
	}
	context.AfterFunc(ctx, func() { l.Close() })
	go pp.dialLoop(ctx)
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("prefill pipeline: accept: %w", err)
		}
		go func() {
			link, err := stage.Accept(conn, pp.link)
			if err != nil {
				pp.log.Warn("prefill stage link refused", "err", err)
				return
			}
			pp.serveUp(ctx, link)
		}()
	}
}

// Up reports whether both of this stage's links are up.
func (pp *Pipe) Up() bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.next != nil && pp.up != nil
}

func (pp *Pipe) dialLoop(ctx context.Context) {
	wait := 50 * time.Millisecond
	for ctx.Err() == nil {
		link, err := stage.Dial(ctx, pp.cfg.Next, pp.link)
		if err != nil {
			pp.log.Debug("prefill stage link: dial", "next", pp.cfg.Next, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, time.Second)
			continue
		}
		wait = 50 * time.Millisecond
		pp.mu.Lock()
		pp.next = link
		pp.mu.Unlock()
		pp.log.Info("prefill stage link to the next stage up", "next", pp.cfg.Next)
		pp.linked(ctx)
		// Nothing comes back on it; Recv notices when it closes.
		go func() {
			for {
				if _, err := link.Recv(); err != nil {
					return
				}
			}
		}()
		select {
		case <-ctx.Done():
			link.Close(ctx.Err())
		case <-link.Done():
		}
		pp.mu.Lock()
		if pp.next == link {
			pp.next = nil
		}
		pp.mu.Unlock()
		pp.p.StageChanged()
		pp.log.Warn("prefill stage link to the next stage down", "err", link.Err())
		if pp.joined() != nil && ctx.Err() == nil {
			pp.lose(fmt.Errorf("the link to the next stage was lost: %w", link.Err()))
			return
		}
	}
}

// send puts msg on the link to the next stage.
func (pp *Pipe) send(msg any) error {
	pp.mu.Lock()
	next := pp.next
	pp.mu.Unlock()
	if next == nil {
		return fmt.Errorf("%w: prefill stage %d: the link to stage %d is down", stage.ErrDown, pp.cfg.Stage, (pp.cfg.Stage+1)%pp.cfg.Stages)
	}
	return next.Send(msg)
}

// serveUp reads the link from the previous stage (the newest one wins).
func (pp *Pipe) serveUp(ctx context.Context, link *stage.Link) {
	pp.mu.Lock()
	old := pp.up
	pp.up = link
	pp.mu.Unlock()
	if old != nil {
		old.Close(fmt.Errorf("%w: a newer link replaced it", stage.ErrDown))
	}
	pp.linked(ctx)
	stop := context.AfterFunc(ctx, func() { link.Close(ctx.Err()) })
	defer stop()
	var mine []uint64 // the streams this link opened
	defer func() {
		err := link.Err()
		pp.mu.Lock()
		if pp.up == link {
			pp.up = nil
		}
		var lost []*inStream
		for _, id := range mine {
			if s := pp.in[id]; s != nil {
				lost = append(lost, s)
				delete(pp.in, id)
			}
		}
		pp.mu.Unlock()
		pp.p.StageChanged()
		if pp.joined() != nil && ctx.Err() == nil {
			pp.lose(fmt.Errorf("the link from the previous stage was lost: %w", err))
		}
		for _, s := range lost {
			s.ch <- fmt.Errorf("%w: prefill stage %d lost the link from stage %d: %v", kvwire.ErrRemoteInternal, pp.cfg.Stage, pp.cfg.Stage-1, err)
		}
	}()
	for {
		msg, err := link.Recv()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case stage.Open:
			b, err := parseMsg(m.Body, pp.model.Info().Vocab)
			if err != nil {
				link.Close(err)
				return
			}
			switch {
			case b.Kind == "want" && pp.cfg.Stage == 0:
				go pp.wanted(ctx, b.Tokens, b.From, b.Seen)
			case b.Kind == "want":
				if err := pp.send(m); err != nil {
					pp.log.Warn("prefill stage link: a Want could not go on", "err", err)
				}
			case b.Kind == "begin" && pp.cfg.Stage > 0:
				s := &inStream{tokens: b.Tokens, from: b.From, origin: b.Origin, ch: make(chan any, 4)}
				// The computation opens here, before the next frame is
				// read and before seen counts it: a request that asks
				// stage 0 after seen names it found it open (or ended).
				var c *prefill.Computation
				if have := pp.p.Cached(s.tokens, s.from); have >= s.from {
					c = pp.p.Open(s.tokens, s.from)
				}
				pp.mu.Lock()
				pp.in[m.Ticket] = s
				pp.received(origin{n: b.Origin, tokens: b.Tokens, from: b.From})
				pp.mu.Unlock()
				mine = append(mine, m.Ticket)
				go pp.driveFrom(ctx, s, c)
			default:
				link.Close(fmt.Errorf("%w: prefill stage message %q on stage %d", stage.ErrCorrupt, b.Kind, pp.cfg.Stage))
				return
			}
		case *stage.Step:
			if m.DType == stage.DTypeGroup {
				if err := pp.recvCarried(ctx, m); err != nil {
					link.Close(err)
					pp.lose(err)
					return
				}
			}
			if s := pp.stream(m.Ticket, false); s != nil {
				s.ch <- m
			}
		case stage.Ack:
			if s := pp.stream(m.Ticket, true); s != nil {
				s.ch <- m
			}
		case stage.ErrorFrame:
			if s := pp.stream(m.Ticket, true); s != nil {
				s.ch <- fmt.Errorf("%w: prefill stage %d upstream: %s", kvwire.ErrRemoteInternal, pp.cfg.Stage-1, m.Reason)
			}
		}
	}
}

// parseMsg decodes and checks an Open frame's body: a known kind, at
// least two tokens inside the vocabulary, from inside the prompt.
func parseMsg(body []byte, vocab int) (pipeMsg, error) {
	var b pipeMsg
	if err := json.Unmarshal(body, &b); err != nil {
		return b, fmt.Errorf("%w: a prefill stage message: %v", stage.ErrCorrupt, err)
	}
	switch {
	case b.Kind != "begin" && b.Kind != "want":
		return b, fmt.Errorf("%w: a prefill stage message of kind %q", stage.ErrCorrupt, b.Kind)
	case len(b.Tokens) < 2 || slices.ContainsFunc(b.Tokens, func(x int32) bool { return x < 0 || int(x) >= vocab }):
		return b, fmt.Errorf("%w: a prefill stage message's %d tokens (at least 2, inside a vocabulary of %d)", stage.ErrCorrupt, len(b.Tokens), vocab)
	case b.From < 0 || b.From >= len(b.Tokens):
		return b, fmt.Errorf("%w: a prefill stage message from %d of %d tokens", stage.ErrCorrupt, b.From, len(b.Tokens))
	}
	return b, nil
}

// stream is the open stream id (removed with done).
func (pp *Pipe) stream(id uint64, done bool) *inStream {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	s := pp.in[id]
	if done {
		delete(pp.in, id)
	}
	return s
}

// outStream is a computation this stage passes on to the next.
type outStream struct {
	pp  *Pipe
	id  uint64
	err error // the first send failure: nothing more goes on
}

// openOut tells the next stage a computation of tokens from from begins.
// A stage that cannot reach the next computes for its own requests all
// the same.
func (pp *Pipe) openOut(tokens []int32, from int, orig uint64) *outStream {
	o := &outStream{pp: pp, id: uint64(pp.cfg.Stage)<<48 | pp.ids.Add(1)}
	body, _ := json.Marshal(pipeMsg{Kind: "begin", Tokens: tokens, From: from, Origin: orig})
	o.err = pp.send(stage.Open{Ticket: o.id, Body: body})
	if o.err != nil {
		pp.log.Warn("prefill stage link: the next stage will not get this computation", "err", o.err)
	}
	return o
}

func (o *outStream) step(pos int, tokens []int32, hidden []float32) {
	if o.err != nil {
		return
	}
	if c := o.pp.joined(); c != nil {
		o.stepCarried(c, pos, tokens, hidden)
		return
	}
	o.err = o.pp.send(&stage.Step{Ticket: o.id, DType: stage.DTypeF32,
		Seqs: []stage.StepSeq{{Seq: o.id, Pos: pos, N: len(tokens)}}, Tokens: tokens, Hidden: hidden})
	if o.err != nil {
		o.pp.log.Warn("prefill stage link: the next stage will not get the rest of this computation", "err", o.err)
	}
}

// stepCarried sends a chunk's Step without its hidden states (DTypeGroup)
// and then the hidden states over the group, both under sendMu so that the
// next stage receives them in its Steps' order. A failed transfer loses
// the group.
func (o *outStream) stepCarried(c engine.Carrier, pos int, tokens []int32, hidden []float32) {
	pp := o.pp
	pp.sendMu.Lock()
	defer pp.sendMu.Unlock()
	o.err = pp.send(&stage.Step{Ticket: o.id, DType: stage.DTypeGroup,
		Seqs: []stage.StepSeq{{Seq: o.id, Pos: pos, N: len(tokens)}}, Tokens: tokens})
	if o.err != nil {
		pp.log.Warn("prefill stage link: the next stage will not get the rest of this computation", "err", o.err)
		return
	}
	n, err := pp.model.(carriedModel).SendHidden(c, hidden, len(tokens))
	if err != nil {
		o.err = err
		pp.lose(fmt.Errorf("send a chunk's hidden states: %w", err))
		return
	}
	pp.sent.Add(n)
	pp.count("sent", n)
}

// count adds carried bytes to the metrics (Metrics).
func (pp *Pipe) count(dir string, n int64) {
	if m := pp.cfg.Metrics; m != nil {
		m.LinkBytes.WithLabelValues(pp.cfg.Name, fmt.Sprint(pp.cfg.Stage), dir, pp.cfg.Group.Transport).Add(float64(n))
	}
}

// recvCarried receives a carried Step's hidden states off the group, in
// the order its Steps arrive (whether or not a computation takes them), so
// that the next receive is the next Step's. It waits for this stage's
// decision (bounded by the join's) and fails where the stage did not join.
func (pp *Pipe) recvCarried(ctx context.Context, m *stage.Step) error {
	if pp.cfg.Group == nil {
		return fmt.Errorf("%w: a step whose hidden states go over the group on a stage without one", stage.ErrCorrupt)
	}
	t := time.NewTimer(pp.cfg.Group.JoinTimeout)
	defer t.Stop()
	select {
	case <-pp.decided:
	case <-t.C:
		return fmt.Errorf("%w: a carried step came and this stage did not decide on the group within %v", stage.ErrGroupLost, pp.cfg.Group.JoinTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	c := pp.carrier
	if c == nil {
		return fmt.Errorf("%w: a step whose hidden states go over the group on a stage that did not join it", stage.ErrCorrupt)
	}
	if len(m.Seqs) != 1 || m.Seqs[0].N != len(m.Tokens) || len(m.Tokens) == 0 {
		return fmt.Errorf("%w: a carried prefill step of %d seqs and %d tokens", stage.ErrCorrupt, len(m.Seqs), len(m.Tokens))
	}
	h, n, err := pp.model.(carriedModel).RecvHidden(c, len(m.Tokens))
	if err != nil {
		return fmt.Errorf("%w: receive a chunk's hidden states: %w", stage.ErrGroupLost, err)
	}
	pp.recv.Add(n)
	pp.count("received", n)
	m.Hidden = h
	return nil
}

func (o *outStream) finish(err error) {
	if o.err != nil {
		return
	}
	if err == nil {
		o.err = o.pp.send(stage.Ack{Ticket: o.id})
		return
	}
	reason := err.Error()
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	o.err = o.pp.send(stage.ErrorFrame{Ticket: o.id, Code: stage.CodeInternal, Reason: reason})
}

// Later implements prefill.StageHook.
func (pp *Pipe) Later() bool { return pp.cfg.Stage > 0 }

// Stage implements prefill.StageHook.
func (pp *Pipe) Stage() string {
	return fmt.Sprintf("prefill stage %d/%d", pp.cfg.Stage, pp.cfg.Stages)
}

// Compute implements prefill.StageHook: stage 0's computation: its layers from the tokens, each
// chunk's hidden states passed on before its KV is shipped.
func (pp *Pipe) Compute(ctx context.Context, c engine.KVCache, prompt []int32, from, end int, onChunk func(int, int) error) (err error) {
	orig := pp.origins.Add(1)
	pp.mu.Lock()
	pp.recent = append(pp.recent, origin{n: orig, tokens: prompt[:end+1], from: from})
	if len(pp.recent) > keepRecent {
		pp.recent = slices.Delete(pp.recent, 0, len(pp.recent)-keepRecent)
	}
	pp.mu.Unlock()
	out := pp.openOut(prompt[:end+1], from, orig)
	defer func() { out.finish(err) }()
	chunk := pp.p.Chunk()
	for s := from; s < end; s += chunk {
		n := min(chunk, end-s)
		h, err := pp.model.StageForward(ctx, c, prompt[s:s+n], nil)
		if err != nil {
			return err
		}
		out.step(s, prompt[s:s+n], h)
		if err := onChunk(s, n); err != nil {
			return err
		}
	}
	return nil
}

// wanted is stage 0's answer to a Want: compute tokens again from at
// most from (the asking stage's cached prefix), unless a computation of
// them from there runs now or was passed on after the last the asking
// stage had received when it asked (seen): that one reaches it, and the
// request waiting there follows it.
func (pp *Pipe) wanted(ctx context.Context, tokens []int32, from int, seen uint64) {
	passed := func() bool {
		pp.mu.Lock()
		defer pp.mu.Unlock()
		for _, o := range pp.recent {
			if o.n > seen && o.from <= from && slices.Equal(o.tokens, tokens) {
				return true
			}
		}
		return false
	}
	computed, err := pp.p.DriveUnless(ctx, tokens, from, pp.Compute, passed)
	if err != nil {
		pp.log.Warn("prefill stage 0: a computation a later stage asked for failed", "tokens", len(tokens), "err", err)
	}
	if !computed {
		pp.log.Debug("prefill stage 0: a Want is answered by a computation already passed on", "tokens", len(tokens), "from", from)
	}
	if h := pp.hooks.Load(); h != nil && h.wantDone != nil {
		h.wantDone(computed)
	}
}

// driveFrom runs a computation the previous stage passes on (c, opened as
// its begin was read): this stage's layers from its hidden states, passed
// on in turn, for the requests that follow it and the prefix cache. A
// stage whose prefix cache lacks the positions before the stream's first
// (c nil) drains it and asks stage 0 for them again.
func (pp *Pipe) driveFrom(ctx context.Context, s *inStream, c *prefill.Computation) {
	if c == nil {
		go drain(ctx, s)
		if err := pp.Want(s.tokens, pp.p.Cached(s.tokens, s.from)); err != nil {
			pp.log.Warn("prefill stage: could not ask stage 0 again", "err", err)
		}
		return
	}
	opened := false // the computation went on to the next stage
	compute := func(ctx context.Context, c engine.KVCache, prompt []int32, from, end int, onChunk func(int, int) error) (err error) {
		var out *outStream
		if h := pp.hooks.Load(); h != nil && h.beforeOut != nil {
			h.beforeOut(s.tokens, s.origin)
		}
		if !pp.last {
			out = pp.openOut(prompt[:end+1], from, s.origin)
			opened = true
			defer func() { out.finish(err) }()
		}
		D := pp.model.Info().Hidden
		for {
			var msg any
			select {
			case msg = <-s.ch:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			switch m := msg.(type) {
			case error:
				return m
			case stage.Ack:
				if c.Len() != end {
					return fmt.Errorf("%w: the upstream computation ended at %d of %d", kvwire.ErrRemoteInternal, c.Len(), end)
				}
				return nil
			case *stage.Step:
				pos, n := m.Seqs[0].Pos, m.Seqs[0].N
				if len(m.Seqs) != 1 || pos+n > end || pos > c.Len() || !slices.Equal(m.Tokens, prompt[pos:pos+n]) {
					return fmt.Errorf("%w: an upstream chunk [%d,+%d) does not continue [0,%d) of the prompt", kvwire.ErrRemoteInternal, pos, n, c.Len())
				}
				skip := c.Len() - pos
				if skip >= n {
					continue
				}
				h, err := pp.model.StageForward(ctx, c, prompt[pos+skip:pos+n], m.Hidden[skip*D:])
				if err != nil {
					return err
				}
				if out != nil {
					out.step(pos+skip, prompt[pos+skip:pos+n], h)
				}
				if err := onChunk(pos+skip, n-skip); err != nil {
					return err
				}
			}
		}
	}
	if err := c.Run(ctx, compute); err != nil {
		pp.log.Warn("prefill stage: a computation from upstream failed", "tokens", len(s.tokens), "err", err)
		go drain(ctx, s)
		if !opened && !pp.last {
			// The stages downstream wait for this computation (their
			// Wants were answered with it): tell them it failed.
			pp.openOut(s.tokens, s.from, s.origin).finish(err)
		}
	}
}

// drain reads s to its end so the link's reader never blocks on it.
func drain(ctx context.Context, s *inStream) {
	for {
		select {
		case m := <-s.ch:
			if _, ok := m.(*stage.Step); !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// received remembers a computation a later stage received (pp.mu held):
// the last keepRecent, and the highest origin of those it forgot.
func (pp *Pipe) received(o origin) {
	pp.got = append(pp.got, o)
	if len(pp.got) > keepRecent {
		for _, x := range pp.got[:len(pp.got)-keepRecent] {
			pp.floor = max(pp.floor, x.n)
		}
		pp.got = slices.Delete(pp.got, 0, len(pp.got)-keepRecent)
	}
}

// seenOf is the highest origin of a computation of tokens this stage has
// received (at least the floor of those it forgot). It is per prompt, not
// the highest of any: the stages between stage 0 and this one pass
// computations on from goroutines of their own, so two prompts' begins can
// cross on the way (B's, numbered after A's, arriving first); a Want for
// A naming B's number would make stage 0 compute A again although A's
// computation is still on its way here.
func (pp *Pipe) seenOf(tokens []int32) uint64 {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	seen := pp.floor
	for _, o := range pp.got {
		if o.n > seen && slices.Equal(o.tokens, tokens) {
			seen = o.n
		}
	}
	return seen
}

// Want implements prefill.StageHook: it asks stage 0, round the ring, to
// compute tokens from at most from, naming the newest computation of
// tokens this stage has received (a request registered before asking
// follows any that arrives after).
func (pp *Pipe) Want(tokens []int32, from int) error {
	seen := pp.seenOf(tokens)
	body, _ := json.Marshal(pipeMsg{Kind: "want", Tokens: tokens, From: from, Seen: seen})
	return pp.send(stage.Open{Ticket: uint64(pp.cfg.Stage)<<48 | pp.ids.Add(1), Body: body})
}
