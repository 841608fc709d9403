package stage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// NodeConfig configures the runner of a stage after the first.
type NodeConfig struct {
	Name  string     // served model name (metrics, logs)
	Link  LinkConfig // this stage (Stage ≥ 1)
	Model Layers     // the stage's layers: an engine model or its tensor group
	// Health: as RingConfig.Health.
	Health func() error
	// Listen takes the link from the previous stage; Next is the next
	// stage's --stage-listen (stage 0's on the last stage).
	Listen net.Listener
	Next   string
	// Picks, on the last stage, are the Options the request Pickers are
	// built from (decode.NewSetup's, as on a one-process decode runner).
	Picks *decode.Options
	// DType is the hidden states' dtype on the link (DTypeF32 default).
	DType uint8
	// Remote, when set, fetches this stage's layers of a prompt from a
	// prefill runner (a decode.KVRemote over the stage's model, which asks
	// for its layer range only) when stage 0 fills a sequence remotely.
	Remote decode.Remote
	// RemoteFor, when Remote is nil, makes the client of the prefill
	// runner a Fill names (stage 0's endpoint: a stage given no --prefill
	// of its own still fetches its layers; the KV wire authenticates the
	// runner with the cluster secret). Made once per endpoint.
	RemoteFor func(endpoint string) decode.Remote
	Metrics   *Metrics
	Logger    *slog.Logger
	// TestPace, TEST ONLY: as RingConfig.TestPace.
	TestPace float64
	// Group, Fallback: as RingConfig's.
	Group    *Group
	Fallback Transport
}

// Node is a stage after the first: it computes its layers for every Step
// and passes the hidden states on; the last stage picks the tokens and
// sends them back to stage 0.
type Node struct {
	cfg  NodeConfig
	last bool
	met  *stageMetrics
	log  *slog.Logger
	up   atomic.Bool
	cs   *carry

	caches  map[uint64]engine.KVCache
	pickers map[uint64]*decode.Picker
	remotes map[string]decode.Remote // RemoteFor's clients, by endpoint
}

