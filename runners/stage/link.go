package stage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/internal/link"
)

// LinkConfig is what both ends of a stage link know: who this stage is,
// the secret and the deadlines.
type LinkConfig struct {
	Stage, Stages int
	First, End    int // this stage's layers
	Layers        int // the model's layers
	Hidden        int // the model's hidden width (Step frames)
	Fingerprint   [32]byte
	// Secret, when set, authenticates the link (PROTOCOL.md S2).
	Secret []byte
	// HandshakeTimeout bounds the Hellos and auth (default 10 s);
	// IdleTimeout is the longest a link may carry nothing, not even a
	// Keepalive, before it is taken for dead (default 10 s).
	HandshakeTimeout, IdleTimeout time.Duration
	// WriteTimeout bounds one frame's write (default 2 min): a busy
	// downstream stage may take a while to read the next chunk; a dead or
	// hung one is noticed sooner, by its missing keepalives.
	WriteTimeout time.Duration
	// MaxStepBytes bounds a Step frame (default DefaultMaxStepBytes).
	MaxStepBytes int
	// Count, when set, is told the bytes each frame puts on the wire
	// (sent: true) or takes off it.
	Count func(sent bool, n int)
	// Wrote, when set, is told how long each frame's write took.
	Wrote func(time.Duration)
	// Offer, when set and true at the handshake, offers the peer to carry
	// the hidden states over the stages' group (Hello flag GROUP); the
	// link's Group says whether both ends offered.
	Offer func() bool
}

func (c *LinkConfig) defaults() {
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 2 * time.Minute
	}
	if c.MaxStepBytes <= 0 {
		c.MaxStepBytes = DefaultMaxStepBytes
	}
}

// handshake is this end's part in the link's handshake (PROTOCOL.md S1,
// S2: runners/internal/link's); dialer: this end is the sender.
func (c *LinkConfig) handshake(dialer bool) *link.Handshake {
	me := link.Hello{Index: c.Stage, Count: c.Stages, First: c.First, End: c.End, Fingerprint: c.Fingerprint}
	if c.Offer != nil && c.Offer() {
		me.Flags |= flagGroup
	}
	check := func(peer *link.Hello) error { h := fromWire(*peer); return c.checkPeer(&h, !dialer) }
	return &link.Handshake{Spec: &spec, Me: me, Secret: c.Secret, Dialer: dialer, Timeout: c.HandshakeTimeout, Check: check}
}

// checkPeer says why peer may not be this stage's neighbour: upstream
// (the sender, when this end receives) or downstream.
func (c *LinkConfig) checkPeer(peer *Hello, upstream bool) error {
	n := c.Stages
	switch {
	case peer.Stages != n:
		return fmt.Errorf("%w: the peer is one of %d stages, this one of %d", ErrMismatch, peer.Stages, n)
	case peer.Fingerprint != c.Fingerprint:
		return fmt.Errorf("%w: the peer's model fingerprint %x differs from this one's %x", ErrMismatch, peer.Fingerprint[:8], c.Fingerprint[:8])
	}
	if upstream {
		want := (c.Stage - 1 + n) % n
		end := c.First
		if c.Stage == 0 {
			end = c.Layers
		}
		if peer.Stage != want || peer.End != end {
			return fmt.Errorf("%w: stage %d (layers [%d, %d)) links into stage %d (layers [%d, %d)): want stage %d ending at layer %d",
				ErrMismatch, peer.Stage, peer.First, peer.End, c.Stage, c.First, c.End, want, end)
		}
		return nil
	}
	want := (c.Stage + 1) % n
	first := c.End
	if want == 0 {
		first = 0
		if c.End != c.Layers {
			return fmt.Errorf("%w: stage %d (layers [%d, %d)) links back to stage 0 but does not hold the last layer %d", ErrMismatch, c.Stage, c.First, c.End, c.Layers-1)
		}
	}
	if peer.Stage != want || peer.First != first {
		return fmt.Errorf("%w: stage %d (layers [%d, %d)) dialled stage %d (layers [%d, %d)): want stage %d starting at layer %d",
			ErrMismatch, c.Stage, c.First, c.End, peer.Stage, peer.First, peer.End, want, first)
	}
	return nil
}

// Link is one end of an authenticated stage link. Send is safe for
// concurrent use; Recv is for one goroutine.
type Link struct {
	cfg  LinkConfig
	conn net.Conn
	br   *bufio.Reader
	Peer Hello

	// group: both ends offered to carry hidden states over the group
	// (set by the handshake).
	group bool

	wmu       sync.Mutex
	lastWrite atomic.Int64 // unix nanoseconds
	buf       []byte

	once   sync.Once
	done   chan struct{}
	errMu  sync.Mutex
	err    error
	stopKA chan struct{}
}

