package kvwire

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// Sink receives a stream on the client. Calls come from the goroutine that
// called Fetch, in wire order (a striped transfer's chunks reassembled:
// each layer's in position order, layers interleaved). The k, v and array slices are valid only
// during the call (their buffers are reused). A Sink error aborts the
// stream. On any failure — the sink's own, the wire's, a mismatch — the
// client calls Rollback exactly once, possibly without Begin having been
// called (an error before the header), so the sink can truncate back to the
// request's start_pos; after a successful Done it is never called.
type Sink interface {
	Begin(h *Header) error
	Chunk(layer, tokenStart, tokenCount int, k, v []byte) error
	State(layer, tokenEnd int, arrays [][]byte) error
	Done(t Totals) error
	Rollback()
}

// Expect is what the client's model requires of the server's header.
// For a request with a layer range (Request.LayerStart, LayerEnd), Kinds
// and Windows are those of the range's layers only.
type Expect struct {
	Fingerprint Fingerprint
	Kinds       []LayerKind
	KVHeads     int
	HeadDim     int

	// Windows is the client model's window per layer (nil: all full); the
	// server's must be the same.
	Windows []int
}

// ClientConfig configures a Client. Zero values take the defaults shown.
type ClientConfig struct {
	// Secret authenticates to servers that require it, and is required of
	// the server when set.
	Secret []byte
	// ConnectTimeout bounds the TCP connect, the Hello exchange and the
	// authentication together (default 1 s). A healthy server answers the
	// Hello from its accept loop at once, whatever it is computing, so a
	// server that does not answer within a second is stalled (a GPU hang,
	// SIGSTOP, a swap storm) and the client moves on.
	ConnectTimeout time.Duration
	// DialTimeout, when set, bounds the TCP connect alone (within
	// ConnectTimeout).
	DialTimeout time.Duration
	// IdleTimeout bounds the wait for each frame after the request
	// (default 30 s). A server sends a Keepalive after KeepaliveEvery
	// (1 s) without other frames, so a few seconds is ample; FetchIdle
	// sets it per fetch from the endpoint's measured frame gaps.
	IdleTimeout time.Duration
	// ProgressTimeout bounds the wait for the next KV frame once the
	// header has arrived, Keepalives not counting (default 30 s): the
	// server is then computing this request (it is past its queue), so
	// Keepalives with no KV mean its compute hangs while its process
	// still answers (a GPU hang).
	ProgressTimeout time.Duration
	Limits          Limits
	// ReadAhead frames may be read from the socket before the sink takes
	// them (default 2: one being received while the other is verified and
	// sunk; each holds a buffer as large as the largest frame). 1 makes
	// receive, verify and sink sequential (the kernel's socket buffer still
	// overlaps them with the wire), which costs the least CPU on a 2-core
	// machine; more absorbs a jittery sink.
	ReadAhead int
	// Dial replaces net.Dialer.DialContext (tests, custom routes).
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Logger *slog.Logger
}

// Client fetches KV streams. It is safe for concurrent use; each Fetch
// uses its own connection and buffers.
type Client struct {
	cfg ClientConfig
	log *slog.Logger
}

// NewClient fills in defaults.
func NewClient(cfg ClientConfig) *Client {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = time.Second
	}
	if cfg.DialTimeout <= 0 || cfg.DialTimeout > cfg.ConnectTimeout {
		cfg.DialTimeout = cfg.ConnectTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Second
	}
	if cfg.ReadAhead <= 0 {
		cfg.ReadAhead = 2
	}
	if cfg.ProgressTimeout <= 0 {
		cfg.ProgressTimeout = 30 * time.Second
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg, log: log}
}

// Stats describes one Fetch, successful or not.
type Stats struct {
	Addr string
	// WireBytes is every byte read from the socket (frames and Hello).
	WireBytes int64
	// PayloadBytes is the KV and state bytes handed to the sink.
	PayloadBytes int64
	Chunks       int
	States       int
	// FirstHeader is the time from the start of Fetch to the header.
	FirstHeader time.Duration
	// Duration is the time from the start of Fetch to its return.
	Duration time.Duration
	// WireWait is the time the sink side spent waiting for the next frame
	// to arrive from the wire (stalls on the network or on the server).
	WireWait time.Duration
	// MaxGap is the longest time between the request and the first frame
	// or between two frames (Keepalives included): what a healthy server
	// makes this client wait at most, the basis of the next idle deadline.
	MaxGap time.Duration
	// Streams is the number of connections the transfer used (PROTOCOL.md
	// §17): 1, or what the server granted of Request.Streams.
	Streams int
	// serverFlags are the flags of the server's Hello.
	serverFlags uint16
	// SecondaryChunks counts the chunks that came over the secondaries.
	SecondaryChunks int
	// ChunksWaited counts striped chunks that arrived before the previous
	// chunk of their layer and waited for it (reassembly).
	ChunksWaited int
}

