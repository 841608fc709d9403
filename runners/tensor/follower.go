package tensor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// FollowerConfig configures a rank > 0.
type FollowerConfig struct {
	// Rank is this rank (1 ≤ Rank < Size); Size the number of ranks.
	Rank, Size int
	// Leader is rank 0's tensor link address.
	Leader string
	// Secret, when set, authenticates the link (rank 0 must have it too).
	Secret []byte
	// Rejoin makes the follower dial rank 0 again after its link drops
	// (the cpu backend). Without it (MLX's group) Run returns.
	Rejoin bool
	// MLX says the ranks sum over MLX's group, not the link.
	MLX bool
	// Group and Backend: LeaderConfig's.
	Group, Backend string
	// Timeout bounds the wait for rank 0's sum within a call (0:
	// DefaultTimeout).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Follower is a rank > 0 of a tensor-parallel group: it dials rank 0,
// runs the calls rank 0 sends on its share, in order, and acknowledges
// each.
type Follower struct {
	cfg        FollowerConfig
	rank, size int
	log        *slog.Logger

	// cur is the link of the call being run, sumBuf the all_sum's
	// receive buffer (the Run goroutine's).
	cur    *link
	sumBuf []byte
	buf    []byte

	fill decode.Remote // set before Run (SetFill)
	// pre is a prefill rank's Producer (PrefillFollow), drives its
	// computations rank 0 drives (the call loop's; prefill.go).
	pre    *prefill.Producer
	drives map[uint64]*drive

	// pending is the link made before joining MLX's group (link), which
	// Run serves first.
	pending *link

	mu      sync.Mutex
	linked  bool
	lastErr error
	live    *link // the link to rank 0 while linked
	// refused is rank 0's last refusal of this rank (another backend, a
	// failed authentication) since it last linked: Health keeps naming it
	// after rank 0 is gone (a rank 0 of another backend exits).
	refused error
}

// NewFollower makes rank cfg.Rank's side; Run serves it.
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	if cfg.Size < 2 || cfg.Rank < 1 || cfg.Rank >= cfg.Size || cfg.Size > 1<<16-1 {
		return nil, fmt.Errorf("tensor: rank %d of %d is not a follower", cfg.Rank, cfg.Size)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Follower{cfg: cfg, rank: cfg.Rank, size: cfg.Size, log: cfg.Logger,
		lastErr: fmt.Errorf("%w: rank %d has not reached rank 0 at %s yet", ErrGroup, cfg.Rank, cfg.Leader)}, nil
}

// SetFill makes the follower fill its share of a sequence's cache from
// prefill runners when rank 0 asks (a Remote built on this rank's model:
// it asks for the rank's KV heads). Call it before Run.
func (f *Follower) SetFill(r decode.Remote) { f.fill = r }

// Collective is this rank's all_sum over the link (the cpu backend's).
func (f *Follower) Collective() engine.Collective { return followerSum{f} }

// Health is nil while linked to rank 0, else why not.
func (f *Follower) Health() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.linked {
		return nil
	}
	if f.refused != nil && f.refused != f.lastErr {
		return fmt.Errorf("%w (rank 0 refused this rank before: %w)", f.lastErr, f.refused)
	}
	return f.lastErr
}

func (f *Follower) setLinked(l *link, err error) {
	f.mu.Lock()
	f.linked, f.lastErr, f.live = l != nil, err, l
	switch {
	case l != nil:
		f.refused = nil
	case errors.Is(err, ErrAuth) || errors.Is(err, ErrMismatch):
		f.refused = err
	}
	f.mu.Unlock()
	if f.pre != nil {
		f.pre.StageChanged() // requests waiting for a computation see the link
	}
}

