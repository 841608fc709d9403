package tensor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// ErrGroup is wrapped by the refusals of a call while the group is not
// whole (a rank has not joined yet, or was lost and has not rejoined).
var ErrGroup = gen.Unavailable("tensor group incomplete")

// ErrCacheLost is wrapped by a call on a sequence whose cache the group
// dropped when it was restarted (a rank was lost): the sequence must start
// over from an empty cache.
var ErrCacheLost = gen.Unavailable("tensor: the sequence's cache was lost when the group restarted")

// errStopping is why the group of a rank 0 that stops ends.
var errStopping = errors.New("rank 0 is stopping")

// DefaultTimeout bounds how long rank 0 waits for a follower's next frame
// within a call (an all_sum operand or the call's ack).
const DefaultTimeout = 60 * time.Second

// LeaderConfig configures rank 0.
type LeaderConfig struct {
	// Size is the number of ranks (≥ 2).
	Size int
	// Secret, when set, authenticates every follower's link.
	Secret []byte
	// Rejoin lets a lost rank's restart rejoin the group (the cpu
	// backend, whose all_sum is the link's). Without it (MLX's group,
	// joined once per process) a lost rank makes Lost fire: the runner
	// exits so that the supervisor restarts every rank.
	Rejoin bool
	// MLX says the ranks sum over MLX's group, not the link (every rank
	// must say the same: checked at the handshake).
	MLX bool
	// Group is MLX's group ("ring", "nccl", "jaccl"; "" with MLX: the
	// ring) and Backend the engine backend's name, which the hello
	// carries (a mismatch is refused naming both).
	Group, Backend string
	// Timeout bounds a follower's silence within a call (0:
	// DefaultTimeout).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Leader is rank 0 of a tensor-parallel group: it accepts the followers'
// links, and drives them from its Model adapter (model.go): before each
// engine call on its own share it sends the call to every follower, and
// after it collects their acks.
type Leader struct {
	cfg  LeaderConfig
	size int
	log  *slog.Logger

	// callMu serializes calls (the ranks run them in one order) and
	// the group's restarts; cur is the call's peers, parts the all_sum's
	// scratch (both under callMu).
	callMu sync.Mutex
	cur    []*peer
	parts  [][]byte
	buf    []byte
	caches map[uint64]*cache // under callMu
	nextID atomic.Uint64

	mu      sync.Mutex
	peers   []*peer // by rank; nil: not linked
	whole   bool
	everWon bool // the group was whole once
	lastErr error
	lost    chan struct{} // closed when a non-rejoinable group breaks
	lostOne sync.Once
	won     chan struct{} // closed when the group is first whole
	// refused gets (without blocking) a link refused because its rank
	// runs another backend (awaitWhole's).
	refused chan error
	// want, when set, gets a prefill follower's Want (prefill.go).
	want func(rank int, tokens []int32, from int, seen uint64)
}

// peer is one follower's link and its reader.
type peer struct {
	rank int
	l    *link
	in   chan frame
	dead chan struct{}
	err  error         // why the reader stopped (set before dead closes)
	gone chan struct{} // closed when the group drops the link
	tm   *time.Timer
}

type frame struct {
	typ     byte
	payload []byte
}

// NewLeader makes rank 0's group; Serve accepts the followers.
func NewLeader(cfg LeaderConfig) (*Leader, error) {
	if cfg.Size < 2 || cfg.Size > 1<<16-1 {
		return nil, fmt.Errorf("tensor: a group of %d ranks (want 2 or more)", cfg.Size)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Leader{cfg: cfg, size: cfg.Size, log: cfg.Logger, peers: make([]*peer, cfg.Size),
		caches: map[uint64]*cache{}, lost: make(chan struct{}), won: make(chan struct{}), refused: make(chan error, 1),
		lastErr: fmt.Errorf("%w: waiting for ranks 1 to %d to join", ErrGroup, cfg.Size-1)}, nil
}

// Collective is rank 0's all_sum over the links (the cpu backend's; on
// MLX the group's own collective is used instead).
func (g *Leader) Collective() engine.Collective { return leaderSum{g} }

// Serve accepts followers on l until ctx ends.
func (g *Leader) Serve(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				if g.Health() == nil { // else keep why it broke
					g.fail(fmt.Errorf("%w: %w", ErrGroup, errStopping))
				}
				return nil
			}
			return fmt.Errorf("tensor: accept: %w", err)
		}
		go g.admit(conn)
	}
}

// Health is nil while the group is whole, else why not.
func (g *Leader) Health() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.whole {
		return nil
	}
	return g.lastErr
}