// withContextDeadline is req with the deadline the server is sent: req's
// own, or, when ctx ends sooner (or req names none), what is left of ctx
// plus a second — the client's context ends first (and closing the
// connection stops the server at once); the deadline bounds the server
// should the connection not close cleanly. req itself is not changed.
func withContextDeadline(ctx context.Context, req *Request) *Request {
	dl, ok := ctx.Deadline()
	if !ok {
		return req
	}
	left := max(time.Until(dl), 0) + time.Second
	if req.Deadline > 0 && req.Deadline <= left {
		return req
	}
	r := *req
	r.Deadline = left
	return &r
}

// Fetch asks the server at addr for the KV of req and streams it into
// sink. exp, when non-nil, is checked against the header before any KV is
// accepted (ErrMismatch). Errors wrap one of the package's sentinels, or
// the context's error when ctx was cancelled.
func (c *Client) Fetch(ctx context.Context, addr string, req *Request, exp *Expect, sink Sink) (Stats, error) {
	return c.FetchIdle(ctx, addr, 0, req, exp, sink)
}

// FetchIdle is Fetch with idle (when > 0) in place of the configured
// IdleTimeout as the longest wait for any one frame after the request.
func (c *Client) FetchIdle(ctx context.Context, addr string, idle time.Duration, req *Request, exp *Expect, sink Sink) (st Stats, err error) {
	start := time.Now()
	if idle <= 0 {
		idle = c.cfg.IdleTimeout
	}
	st.Addr = addr
	defer func() {
		st.Duration = time.Since(start)
		if err != nil {
			sink.Rollback()
		}
	}()
	req = withContextDeadline(ctx, req)
	reqFrame, err := encodeRequest(req)
	if err != nil {
		return st, err
	}

	if req.Deadline > 0 {
		// The server enforces the deadline and reports it; the client
		// allows a second more to hear that, then gives up by itself.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Deadline+time.Second)
		defer cancel()
	}
	conn, br, err := c.connect(ctx, addr, &st)
	if err != nil {
		return st, err
	}
	defer conn.Close()
	// Cancelling ctx unblocks any read or write at once.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	overall, hasOverall := ctx.Deadline()
	deadline := func() time.Time {
		d := time.Now().Add(idle)
		if hasOverall && overall.Before(d) {
			return overall
		}
		return d
	}
	conn.SetDeadline(deadline())
	if ctx.Err() != nil { // cancelled before the deadline above was set
		return st, c.netErr(ctx, ctx.Err())
	}
	if _, err := conn.Write(reqFrame); err != nil {
		return st, c.netErr(ctx, fmt.Errorf("write request: %w", err))
	}

	// One reader goroutine per connection: socket → events, each bounded
	// by its own ReadAhead buffers. The primary is stream 0; secondaries
	// (PROTOCOL.md §17) join once the server has granted them.
	events := make(chan streamEvent, MaxStreams*c.cfg.ReadAhead)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	var connMu sync.Mutex
	conns := []net.Conn{conn}
	// joinCtx ends with the fetch: a secondary still connecting gives up.
	joinCtx, endJoins := context.WithCancel(ctx)
	defer endJoins()
	var frees []chan []byte
	newFree := func() chan []byte {
		free := make(chan []byte, c.cfg.ReadAhead)
		for range c.cfg.ReadAhead {
			free <- nil
		}
		frees = append(frees, free)
		return free
	}
	read := func(i int, conn net.Conn, br *bufio.Reader, free chan []byte, hs int64) {
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-quit:
				return
			}
			conn.SetReadDeadline(deadline())
			f := readFrame(br, buf, c.cfg.Limits)
			select {
			case events <- streamEvent{i: i, f: f, hs: hs}:
			case <-quit:
				return
			}
			hs = 0
			if f.err != nil {
				return
			}
		}
	}
	free0 := newFree()
	wg.Add(1)
	go func() {
		defer wg.Done()
		read(0, conn, br, free0, 0)
	}()
	// join opens secondary i and starts its reader; a failure becomes
	// that stream's error event.
	join := func(i int, id JoinID, free chan []byte) {
		defer wg.Done()
		var hst Stats
		sc, sbr, err := c.connect(joinCtx, addr, &hst)
		if err == nil {
			connMu.Lock()
			select {
			case <-quit:
				err = errors.New("fetch ended")
				sc.Close()
			default:
				conns = append(conns, sc)
			}
			connMu.Unlock()
		}
		if err == nil {
			sc.SetWriteDeadline(deadline())
			if _, werr := sc.Write(encodeJoin(i, &id)); werr != nil {
				err = c.netErr(ctx, fmt.Errorf("write join: %w", werr))
			}
		}
		if err != nil {
			select {
			case events <- streamEvent{i: i, f: rawFrame{err: err}}:
			case <-quit:
			}
			return
		}
		read(i, sc, sbr, free, hst.WireBytes)
	}
	defer func() {
		connMu.Lock()
		close(quit)
		for _, c := range conns {
			c.Close()
		}
		connMu.Unlock()
		endJoins()
		wg.Wait()
	}()

	rs := &recvState{req: req, exp: exp, sink: sink, lim: c.cfg.Limits, st: &st, start: start}
	m := newReassembler(rs, req.Streams)
	st.Streams = 1
	free := func(i int, buf []byte) { frees[i] <- buf }
	last := time.Now()
	lastKV := last
	for {
		w0 := time.Now()
		var ev streamEvent
		select {
		case ev = <-events:
		case <-ctx.Done():
			// A reader may have re-armed its deadline after the
			// AfterFunc; closing the connections (deferred) stops it.
			return st, c.netErr(ctx, context.Cause(ctx))
		}
		now := time.Now()
		st.WireWait += now.Sub(w0)
		st.WireBytes += ev.hs
		f := ev.f
		if f.err != nil {
			if m.closedOK(ev.i) {
				continue // the connection's end after its Done
			}
			if f.err == io.EOF {
				f.err = fmt.Errorf("%w: server closed the connection before done", ErrClosed)
			}
			if ev.i > 0 {
				f.err = fmt.Errorf("stream %d of %d: %w", ev.i, m.streams(), f.err)
			}
			return st, c.netErr(ctx, f.err)
		}
		st.MaxGap = max(st.MaxGap, now.Sub(last))
		last = now
		if f.typ != frameKeepalive || rs.h == nil {
			lastKV = now
		} else if now.Sub(lastKV) > c.cfg.ProgressTimeout {
			return st, fmt.Errorf("%w: no KV for %v after the header, only keepalives (the server's compute is stuck)", ErrTimeout, now.Sub(lastKV).Round(time.Millisecond))
		}
		m.push(ev.i, f)
		for {
			granted, done, err := m.step(free)
			if err != nil || done {
				return st, err
			}
			if granted < 2 {
				break
			}
			st.Streams = granted
			for i := 1; i < granted; i++ {
				wg.Add(1)
				go join(i, m.joinID, newFree())
			}
		}
	}
}