// NewNode checks cfg and makes the stage's runner.
func NewNode(cfg NodeConfig) (*Node, error) {
	l := &cfg.Link
	switch {
	case l.Stages < 2 || l.Stage < 1 || l.Stage >= l.Stages:
		return nil, fmt.Errorf("stage: a node is stage 1 to %d of %d, not %d", l.Stages-1, l.Stages, l.Stage)
	case cfg.Model == nil || cfg.Listen == nil || cfg.Next == "":
		return nil, errors.New("stage: a node needs its model, a listener and the next stage's address")
	}
	if err := checkCarried(cfg.Group, cfg.Model); err != nil {
		return nil, err
	}
	last := l.Stage == l.Stages-1
	if last && cfg.Picks == nil {
		return nil, errors.New("stage: the last stage needs the Options its Pickers are built from")
	}
	if cfg.DType == 0 {
		cfg.DType = DTypeF32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l.defaults()
	n := &Node{cfg: cfg, last: last, log: cfg.Logger.With("stage", l.Stage), met: cfg.Metrics.bind(cfg.Name, l.Stage)}
	n.cfg.Link.Count = n.met.count
	n.cfg.Link.Wrote = func(d time.Duration) { n.met.link.Add(d.Seconds()) }
	cs, err := newCarry(cfg.Group, cfg.Fallback, l.Stages, n.met, n.log)
	if err != nil {
		return nil, err
	}
	n.cs = cs
	n.cfg.Link.Offer = cs.offered
	return n, nil
}

// Transport is where the stage's hidden states go, and why not over its
// group when they stay on the stage link.
func (n *Node) Transport() Transport { return n.cs.transport() }

// Healthy: both of the stage's links are up.
func (n *Node) Healthy() bool { return n.up.Load() }

// Run serves the stage until ctx ends: it dials the next stage (again
// after every failure, with backoff) and serves the previous stage's
// link over it. A failure downstream closes the upstream link too, so it
// travels back to stage 0 (which rebuilds the ring); a failure upstream
// only frees this stage's sequences and waits for a new link, so a
// failure does not circle the ring.
func (n *Node) Run(ctx context.Context) error {
	accepted := acceptLinks(ctx, n.cfg.Listen, n.cfg.Link, n.log)
	for ctx.Err() == nil {
		if err := awaitHealth(ctx, n.cfg.Health, n.log); err != nil {
			return nil // ctx ended
		}
		out, err := dialLoop(ctx, n.cfg.Next, n.cfg.Link, n.log)
		if err != nil {
			return nil // ctx ended
		}
		go drainBack(out)
		for ctx.Err() == nil {
			in := newest(ctx, accepted, out.Done())
			if in == nil {
				break
			}
			if _, err := n.cs.decide(ctx, in, out); err != nil {
				in.Close(err)
				out.Close(err)
				n.cs.lose(err)
				return err
			}
			n.reset()
			n.up.Store(true)
			n.log.Info("stage links up", "from_stage", in.Peer.Stage, "to_stage", out.Peer.Stage)
			err := n.serve(ctx, in, out)
			n.up.Store(false)
			in.Close(err)
			if n.cs.joined() {
				// The group cannot be joined again (and a step may be
				// stuck in a receive): every stage restarts.
				out.Close(err)
				if ctx.Err() == nil {
					n.cs.lose(err)
				}
				return fmt.Errorf("%w: %w", ErrGroupLost, err)
			}
			n.reset()
			if ctx.Err() == nil {
				n.log.Warn("stage link down; every sequence freed", "err", err)
			}
			if out.Err() != nil || n.cfg.Health != nil && n.cfg.Health() != nil {
				break // dial again (once the stage's group is whole)
			}
		}
		out.Close(ctx.Err())
	}
	return nil
}

// drainBack reads a downstream link's back channel (keepalives; an Error
// frame or a read failure closes the link).
func drainBack(out *Link) {
	for {
		msg, err := out.Recv()
		if err != nil {
			return
		}
		if e, ok := msg.(ErrorFrame); ok {
			out.Close(remoteError(e.Code, e.Reason))
			return
		}
	}
}

// newest waits for an accepted link and returns the newest one waiting
// (closing older ones: their senders have dialled again since); nil when
// ctx or stop ends first.
func newest(ctx context.Context, accepted <-chan *Link, stop <-chan struct{}) *Link {
	var in *Link
	select {
	case in = <-accepted:
	case <-stop:
		return nil
	case <-ctx.Done():
		return nil
	}
	for {
		select {
		case l := <-accepted:
			in.Close(errors.New("stage link: replaced by a newer link"))
			in = l
		default:
			return in
		}
	}
}

func (n *Node) reset() {
	for _, c := range n.caches {
		c.Free()
	}
	for _, p := range n.pickers {
		p.Close()
	}
	n.caches, n.pickers = map[uint64]engine.KVCache{}, map[uint64]*decode.Picker{}
}

// acceptLinks accepts and handshakes previous stages' links in the
// background, handing each on.
func acceptLinks(ctx context.Context, l net.Listener, cfg LinkConfig, log *slog.Logger) <-chan *Link {
	ch := make(chan *Link)
	context.AfterFunc(ctx, func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				if ctx.Err() == nil {
					log.Error("stage link: accept", "err", err)
				}
				return
			}
			go func() {
				lk, err := Accept(conn, cfg)
				if err != nil {
					log.Warn("stage link refused", "err", err)
					return
				}
				select {
				case ch <- lk:
				case <-ctx.Done():
					lk.Close(ctx.Err())
				}
			}()
		}
	}()
	return ch
}