// Lost is closed when a group that cannot rejoin (LeaderConfig.Rejoin
// false) loses a rank after it was whole.
func (g *Leader) Lost() <-chan struct{} { return g.lost }

// isLost reports whether Lost has fired.
func (g *Leader) isLost() bool {
	select {
	case <-g.lost:
		return true
	default:
		return false
	}
}

func (g *Leader) admit(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		_ = tc.SetKeepAlivePeriod(5 * time.Second)
	}
	l, h, err := handshake(conn, 0, g.cfg.Size, groupOf(g.cfg.MLX, g.cfg.Group), g.cfg.Backend, g.cfg.Secret)
	if errors.Is(err, ErrMismatch) {
		g.log.Error("tensor link refused", "remote", conn.RemoteAddr().String(), "err", err)
		conn.Close()
		g.mu.Lock()
		if !g.whole { // Health says why the group is not whole yet
			g.lastErr = fmt.Errorf("%w: a rank was refused: %w", ErrGroup, err)
		}
		g.mu.Unlock()
		select {
		case g.refused <- err:
		default:
		}
		return
	}
	if err != nil {
		g.log.Warn("tensor link refused", "remote", conn.RemoteAddr().String(), "err", err)
		conn.Close()
		return
	}
	if h.Index < 1 || h.Index >= g.size {
		g.log.Warn("tensor link refused", "remote", conn.RemoteAddr().String(), "rank", h.Index, "err", "rank out of range")
		conn.Close()
		return
	}
	p := &peer{rank: h.Index, l: l, in: make(chan frame, 4), dead: make(chan struct{}), gone: make(chan struct{}), tm: time.NewTimer(time.Hour)}
	p.tm.Stop()
	go g.readLoop(p)
	// A rank (re)joining a whole group means its old self is gone:
	// restart the group around it.
	g.callMu.Lock()
	defer g.callMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.whole || g.peers[h.Index] != nil {
		g.failLocked(fmt.Errorf("%w: rank %d joined again (its previous process is gone)", ErrGroup, h.Index))
	}
	if g.everWon && !g.cfg.Rejoin {
		g.log.Warn("tensor link refused: this group cannot rejoin a rank (restart every rank)", "rank", h.Index)
		l.close()
		close(p.gone)
		return
	}
	g.peers[h.Index] = p
	g.log.Info("tensor rank linked", "rank", h.Index, "remote", conn.RemoteAddr().String())
	var missing []int
	for r := 1; r < g.size; r++ {
		if g.peers[r] == nil {
			missing = append(missing, r)
		}
	}
	if missing != nil {
		g.lastErr = fmt.Errorf("%w: waiting for ranks %v", ErrGroup, missing)
		return
	}
	// Whole: every follower starts with no caches, so rank 0's go empty.
	for _, c := range g.caches {
		if c.local.Len() > 0 {
			c.local.Truncate(0)
			c.stale = true
		}
	}
	if !g.everWon {
		close(g.won)
	}
	g.whole, g.everWon, g.lastErr = true, true, nil
	g.log.Info("tensor group whole", "ranks", g.size)
}

// groupOf is a hello's group: "" on the link, MLX's group (the ring
// unless named) on MLX.
func groupOf(mlx bool, group string) string {
	switch {
	case !mlx:
		return ""
	case group == "":
		return "ring"
	}
	return group
}

// awaitWhole waits, at most timeout, until every follower has linked (the
// first time): it fails at once when a rank's link is refused for another
// backend, and at the timeout naming the ranks still missing.
func (g *Leader) awaitWhole(timeout time.Duration, peers []string) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-g.won:
		return nil
	case err := <-g.refused:
		return err
	case <-t.C:
		return fmt.Errorf("tensor: the ranks did not all link to rank 0 within %v (%v; --tensor-peers %s)", timeout, g.Health(), strings.Join(peers, ","))
	}
}

func (g *Leader) readLoop(p *peer) {
	for {
		typ, payload, err := p.l.read(nil)
		if err != nil {
			p.err = err
			close(p.dead)
			g.mu.Lock()
			if g.peers[p.rank] == p {
				g.failLocked(fmt.Errorf("%w: rank %d lost: %w", ErrGroup, p.rank, err))
			}
			g.mu.Unlock()
			return
		}
		if typ == frameWant {
			tokens, from, seen, err := decodeWant(payload)
			g.mu.Lock()
			w := g.want
			if err != nil && g.peers[p.rank] == p {
				g.failLocked(fmt.Errorf("%w: rank %d: %w", ErrGroup, p.rank, err))
			}
			g.mu.Unlock()
			if err != nil {
				return
			}
			if w == nil {
				g.log.Warn("tensor: a Want from a rank of a group that is not a prefill group: ignored", "rank", p.rank)
				continue
			}
			go w(p.rank, tokens, from, seen)
			continue
		}
		select {
		case p.in <- frame{typ, payload}:
		case <-p.gone:
			return
		}
	}
}