// streamEvent is a frame (or a transport error) read from stream i; hs
// counts the secondary's handshake bytes with its first event.
type streamEvent struct {
	i  int
	f  rawFrame
	hs int64
}

// recvState is the client's side of one stream after the request: it
// checks each frame and drives the sink. Fetch feeds it frames from the
// socket; the fuzz target feeds it arbitrary bytes.
type recvState struct {
	req    *Request
	exp    *Expect
	sink   Sink
	lim    Limits
	st     *Stats
	start  time.Time
	h      *Header
	t      *tracker
	arrays [][]byte
}

// handle processes one frame read without a transport error. It reports
// done after a valid Done frame has been handed to the sink.
func (rs *recvState) handle(f *rawFrame) (done bool, err error) {
	st := rs.st
	st.WireBytes += int64(frameHeaderSize + len(f.payload))
	if err := f.check(); err != nil {
		return false, err
	}
	switch f.typ {
	case frameKeepalive:
	case frameError:
		return false, parseError(f.payload)
	case frameHeader:
		if rs.h != nil {
			return false, corruptf("second header")
		}
		h, err := parseHeader(f.payload)
		if err != nil {
			return false, err
		}
		if err := checkHeader(h, rs.req, rs.exp); err != nil {
			return false, err
		}
		rs.h = h
		st.FirstHeader = time.Since(rs.start)
		rs.t = newTracker(h, rs.lim)
		if err := rs.sink.Begin(h); err != nil {
			return false, fmt.Errorf("kvwire: sink begin: %w", err)
		}
	case frameChunk:
		if rs.h == nil {
			return false, corruptf("chunk before header")
		}
		layer, ts, tc, k, v, err := parseChunk(f.payload)
		if err != nil {
			return false, err
		}
		if err := rs.t.chunk(layer, ts, tc, len(k), len(v)); err != nil {
			return false, corruptf("%v", err)
		}
		if err := rs.sink.Chunk(layer, ts, tc, k, v); err != nil {
			return false, fmt.Errorf("kvwire: sink chunk layer %d [%d, +%d): %w", layer, ts, tc, err)
		}
		st.Chunks++
		st.PayloadBytes += int64(len(k) + len(v))
	case frameState:
		if rs.h == nil {
			return false, corruptf("state before header")
		}
		var layer, te int
		if layer, te, rs.arrays, err = parseState(f.payload, rs.arrays); err != nil {
			return false, err
		}
		var n int64
		for _, a := range rs.arrays {
			n += int64(len(a))
		}
		if err := rs.t.state(layer, te, n); err != nil {
			return false, corruptf("%v", err)
		}
		if err := rs.sink.State(layer, te, rs.arrays); err != nil {
			return false, fmt.Errorf("kvwire: sink state layer %d: %w", layer, err)
		}
		st.States++
		st.PayloadBytes += n
	case frameDone:
		if rs.h == nil {
			return false, corruptf("done before header")
		}
		tot, err := parseDone(f.payload)
		if err != nil {
			return false, err
		}
		if tot != rs.t.totals {
			return false, corruptf("done reports %+v, received %+v", tot, rs.t.totals)
		}
		if err := rs.t.complete(); err != nil {
			return false, corruptf("%v", err)
		}
		if err := rs.sink.Done(tot); err != nil {
			return false, fmt.Errorf("kvwire: sink done: %w", err)
		}
		return true, nil
	default:
		return false, corruptf("unexpected frame type %d from the server", f.typ)
	}
	return false, nil
}