// dialLoop dials addr until it answers (backoff to 1 s) or ctx ends.
func dialLoop(ctx context.Context, addr string, cfg LinkConfig, log *slog.Logger) (*Link, error) {
	wait := 50 * time.Millisecond
	for i := 0; ; i++ {
		l, err := Dial(ctx, addr, cfg)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if i%20 == 0 || errors.Is(err, ErrAuth) || errors.Is(err, ErrMismatch) || errors.Is(err, ErrVersion) {
			log.Warn("stage link: dial", "next", addr, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// serve handles in's messages until in fails or out does.
func (n *Node) serve(ctx context.Context, in, out *Link) error {
	stop := context.AfterFunc(ctx, func() { in.Close(ctx.Err()) })
	defer stop()
	go watchHealth(n.cfg.Health, in, out)
	go func() {
		select {
		case <-out.Done():
			in.Close(out.Err())
		case <-in.Done():
		}
		if n.cs.joined() && ctx.Err() == nil {
			// The serving goroutine may be inside a carried receive that
			// never ends now: report the lost group from here.
			err := in.Err()
			if err == nil {
				err = out.Err()
			}
			n.cs.lose(err)
		}
	}()
	for {
		msg, err := in.Recv()
		if err != nil {
			return err
		}
		if err := n.handle(msg, out); err != nil {
			return err
		}
	}
}

// handle runs one message; an error is the downstream link's (the
// failures of a step go down as Error frames).
func (n *Node) handle(msg any, out *Link) error {
	switch m := msg.(type) {
	case Open:
		if !n.last {
			return out.Send(m)
		}
		var body OpenBody
		if err := json.Unmarshal(m.Body, &body); err != nil || body.Request == nil {
			return out.Send(ErrorFrame{Ticket: m.Ticket, Code: CodeBadRequest, Reason: fmt.Sprintf("open: the request does not parse: %v", err)})
		}
		p, err := n.cfg.Picks.NewPicker(body.Request, chat.Start{Reasoning: body.Start.Reasoning}, body.History)
		if err != nil {
			return out.Send(ErrorFrame{Ticket: m.Ticket, Code: CodeBadRequest, Reason: fmt.Sprintf("open: %v", err)})
		}
		if old := n.pickers[m.Seq]; old != nil {
			old.Close()
		}
		n.pickers[m.Seq] = p
		return out.Send(Ack{Ticket: m.Ticket})
	case *Step:
		return n.step(m, out)
	case Truncate:
		c := n.caches[m.Seq]
		l := 0
		if c != nil {
			l = c.Len()
		}
		can := m.N == 0 || (c != nil && m.N <= l && c.CanTruncate(m.N))
		m.OK = m.OK && can
		if m.Apply && m.OK && c != nil {
			c.Truncate(m.N)
			l = c.Len()
		}
		m.Len = min(m.Len, l)
		return out.Send(m)
	case Fill:
		n.fill(&m)
		return out.Send(m)
	case Drop:
		if c := n.caches[m.Seq]; c != nil {
			c.Free()
			delete(n.caches, m.Seq)
		}
		if p := n.pickers[m.Seq]; p != nil {
			p.Close()
			delete(n.pickers, m.Seq)
		}
		if n.last {
			return nil
		}
		return out.Send(m)
	case ErrorFrame:
		if m.Ticket == 0 {
			return remoteError(m.Code, m.Reason)
		}
		return out.Send(m)
	}
	return out.Send(ErrorFrame{Code: CodeBadRequest, Reason: fmt.Sprintf("a %T frame where work belongs", msg)})
}

// step computes a Step and sends its output on (or its picks back).
func (n *Node) step(m *Step, out *Link) error {
	fail := func(code Code, format string, a ...any) error {
		return out.Send(ErrorFrame{Ticket: m.Ticket, Code: code, Reason: fmt.Sprintf("stage %d: ", n.cfg.Link.Stage) + fmt.Sprintf(format, a...)})
	}
	carrier := n.cs.carrier()
	if (carrier != nil) != (m.DType == DTypeGroup) {
		return fmt.Errorf("%w: a step of hidden dtype %d on a stage whose hidden states go over the group: %v", ErrCorrupt, m.DType, carrier != nil)
	}
	pre := fail // a refusal before the step's computation
	if carrier != nil {
		// A step refused before its computation still reads its input
		// off the group, so that the next receive is the next step's.
		pre = func(code Code, format string, a ...any) error {
			if err := n.cfg.Model.(carried).DiscardCarried(len(m.Tokens), carrier); err != nil {
				return err
			}
			return fail(code, format, a...)
		}
	}
	caches := make([]engine.KVCache, len(m.Seqs))
	toks := make([][]int32, len(m.Seqs))
	o := 0
	for i, s := range m.Seqs {
		c := n.caches[s.Seq]
		if c == nil {
			c = n.cfg.Model.NewCache()
			n.caches[s.Seq] = c
		}
		for _, d := range caches[:i] {
			if d == c {
				return pre(CodeBadRequest, "sequence %d twice in one step", s.Seq)
			}
		}
		if c.Len() != s.Pos {
			return pre(CodeBadRequest, "sequence %d's chunk continues position %d; this stage holds %d", s.Seq, s.Pos, c.Len())
		}
		if s.Pick && n.last && n.pickers[s.Seq] == nil {
			return pre(CodeBadRequest, "sequence %d has no picker (no Open)", s.Seq)
		}
		caches[i], toks[i] = c, m.Tokens[o:o+s.N]
		o += s.N
	}
	n.met.inFlight.Set(1)
	t0 := time.Now()
	var hidden []float32
	var logits [][]float32
	var err error
	if carrier != nil {
		var ready func() error
		if !n.last {
			ready = func() error {
				return out.Send(&Step{Ticket: m.Ticket, DType: DTypeGroup, Seqs: m.Seqs, Tokens: m.Tokens})
			}
		}
		var st engine.CarryStats
		logits, st, err = n.cfg.Model.(carried).StageStepCarried(context.Background(), caches, toks, carrier, ready)
		n.cs.count(st)
		pace(n.cfg.TestPace, len(m.Tokens), t0)
		if err != nil && (errors.Is(err, engine.ErrCarry) || out.Err() != nil) {
			n.met.inFlight.Set(0)
			return err // the group is lost (serve's end says so)
		}
		if err == nil && !n.last {
			n.met.stepped(t0, time.Now())
			n.met.inFlight.Set(0)
			return nil // the Step went down in ready
		}
	} else {
		hidden, logits, err = n.cfg.Model.StageStep(context.Background(), caches, toks, m.Hidden)
		pace(n.cfg.TestPace, len(m.Tokens), t0)
	}
	if err != nil {
		n.met.inFlight.Set(0)
		return fail(CodeInternal, "step: %v", err) // the engine drained a carried step's input
	}
	var picks Picks
	if n.last {
		picks.Ticket = m.Ticket
		for i, s := range m.Seqs {
			if !s.Pick {
				continue
			}
			pk, err := n.pickers[s.Seq].Pick(logits[i])
			if err != nil {
				n.met.inFlight.Set(0)
				return fail(CodeInternal, "sequence %d: %v", s.Seq, err)
			}
			picks.Picks = append(picks.Picks, Pick{Seq: s.Seq, Tok: pk.Tok, Done: pk.Done, Logprob: pk.Logprob})
		}
	}
	n.met.stepped(t0, time.Now())
	n.met.inFlight.Set(0)
	if n.last {
		return out.Send(picks)
	}
	return out.Send(&Step{Ticket: m.Ticket, DType: n.cfg.DType, Seqs: m.Seqs, Tokens: m.Tokens, Hidden: hidden})
}

// fill fetches this stage's share of a remote prefill into the
// sequence's cache (m.OK already false: another stage failed, nothing to
// do). On failure the cache is back where it was (KVRemote's injection is
// transactional) and m.OK goes false.
func (n *Node) fill(m *Fill) {
	c := n.caches[m.Seq]
	if c == nil {
		c = n.cfg.Model.NewCache()
		n.caches[m.Seq] = c
	}
	remote := n.cfg.Remote
	if remote == nil && n.cfg.RemoteFor != nil && m.OK {
		if remote = n.remotes[m.Endpoint]; remote == nil {
			if n.remotes == nil {
				n.remotes = map[string]decode.Remote{}
			}
			remote = n.cfg.RemoteFor(m.Endpoint)
			n.remotes[m.Endpoint] = remote
		}
	}
	if m.OK && (remote == nil || c.Len() != m.Start) {
		n.log.Warn("stage: remote fill refused", "seq", m.Seq, "start", m.Start, "holds", c.Len(), "has_remote", remote != nil)
		m.OK = false
	}
	if m.OK {
		ctx, cancel := context.WithTimeout(context.Background(), fillFetchTimeout)
		st, err := remote.Prefill(ctx, m.ID, m.Tokens, m.Start, c, []string{m.Endpoint})
		cancel()
		if err != nil {
			n.log.Warn("stage: remote fill failed", "seq", m.Seq, "req", m.ID, "endpoint", m.Endpoint, "err", err)
			m.OK = false
		} else {
			m.Bytes += st.Bytes
			n.log.Info("stage: remote fill", "seq", m.Seq, "req", m.ID, "endpoint", st.Endpoint, "bytes", st.Bytes, "duration", st.Duration)
		}
	}
	m.Len = min(m.Len, c.Len())
}