// fail breaks the group: every link closes (the followers drop their
// caches and dial again), calls fail until every rank has rejoined.
func (g *Leader) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failLocked(err)
}

func (g *Leader) failLocked(err error) {
	if g.whole && errors.Is(err, errStopping) {
		g.log.Info("tensor group closed: rank 0 is stopping")
	} else if g.whole {
		g.log.Error("tensor group broken", "err", err)
	}
	g.whole = false
	g.lastErr = err
	for r, p := range g.peers {
		if p != nil {
			p.l.close()
			close(p.gone)
			g.peers[r] = nil
		}
	}
	if g.everWon && !g.cfg.Rejoin {
		g.lostOne.Do(func() { close(g.lost) })
	}
}

// next returns p's next frame, which must be of type want; an ack in
// its place carries the follower's error.
func (g *Leader) next(p *peer, want byte) ([]byte, error) {
	p.tm.Reset(g.cfg.Timeout)
	defer p.tm.Stop()
	select {
	case f := <-p.in:
		if f.typ == want {
			return f.payload, nil
		}
		if f.typ == frameAck {
			if err := decodeAck(f.payload, p.rank); err != nil {
				return nil, err
			}
		}
		return nil, fmt.Errorf("%w: rank %d sent frame type %d, want %d", ErrLink, p.rank, f.typ, want)
	case <-p.dead:
		return nil, fmt.Errorf("rank %d lost: %w", p.rank, p.err)
	case <-p.tm.C:
		return nil, fmt.Errorf("%w: rank %d silent for %v", ErrLink, p.rank, g.cfg.Timeout)
	}
}

// call runs c on every follower and local on rank 0's share (under
// callMu). local runs with a context that is not cancelled: once the
// followers have the call, every rank must finish it, or their all_sums
// would pair with the next call's. tolerant calls (remote fills) may fail
// on some ranks and not others without breaking the group; the caller
// puts the ranks back in step. It returns rank 0's error, else the first
// follower's.
func (g *Leader) call(ctx context.Context, c *call, tolerant bool, local func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g.mu.Lock()
	if !g.whole {
		err := g.lastErr
		g.mu.Unlock()
		return err
	}
	peers := make([]*peer, 0, g.size-1)
	peers = append(peers, g.peers[1:]...)
	g.mu.Unlock()
	g.buf = c.encode(g.buf[:0])
	for _, p := range peers {
		if err := p.l.write(frameCall, g.buf); err != nil {
			err = fmt.Errorf("%w: %s: %w", ErrGroup, opName(c.op), err)
			g.fail(err)
			return err
		}
	}
	g.cur = peers
	var lerr error
	if g.cfg.MLX {
		// MLX's ring does not fail a collective whose peer died: the
		// step would wait in it forever. The call ends when the link
		// says the group is lost (the process is then ended, the step
		// left behind).
		done := make(chan error, 1)
		go func() { done <- local(context.WithoutCancel(ctx)) }()
		select {
		case lerr = <-done:
		case <-g.lost:
			return fmt.Errorf("%w: %s: %w", ErrGroup, opName(c.op), g.Health())
		}
	} else {
		lerr = local(context.WithoutCancel(ctx))
	}
	g.cur = nil
	if errors.Is(lerr, ErrLink) || errors.Is(lerr, ErrRank) || errors.Is(lerr, ErrGroup) {
		err := fmt.Errorf("%w: %s: %w", ErrGroup, opName(c.op), lerr)
		g.fail(err)
		return err
	}
	var ferr error
	agree := true
	for _, p := range peers {
		payload, err := g.next(p, frameAck)
		if err == nil {
			err = decodeAck(payload, p.rank)
		} else if !errors.Is(err, ErrRank) {
			err = fmt.Errorf("%w: %s: %w", ErrGroup, opName(c.op), err)
			g.fail(err)
			return err
		}
		if (err == nil) != (lerr == nil) {
			agree = false
		}
		if ferr == nil {
			ferr = err
		}
	}
	if !agree && !tolerant {
		err := fmt.Errorf("%w: %s: the ranks disagree (rank 0: %v; followers: %v)", ErrGroup, opName(c.op), lerr, ferr)
		g.fail(err)
		return err
	}
	if lerr != nil {
		return lerr
	}
	return ferr
}