// handshake exchanges Hellos and authenticates.
func (c *Client) handshake(conn net.Conn, br *bufio.Reader, st *Stats) error {
	var cn [32]byte
	rand.Read(cn[:])
	var flags uint16
	if len(c.cfg.Secret) > 0 {
		flags |= flagHasSecret
	}
	var hello [helloSize]byte
	putHello(hello[:], Version, flags, &cn)
	if _, err := conn.Write(hello[:]); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	if _, err := io.ReadFull(br, hello[:]); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	st.WireBytes += helloSize
	_, sflags, sn, err := parseHello(hello[:])
	if err != nil {
		return fmt.Errorf("server %s: %w", conn.RemoteAddr(), err)
	}
	st.serverFlags = sflags
	switch {
	case sflags&flagAuthRequired != 0 && len(c.cfg.Secret) == 0:
		return fmt.Errorf("%w: server requires a secret and none is configured", ErrAuth)
	case sflags&flagAuthRequired == 0 && len(c.cfg.Secret) > 0:
		return fmt.Errorf("%w: server does not authenticate; refusing unauthenticated KV", ErrAuth)
	case len(c.cfg.Secret) > 0:
		if _, err := conn.Write(smallFrame(frameAuthProof, authMAC(c.cfg.Secret, "client", &sn, &cn))); err != nil {
			return fmt.Errorf("write auth proof: %w", err)
		}
		f := readFrame(br, nil, c.cfg.Limits)
		if f.err != nil {
			return fmt.Errorf("read auth reply: %w", f.err)
		}
		st.WireBytes += int64(frameHeaderSize + len(f.payload))
		if err := f.check(); err != nil {
			return err
		}
		switch f.typ {
		case frameError:
			return parseError(f.payload)
		case frameAuthOK:
			if !hmac.Equal(f.payload, authMAC(c.cfg.Secret, "server", &sn, &cn)) {
				return fmt.Errorf("%w: the server's proof is wrong (it does not know the secret)", ErrAuth)
			}
		default:
			return corruptf("frame type %d where auth reply belongs", f.typ)
		}
	}
	return nil
}