// Dial connects to the downstream stage at addr as its sender.
func Dial(ctx context.Context, addr string, cfg LinkConfig) (*Link, error) {
	cfg.defaults()
	hctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stage link: dial %s: %w", addr, err)
	}
	l := newLink(conn, cfg)
	if err := l.handshake(hctx, true); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("stage link to %s: %w", addr, err)
	}
	l.start()
	return l, nil
}

// Accept runs the receiver's side of the handshake on conn (a connection
// its listener accepted). On a refusal it has written the Error frame and
// closed conn.
func Accept(conn net.Conn, cfg LinkConfig) (*Link, error) {
	cfg.defaults()
	l := newLink(conn, cfg)
	if err := l.handshake(context.Background(), false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("stage link from %s: %w", conn.RemoteAddr(), err)
	}
	l.start()
	return l, nil
}

func newLink(conn net.Conn, cfg LinkConfig) *Link {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &Link{cfg: cfg, conn: conn, br: bufio.NewReaderSize(conn, 64<<10), done: make(chan struct{}), stopKA: make(chan struct{})}
}

func (l *Link) handshake(ctx context.Context, dialer bool) error {
	me, peer, err := l.cfg.handshake(dialer).Run(ctx, l.conn, l.br)
	l.Peer = fromWire(peer)
	group, _ := link.Agree(&me, &peer) // a stage falls back to the link when its neighbour does not offer
	l.group = group != ""
	return err
}

// start begins the keepalives.
func (l *Link) start() {
	l.lastWrite.Store(time.Now().UnixNano())
	go func() {
		every := l.cfg.IdleTimeout / 4
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-t.C:
				if time.Since(time.Unix(0, l.lastWrite.Load())) >= every {
					if err := l.Send(keepalive{}); err != nil {
						return
					}
				}
			}
		}
	}()
}

// Send writes one message's frame (within IdleTimeout).
func (l *Link) Send(msg any) error {
	b, err := encode(msg)
	if err != nil {
		return err
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.Err(); err != nil {
		return err
	}
	t0 := time.Now()
	l.conn.SetWriteDeadline(t0.Add(l.cfg.WriteTimeout))
	_, err = l.conn.Write(b)
	t1 := time.Now()
	l.lastWrite.Store(t1.UnixNano())
	if l.cfg.Wrote != nil {
		l.cfg.Wrote(t1.Sub(t0))
	}
	if err != nil {
		err = fmt.Errorf("stage link to stage %d: write: %w", l.Peer.Stage, err)
		l.Close(err)
		return err
	}
	if l.cfg.Count != nil {
		l.cfg.Count(true, len(b))
	}
	return nil
}

// Recv reads the next message (Keepalives are consumed here), waiting at
// most IdleTimeout for each frame. A read or frame error closes the link.
func (l *Link) Recv() (any, error) {
	for {
		l.conn.SetReadDeadline(time.Now().Add(l.cfg.IdleTimeout))
		typ, p, err := readFrame(l.br, l.buf, l.cfg.MaxStepBytes)
		if err == nil {
			if l.cfg.Count != nil {
				l.cfg.Count(false, headerSize+len(p))
			}
			if cap(p) <= 1<<20 {
				l.buf = p[:0] // small buffers are reused; a big Step's is not kept
			}
			var msg any
			if msg, err = decodeFrame(typ, p, l.cfg.Hidden, l.group); err == nil {
				if _, ka := msg.(keepalive); ka {
					continue
				}
				return msg, nil
			}
		}
		if errors.Is(err, ErrCorrupt) {
			b, _ := encode(ErrorFrame{Code: CodeCorrupt, Reason: err.Error()})
			l.conn.SetWriteDeadline(time.Now().Add(time.Second))
			l.conn.Write(b)
		}
		if e := l.Err(); e != nil {
			return nil, e
		}
		err = fmt.Errorf("stage link with stage %d: read: %w", l.Peer.Stage, err)
		l.Close(err)
		return nil, err
	}
}

// Close ends the link; Err then reports why (the first reason given).
func (l *Link) Close(why error) {
	l.once.Do(func() {
		if why == nil {
			why = fmt.Errorf("%w: link closed", ErrDown)
		}
		l.errMu.Lock()
		l.err = why
		l.errMu.Unlock()
		close(l.done)
		l.conn.Close()
	})
}

// Err is why the link closed (nil while open).
func (l *Link) Err() error {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	return l.err
}

// Group is whether both ends offered to carry the hidden states over the
// stages' group (Hello flag GROUP): Steps of DTypeGroup are valid on it.
func (l *Link) Group() bool { return l.group }

// Done is closed when the link closes.
func (l *Link) Done() <-chan struct{} { return l.done }