// Run dials rank 0 and serves its calls on m (this rank's share) until
// ctx ends; after a dropped link it dials again (Rejoin) or returns the
// link's error.
func (f *Follower) Run(ctx context.Context, m *engine.Model) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		l, err := f.pending, error(nil)
		f.pending = nil
		if l == nil {
			l, err = f.dial(ctx)
		}
		if err != nil {
			f.setLinked(nil, err)
			if errors.Is(err, ErrAuth) || errors.Is(err, ErrMismatch) {
				f.log.Error("tensor link refused", "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		f.setLinked(l, nil)
		f.log.Info("tensor rank linked to rank 0", "rank", f.rank, "leader", f.cfg.Leader)
		if f.cfg.MLX {
			err = f.serveMLX(ctx, l, m)
		} else {
			err = f.serve(ctx, l, m, l.read)
		}
		f.setLinked(nil, fmt.Errorf("%w: rank %d's link to rank 0 dropped: %w", ErrGroup, f.rank, err))
		if ctx.Err() != nil {
			return nil
		}
		f.log.Warn("tensor link to rank 0 dropped: caches dropped", "rank", f.rank, "err", err)
		if !f.cfg.Rejoin {
			return fmt.Errorf("tensor: rank %d: link to rank 0 dropped: %w", f.rank, err)
		}
	}
	return nil
}

func (f *Follower) dial(ctx context.Context) (*link, error) {
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", f.cfg.Leader)
	if err != nil {
		return nil, fmt.Errorf("%w: dial rank 0 at %s: %w", ErrLink, f.cfg.Leader, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	l, _, err := handshake(conn, f.rank, f.size, groupOf(f.cfg.MLX, f.cfg.Group), f.cfg.Backend, f.cfg.Secret)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return l, nil
}

// link links to rank 0 before the rank joins MLX's group (Run serves the
// link later), dialling again until timeout; a refusal for another
// backend, or a failed authentication, ends it at once.
func (f *Follower) link(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		l, err := f.dial(ctx)
		if err == nil {
			f.pending = l
			return nil
		}
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrMismatch) {
			f.log.Error("tensor link refused", "err", err)
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tensor: rank %d did not link to rank 0 at %s within %v: %w", f.rank, f.cfg.Leader, timeout, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// serveMLX is serve with the link read by a goroutine of its own: a call
// can stay inside MLX's ring all_sum forever when rank 0 died (MLX does
// not fail it), and the link's end must still end the rank. The call is
// left behind (the process ends).
func (f *Follower) serveMLX(ctx context.Context, l *link, m *engine.Model) error {
	frames := make(chan frame)
	errc := make(chan error, 2)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(frames)
		for {
			typ, p, err := l.read(nil)
			if err != nil {
				errc <- err
				return
			}
			select {
			case frames <- frame{typ, p}:
			case <-stop:
				return
			}
		}
	}()
	next := func([]byte) (byte, []byte, error) {
		fr, ok := <-frames
		if !ok {
			return 0, nil, fmt.Errorf("%w: link closed", ErrLink)
		}
		return fr.typ, fr.payload, nil
	}
	go func() { errc <- f.serve(ctx, l, m, next) }()
	return <-errc
}

// serve runs l's calls (read by next) until it drops; the caches die
// with it.
func (f *Follower) serve(ctx context.Context, l *link, m *engine.Model, next func([]byte) (byte, []byte, error)) error {
	caches := map[uint64]engine.KVCache{}
	f.drives = map[uint64]*drive{}
	defer func() {
		f.dropDrives()
		for _, c := range caches {
			c.Free()
		}
	}()
	stop := context.AfterFunc(ctx, func() { l.close() })
	defer stop()
	defer l.close()
	get := func(id uint64) engine.KVCache {
		c := caches[id]
		if c == nil {
			c = m.NewCache()
			caches[id] = c
		}
		return c
	}
	for {
		typ, payload, err := next(f.buf)
		if err != nil {
			return err
		}
		f.buf = payload[:0]
		if typ != frameCall {
			return fmt.Errorf("%w: rank 0 sent frame type %d between calls", ErrLink, typ)
		}
		c, err := decodeCall(payload)
		if err != nil {
			return err
		}
		f.cur = l
		err = f.exec(ctx, m, c, get, caches)
		f.cur = nil
		if errors.Is(err, ErrLink) || errors.Is(err, ErrGroup) {
			return err // an all_sum failed: the link is not in step any more
		}
		if err != nil {
			f.log.Warn("tensor call failed", "rank", f.rank, "op", opName(c.op), "err", err)
		}
		if werr := l.write(frameAck, encodeAck(err)); werr != nil {
			return werr
		}
	}
}

// exec runs one call on this rank's share.
func (f *Follower) exec(ctx context.Context, m *engine.Model, c *call, get func(uint64) engine.KVCache, caches map[uint64]engine.KVCache) error {
	switch c.op {
	case opForward:
		_, err := m.Forward(ctx, get(c.ids[0]), c.tokens)
		return err
	case opBatch:
		cs := make([]engine.KVCache, len(c.ids))
		for i, id := range c.ids {
			cs[i] = get(id)
		}
		_, err := m.ForwardBatchInto(ctx, cs, c.tokens, nil)
		return err
	case opAll:
		_, err := m.ForwardAllInto(ctx, get(c.ids[0]), c.tokens, nil)
		return err
	case opPrefill:
		return m.Prefill(ctx, get(c.ids[0]), c.tokens, len(c.tokens), nil)
	case opTruncate:
		cc := caches[c.ids[0]]
		if cc == nil {
			if c.n != 0 {
				return fmt.Errorf("tensor: truncate an unknown cache %d to %d", c.ids[0], c.n)
			}
			return nil
		}
		if !cc.CanTruncate(c.n) {
			return fmt.Errorf("tensor: cache %d cannot go back to %d", c.ids[0], c.n)
		}
		cc.Truncate(c.n)
		return nil
	case opFree:
		if cc := caches[c.ids[0]]; cc != nil {
			cc.Free()
			delete(caches, c.ids[0])
		}
		return nil
	case opFill:
		if f.fill == nil {
			return fmt.Errorf("tensor: rank %d has no prefill endpoints (remote fill)", f.rank)
		}
		cc := get(c.ids[0])
		if cc.Len() != c.n {
			return fmt.Errorf("tensor: remote fill from %d of a cache holding %d", c.n, cc.Len())
		}
		_, err := f.fill.Prefill(ctx, c.reqID, c.tokens, c.n, cc, c.prefer)
		return err
	case opStage:
		cs := make([]engine.KVCache, len(c.ids))
		toks := make([][]int32, len(c.ids))
		o := 0
		for i, id := range c.ids {
			cs[i], toks[i] = get(id), c.tokens[o:o+c.counts[i]]
			o += c.counts[i]
		}
		var hidden []float32
		if len(c.hidden) > 0 {
			hidden = make([]float32, len(c.hidden)/4)
			for i := range hidden {
				hidden[i] = math.Float32frombits(binary.LittleEndian.Uint32(c.hidden[4*i:]))
			}
		}
		_, _, err := m.StageStep(ctx, cs, toks, hidden)
		return err
	case opBegin:
		return f.begin(ctx, m, c.ids[0], c.tokens, c.n)
	case opChunk:
		return f.chunk(c.ids[0], c.tokens)
	case opEnd:
		return f.endDrive(c.ids[0], c.n == 1)
	}
	return fmt.Errorf("tensor: unknown op %d", c.op)
}