// connect dials addr and exchanges Hellos (and authenticates), all within
// ConnectTimeout. The returned connection has no deadline set.
func (c *Client) connect(ctx context.Context, addr string, st *Stats) (net.Conn, *bufio.Reader, error) {
	hctx, hcancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer hcancel()
	dctx, dcancel := context.WithTimeout(hctx, c.cfg.DialTimeout)
	conn, err := c.cfg.Dial(dctx, "tcp", addr)
	dcancel()
	if err != nil {
		return nil, nil, c.netErr(ctx, fmt.Errorf("dial %s: %w", addr, err))
	}
	dl, _ := hctx.Deadline()
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	// Small: large payloads bypass it and go straight into frame buffers.
	br := bufio.NewReaderSize(conn, 16<<10)
	if err := c.handshake(conn, br, st); err != nil {
		conn.Close()
		if ctx.Err() == nil && errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w: %s did not answer the hello within %v: %w", ErrTimeout, addr, c.cfg.ConnectTimeout, err)
		}
		return nil, nil, c.netErr(ctx, err)
	}
	if !stop() { // ctx ended during the handshake: its deadline poisoned conn
		conn.Close()
		return nil, nil, c.netErr(ctx, ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	return conn, br, nil
}

// Ping checks that a server at addr is alive: it connects and exchanges
// Hellos (and authenticates) within ConnectTimeout, then closes the
// connection without a request. It answers nil, or an error wrapping
// ErrTimeout, ErrClosed, ErrAuth or ErrVersion.
func (c *Client) Ping(ctx context.Context, addr string) error {
	var st Stats
	conn, _, err := c.connect(ctx, addr, &st)
	if err != nil {
		return err
	}
	return conn.Close()
}

// checkHeader refuses a header that does not fit the request or the model.
func checkHeader(h *Header, req *Request, exp *Expect) error {
	if h.TokenStart != req.StartPos || h.TokenEnd > len(req.Tokens) {
		return corruptf("header token range [%d, %d) for start_pos %d and %d tokens", h.TokenStart, h.TokenEnd, req.StartPos, len(req.Tokens))
	}
	if req.DType != 0 && h.DType != req.DType {
		return fmt.Errorf("%w: server sends %v, requested %v", ErrMismatch, h.DType, req.DType)
	}
	if req.HasRange() {
		if h.FirstLayer != req.LayerStart || h.Layers() != req.LayerEnd-req.LayerStart {
			return fmt.Errorf("%w: server sends layers [%d, %d), requested [%d, %d)", ErrMismatch,
				h.FirstLayer, h.FirstLayer+h.Layers(), req.LayerStart, req.LayerEnd)
		}
	} else if h.FirstLayer != 0 {
		return fmt.Errorf("%w: server sends layers [%d, %d), requested every layer", ErrMismatch, h.FirstLayer, h.FirstLayer+h.Layers())
	}
	if req.HasHeads() {
		if h.FirstHead != req.HeadStart || h.KVHeads != req.HeadEnd-req.HeadStart {
			return fmt.Errorf("%w: server sends kv heads [%d, %d), requested [%d, %d)", ErrMismatch,
				h.FirstHead, h.FirstHead+h.KVHeads, req.HeadStart, req.HeadEnd)
		}
	} else if h.FirstHead != 0 {
		return fmt.Errorf("%w: server sends kv heads [%d, %d), requested every head", ErrMismatch, h.FirstHead, h.FirstHead+h.KVHeads)
	}
	if exp == nil {
		return nil
	}
	if h.Fingerprint != exp.Fingerprint {
		return fmt.Errorf("%w: server fingerprint %v, ours %v", ErrMismatch, h.Fingerprint, exp.Fingerprint)
	}
	if h.KVHeads != exp.KVHeads || h.HeadDim != exp.HeadDim || len(h.Kinds) != len(exp.Kinds) {
		return fmt.Errorf("%w: server geometry %d layers × %d kv heads × %d head dim, ours %d × %d × %d",
			ErrMismatch, len(h.Kinds), h.KVHeads, h.HeadDim, len(exp.Kinds), exp.KVHeads, exp.HeadDim)
	}
	for i := range h.Kinds {
		if h.Kinds[i] != exp.Kinds[i] {
			return fmt.Errorf("%w: layer %d is %v on the server, %v here", ErrMismatch, i, h.Kinds[i], exp.Kinds[i])
		}
		var w int
		if exp.Windows != nil {
			w = exp.Windows[i]
		}
		if h.Window(i) != w {
			return fmt.Errorf("%w: layer %d has window %d on the server, %d here", ErrMismatch, i, h.Window(i), w)
		}
	}
	return nil
}

// netErr classifies a network error: the caller's context first, then
// timeouts, then everything else as a closed connection. Errors that
// already carry a sentinel pass through.
func (c *Client) netErr(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
		// The socket deadline (set to ctx's) fired before ctx's own timer.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w (%v)", ErrTimeout, cerr, err)
		}
		return fmt.Errorf("kvwire: %w (%v)", cerr, err)
	}
	for _, s := range []error{ErrBusy, ErrMismatch, ErrAuth, ErrCorrupt, ErrTimeout, ErrClosed, ErrRemoteInternal, ErrVersion, ErrBadRequest} {
		if errors.Is(err, s) {
			return err
		}
	}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated frame: %w", ErrClosed, err)
	}
	// EOF, reset, broken pipe, refused, unreachable: the peer is not there.
	return fmt.Errorf("%w: %w", ErrClosed, err)
}
