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
	"net/netip"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/internal/wireauth"
)

// Producer computes the KV of a request and emits it. Produce is called
// once per admitted request, on its own goroutine. It must call e.Header
// once, then e.Chunk / e.State as KV becomes ready (in PROTOCOL.md §12
// order), and return nil when all of [TokenStart, TokenEnd) has been
// emitted; the server then sends Done. An error it returns is sent to the
// client as an Error frame: wrap ErrBadRequest, ErrBusy or ErrMismatch to
// pick the code, anything else is "internal". When ctx ends (client gone,
// deadline) every emit call fails, so a producer that stops at the first
// emit error stops within one chunk.
type Producer interface {
	Produce(ctx context.Context, req *Request, e *Emitter) error
}

// Follower is implemented by a Producer that can serve a request by
// following one it is producing now, sharing its computation: typically
// another pipeline stage's request for the same prompt and another layer
// range (PROTOCOL.md §19). The server asks Follow before admission; when
// it answers true the request takes no admission slot and the server calls
// Produce for it at once — always, even when its client is already gone —
// and Produce serves it from the computation it joined.
type Follower interface {
	Follow(req *Request) bool
}

// ProducerFunc adapts a function to Producer.
type ProducerFunc func(ctx context.Context, req *Request, e *Emitter) error

// Produce calls f.
func (f ProducerFunc) Produce(ctx context.Context, req *Request, e *Emitter) error {
	return f(ctx, req, e)
}

// ServerConfig configures a Server. Zero values take the defaults shown.
type ServerConfig struct {
	Producer Producer
	// Secret, when non-empty, requires clients to authenticate.
	Secret []byte
	// AllowedNets, when non-empty, drops connections from other sources.
	AllowedNets []netip.Prefix
	// MaxActive requests produce at once (default 1).
	MaxActive int
	// MaxQueue more wait in FIFO order (default 8; negative: none).
	MaxQueue int
	// SendQueue frames may wait between producer and socket (default 4).
	SendQueue int
	// MaxStreams bounds the connections one transfer may stripe its
	// chunks over (PROTOCOL.md §17; default and most: 16).
	MaxStreams int
	Limits     Limits
	// HandshakeTimeout bounds Hello + auth + Request (default 10 s).
	HandshakeTimeout time.Duration
	// DrainGrace: when Serve's context ends, accepting stops at once and
	// the connections in hand get this long to finish before they are cut
	// (0: cut at once).
	DrainGrace time.Duration
	// IdleTimeout bounds one frame write (default 30 s).
	IdleTimeout time.Duration
	// KeepaliveEvery: a Keepalive goes out after this long without other
	// frames (default 1 s, at most IdleTimeout/3), so that clients can
	// tell a stalled server from a busy one within a few seconds.
	KeepaliveEvery time.Duration
	// MaxDuration bounds a whole request (default 10 min); a request's own
	// deadline can only shorten it.
	MaxDuration time.Duration
	Logger      *slog.Logger
}

// Server serves KV streams. Create it with NewServer.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	adm   *admission
	joins joinRegistry
	wg    sync.WaitGroup
}

// NewServer checks cfg and fills in defaults.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Producer == nil {
		return nil, errors.New("kvwire: server needs a Producer")
	}
	if cfg.MaxActive <= 0 {
		cfg.MaxActive = 1
	}
	switch {
	case cfg.MaxQueue == 0:
		cfg.MaxQueue = 8
	case cfg.MaxQueue < 0:
		cfg.MaxQueue = 0
	}
	if cfg.SendQueue <= 0 {
		cfg.SendQueue = 4
	}
	if cfg.MaxStreams <= 0 || cfg.MaxStreams > MaxStreams {
		cfg.MaxStreams = MaxStreams
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Second
	}
	if cfg.MaxDuration <= 0 {
		cfg.MaxDuration = 10 * time.Minute
	}
	if cfg.KeepaliveEvery <= 0 {
		cfg.KeepaliveEvery = time.Second
	}
	cfg.KeepaliveEvery = min(cfg.KeepaliveEvery, cfg.IdleTimeout/3)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, adm: newAdmission(cfg.MaxActive, cfg.MaxQueue)}, nil
}

// Load is the server's admission state.
type Load struct {
	Running int // requests producing now
	Waiting int // requests queued for admission
}

// Load reports how many requests run and wait.
func (s *Server) Load() Load {
	r, w := s.adm.load()
	return Load{Running: r, Waiting: w}
}

// ListenAndServe listens on addr (TCP) and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("kvwire: listen %s: %w", addr, err)
	}
	return s.Serve(ctx, l)
}

// Serve accepts connections on l until ctx ends, then closes l, lets the
// running requests finish for DrainGrace, cancels those still running and
// waits for them. It returns nil after ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	// The connections run under their own context, cut DrainGrace after
	// ctx ends (or when Serve returns otherwise).
	conns, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	var timer *time.Timer
	var mu sync.Mutex
	stop := context.AfterFunc(ctx, func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		if s.cfg.DrainGrace <= 0 {
			cut()
			return
		}
		timer = time.AfterFunc(s.cfg.DrainGrace, cut)
	})
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if timer != nil {
			timer.Stop()
		}
	}()
	defer stop()
	defer s.wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				cut()
				return fmt.Errorf("kvwire: accept: %w", err)
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("kvwire: accept: %w", err)
			}
			// Out of file descriptors and the like: back off, keep serving.
			s.log.Warn("kvwire: accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !s.allowed(conn.RemoteAddr()) {
			s.log.Warn("kvwire: connection from a network not allowed", "remote", conn.RemoteAddr().String())
			conn.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(conns, conn)
		}()
	}
}

func (s *Server) allowed(a net.Addr) bool {
	if len(s.cfg.AllowedNets) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range s.cfg.AllowedNets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// handle runs one connection: handshake, request, admission, stream.
func (s *Server) handle(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	// Server shutdown aborts a handshake or a stalled write at once.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	log := s.log.With("remote", conn.RemoteAddr().String())
	req, jf, br, err := s.handshake(conn)
	if err == nil && jf != nil {
		s.serveJoin(conn, br, jf, log)
		return
	}
	if errors.Is(err, errProbe) {
		log.Debug("kvwire: pinged")
		return
	}
	if err != nil {
		log.Info("kvwire: handshake failed", "err", err)
		lingerClose(conn)
		return
	}
	log = log.With("req", req)
	if req.PrefixProbe {
		s.servePrefix(ctx, conn, req, log)
		return
	}
	s.stream(ctx, conn, br, req, log)
}

// handshake exchanges Hellos, authenticates and reads the Request, or a
// secondary's Join (returned as its payload). On a refusal it has already
// written the Error frame.
func (s *Server) handshake(conn net.Conn) (*Request, []byte, *bufio.Reader, error) {
	conn.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	br := bufio.NewReaderSize(conn, 16<<10)
	var ch [helloSize]byte
	if _, err := io.ReadFull(br, ch[:]); err != nil {
		return nil, nil, nil, fmt.Errorf("read hello: %w", err)
	}
	var nonce [32]byte
	rand.Read(nonce[:])
	var flags uint16
	if len(s.cfg.Secret) > 0 {
		flags |= flagAuthRequired
	}
	if _, ok := s.cfg.Producer.(PrefixProber); ok {
		flags |= flagPrefixProbe
	}
	var sh [helloSize]byte
	putHello(sh[:], Version, flags, &nonce)
	if _, err := conn.Write(sh[:]); err != nil {
		return nil, nil, nil, fmt.Errorf("write hello: %w", err)
	}
	_, cflags, cnonce, err := parseHello(ch[:])
	if err != nil {
		conn.Write(encodeError(codeVersion, err.Error()))
		return nil, nil, nil, err
	}
	if len(s.cfg.Secret) > 0 {
		if cflags&flagHasSecret == 0 {
			conn.Write(encodeError(codeAuth, "this server requires a secret and the client has none"))
			return nil, nil, nil, fmt.Errorf("%w: client has no secret", ErrAuth)
		}
		f := readFrame(br, nil, s.cfg.Limits)
		if f.err == nil {
			f.err = f.check()
		}
		if f.err != nil {
			return nil, nil, nil, fmt.Errorf("read auth proof: %w", f.err)
		}
		want := authMAC(s.cfg.Secret, "client", &nonce, &cnonce)
		if f.typ != frameAuthProof || !hmac.Equal(f.payload, want) {
			conn.Write(encodeError(codeAuth, "authentication failed"))
			return nil, nil, nil, fmt.Errorf("%w: wrong proof", ErrAuth)
		}
		if _, err := conn.Write(smallFrame(frameAuthOK, authMAC(s.cfg.Secret, "server", &nonce, &cnonce))); err != nil {
			return nil, nil, nil, fmt.Errorf("write auth ok: %w", err)
		}
	}
	f := readFrame(br, nil, s.cfg.Limits)
	if f.err == io.EOF { // a client's Ping: Hellos only, then a clean close
		return nil, nil, nil, errProbe
	}
	if f.err == nil {
		f.err = f.check()
	}
	if f.err == nil && f.typ == frameJoin {
		return nil, f.payload, br, nil
	}
	if f.err == nil && f.typ != frameRequest {
		f.err = corruptf("frame type %d where a request belongs", f.typ)
	}
	if f.err != nil {
		conn.Write(encodeError(codeBadRequest, f.err.Error()))
		return nil, nil, nil, fmt.Errorf("read request: %w", f.err)
	}
	req, err := parseRequest(f.payload, s.cfg.Limits)
	if err != nil {
		conn.Write(encodeError(codeBadRequest, err.Error()))
		return nil, nil, nil, err
	}
	return req, nil, br, nil
}

// serveJoin attaches a secondary connection to its transfer (PROTOCOL.md
// §17) and runs its writer until the transfer ends it.
func (s *Server) serveJoin(conn net.Conn, br *bufio.Reader, payload []byte, log *slog.Logger) {
	index, id, err := parseJoin(payload)
	var tr *transfer
	var w *writer
	if err == nil {
		tr, w, err = s.joins.join(id, index, conn, func(t *transfer) *writer {
			limitUnsent(conn, unsentLimit)
			return newWriter(conn, 1, s.cfg.IdleTimeout, s.cfg.KeepaliveEvery, t.bulk, t.gate)
		})
	}
	if err != nil {
		log.Info("kvwire: join refused", "err", err)
		conn.SetWriteDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
		conn.Write(encodeError(errorCode(err), err.Error()))
		lingerClose(conn)
		return
	}
	log.Debug("kvwire: stream joined", "index", index)
	// As on the primary: any read result means the client went away.
	go func() {
		var b [1]byte
		br.Read(b[:])
		tr.cancel(errClientGone)
	}()
	if err := w.run(); err != nil {
		tr.cancel(fmt.Errorf("%w: write stream %d: %w", ErrClosed, index, err))
	}
}

// lingerClose half-closes conn and discards what the client still sends
// (briefly), so that an Error frame just written reaches the client instead
// of being lost to a reset caused by unread request bytes.
func lingerClose(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(conn, 1<<20))
}

// authMAC is HMAC-SHA256(secret, "exo-kvwire/<Version> <role>" || sn || cn).
func authMAC(secret []byte, role string, sn, cn *[32]byte) []byte {
	return wireauth.MAC(secret, fmt.Sprintf("exo-kvwire/%d", Version), role, sn, cn)
}

var (
	errProbe      = errors.New("kvwire: ping (closed after the hello)")
	errClientGone = fmt.Errorf("%w: client went away", ErrClosed)
	errDeadline   = fmt.Errorf("%w: request deadline passed", ErrTimeout)
)

// stream admits the request, runs the producer and the socket writer.
func (s *Server) stream(parent context.Context, conn net.Conn, br *bufio.Reader, req *Request, log *slog.Logger) {
	d := s.cfg.MaxDuration
	if req.Deadline > 0 && req.Deadline < d {
		d = req.Deadline
	}
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	ctx, cancelT := context.WithTimeoutCause(ctx, d, errDeadline)
	defer cancelT()

	// The client sends nothing after its request: any read result means it
	// went away (or broke the protocol). Either way the producer stops.
	go func() {
		var b [1]byte
		br.Read(b[:])
		cancel(errClientGone)
	}()

	// A striped transfer (PROTOCOL.md §17): the Streams frame goes first,
	// before admission, so the secondaries join while the request waits.
	var tr *transfer
	var bulk chan *outFrame
	n := 1
	if req.Streams >= 2 {
		n = min(req.Streams, s.cfg.MaxStreams)
	}
	var streamsFrame []byte
	if n >= 2 {
		tr = s.joins.open(ctx, cancel, n, s.cfg.SendQueue, remoteAddr(conn), time.Now().Add(s.cfg.HandshakeTimeout))
		defer s.joins.forget(tr)
		bulk = tr.bulk
		streamsFrame = encodeStreams(n, &tr.id)
	} else if req.Streams >= 2 {
		streamsFrame = encodeStreams(1, &JoinID{})
	}
	var gate chan struct{}
	if tr != nil {
		gate = tr.gate
		limitUnsent(conn, unsentLimit)
	}
	w := newWriter(conn, s.cfg.SendQueue, s.cfg.IdleTimeout, s.cfg.KeepaliveEvery, bulk, gate)
	if streamsFrame != nil {
		w.q <- &outFrame{bufs: [][]byte{streamsFrame}} // the queue is empty: never blocks
	}
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		if err := w.run(); err != nil {
			cancel(fmt.Errorf("%w: write: %w", ErrClosed, err))
		}
	}()
	// finish ends the stream with last (Done when ok, else an Error or
	// nothing) on every connection: after a success it waits for the
	// secondaries still to join, since each must end with its Done.
	finish := func(last []byte, ok bool) {
		if tr != nil {
			if ok {
				if j := tr.waitJoined(); j < n-1 {
					log.Warn("kvwire: secondary streams did not join", "joined", j, "want", n-1)
					last = encodeError(codeInternal, fmt.Sprintf("%d of %d secondary streams joined", j, n-1))
				}
			}
			sec := tr.end()
			s.joins.forget(tr)
			tr.openGate()
			close(bulk)
			for _, sw := range sec {
				sw.closeWith(last)
			}
			w.closeWith(last)
			<-wdone
			for _, sw := range sec {
				<-sw.dead
			}
			return
		}
		w.closeWith(last)
		<-wdone
	}
	// gone closes every connection of the stream: the client is gone or
	// the server is stopping, and a stalled write must not hold us.
	gone := func() {
		conn.Close()
		if tr != nil {
			tr.closeConns()
		}
	}

	start := time.Now()
	if req.Model == ProbeModel {
		// A link probe: answered here, not queued behind prefills.
		s.serveProbe(ctx, req, w, bulk, finish, gone, log)
		return
	}
	if f, ok := s.cfg.Producer.(Follower); ok && f.Follow(req) {
		// Served by a computation already admitted (another stage's
		// request for the same prompt): no slot of its own.
		log.Debug("kvwire: following a request in progress")
	} else {
		if err := s.adm.acquire(ctx); err != nil {
			if errors.Is(err, ErrBusy) {
				log.Info("kvwire: busy", "err", err)
				finish(encodeError(codeBusy, err.Error()), false)
				return
			}
			cause := context.Cause(ctx)
			log.Info("kvwire: gave up waiting for admission", "err", cause)
			if errors.Is(cause, ErrClosed) || errors.Is(cause, context.Canceled) {
				gone()
			}
			finish(s.causeFrame(cause), false)
			return
		}
		defer s.adm.release()
		log.Debug("kvwire: admitted", "waited", time.Since(start))
	}

	e := &Emitter{ctx: ctx, w: w, bulk: bulk, lim: s.cfg.Limits, req: req}
	err := s.produce(ctx, req, e)
	switch {
	case err == nil && e.t == nil:
		err = fmt.Errorf("%w: producer emitted no header", ErrRemoteInternal)
	case err == nil:
		if cerr := e.t.complete(); cerr != nil {
			err = fmt.Errorf("%w: producer stopped early: %v", ErrRemoteInternal, cerr)
		}
	}
	if err == nil {
		finish(encodeDone(e.t.totals), true)
		log.Info("kvwire: sent", "chunks", e.t.totals.Chunks, "bytes", e.t.totals.PayloadBytes, "streams", n, "duration", time.Since(start))
		return
	}
	if ctx.Err() != nil {
		err = context.Cause(ctx)
		log.Info("kvwire: stopped", "err", err, "frames_emitted", e.emitted)
		if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) {
			// The peer is gone or the server is stopping: nothing more
			// will be said, and a stalled write must not hold us.
			gone()
		}
		finish(s.causeFrame(err), false)
		return
	}
	log.Warn("kvwire: producer failed", "err", err)
	finish(encodeError(errorCode(err), err.Error()), false)
}

// serveProbe streams a link probe (probe.go) and ends the stream like a
// produced request.
func (s *Server) serveProbe(ctx context.Context, req *Request, w *writer, bulk chan *outFrame, finish func([]byte, bool), gone func(), log *slog.Logger) {
	e := &Emitter{ctx: ctx, w: w, bulk: bulk, lim: s.cfg.Limits, req: req}
	err := produceProbe(req, e)
	if err == nil {
		if cerr := e.t.complete(); cerr != nil {
			err = fmt.Errorf("%w: probe stopped early: %v", ErrRemoteInternal, cerr)
		}
	}
	switch {
	case err == nil:
		finish(encodeDone(e.t.totals), true)
		log.Info("kvwire: probe sent", "bytes", e.t.totals.PayloadBytes)
	case ctx.Err() != nil:
		cause := context.Cause(ctx)
		if errors.Is(cause, ErrClosed) || errors.Is(cause, context.Canceled) {
			gone()
		}
		finish(s.causeFrame(cause), false)
	default:
		log.Info("kvwire: probe refused", "err", err)
		finish(encodeError(errorCode(err), err.Error()), false)
	}
}

// causeFrame is the Error frame for a context cause (nil when the client
// is gone and nothing can be told).
func (s *Server) causeFrame(cause error) []byte {
	if errors.Is(cause, ErrClosed) || errors.Is(cause, context.Canceled) {
		return nil
	}
	if errors.Is(cause, ErrTimeout) {
		return encodeError(codeTimeout, cause.Error())
	}
	return encodeError(codeInternal, cause.Error())
}

// produce runs the producer, turning a panic into an error.
func (s *Server) produce(ctx context.Context, req *Request, e *Emitter) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: producer panic: %v", ErrRemoteInternal, r)
		}
	}()
	return s.cfg.Producer.Produce(ctx, req, e)
}

// Emitter is how a Producer sends KV. Its methods must be called from one
// goroutine. They block while the send queue is full (a slow link stalls
// the producer) and fail once the request's context has ended.
type Emitter struct {
	ctx     context.Context
	w       *writer
	bulk    chan *outFrame // a striped transfer's shared chunk queue (nil: w's)
	lim     Limits
	req     *Request // the header must carry its layer range
	h       *Header
	t       *tracker
	emitted int
}

// Header sends the stream's header; call it once, before any KV.
func (e *Emitter) Header(h Header) error {
	if e.t != nil {
		return fmt.Errorf("%w: header emitted twice", ErrRemoteInternal)
	}
	if err := validateHeader(&h); err != nil {
		return fmt.Errorf("%w: %v", ErrRemoteInternal, err)
	}
	if r := e.req; r != nil && (h.FirstLayer != r.LayerStart || r.HasRange() && h.Layers() != r.LayerEnd-r.LayerStart) {
		return fmt.Errorf("%w: producer's header has layers [%d, %d), the request asks for [%d, %d)", ErrRemoteInternal,
			h.FirstLayer, h.FirstLayer+h.Layers(), r.LayerStart, r.LayerEnd)
	}
	if r := e.req; r != nil && (h.FirstHead != r.HeadStart || r.HasHeads() && h.KVHeads != r.HeadEnd-r.HeadStart) {
		return fmt.Errorf("%w: producer's header has kv heads [%d, %d), the request asks for [%d, %d)", ErrRemoteInternal,
			h.FirstHead, h.FirstHead+h.KVHeads, r.HeadStart, r.HeadEnd)
	}
	h.Kinds = append([]LayerKind(nil), h.Kinds...)
	e.h = &h
	e.t = newTracker(e.h, e.lim)
	return e.w.send(e.ctx, &outFrame{bufs: [][]byte{encodeHeader(e.h)}})
}

// Chunk sends K and V of positions [tokenStart, tokenStart+tokenCount) of
// an attention layer, each [kv_heads, tokenCount, head_dim] in the header's
// dtype. The emitter keeps k and v until the frame is written: the caller
// must not modify them after the call. The CRC is computed here, on the
// producer's goroutine, not on the socket's.
func (e *Emitter) Chunk(layer, tokenStart, tokenCount int, k, v []byte) error {
	if err := e.ready(); err != nil {
		return err
	}
	if err := e.t.chunk(layer, tokenStart, tokenCount, len(k), len(v)); err != nil {
		return fmt.Errorf("%w: %v", ErrRemoteInternal, err)
	}
	hdr := make([]byte, frameHeaderSize+chunkPrefixSize)
	putChunkPrefix(hdr, layer, tokenStart, tokenCount, k, v)
	e.emitted++
	f := &outFrame{bufs: [][]byte{hdr, k, v}}
	if e.bulk == nil {
		return e.w.send(e.ctx, f)
	}
	// Any of the transfer's writers takes it; each one's failure cancels
	// ctx, so this cannot wait forever.
	select {
	case e.bulk <- f:
		return nil
	case <-e.ctx.Done():
		return context.Cause(e.ctx)
	}
}

// State sends the state arrays of a recurrent layer after positions
// < tokenEnd. The same ownership rule as Chunk applies to arrays.
func (e *Emitter) State(layer, tokenEnd int, arrays ...[]byte) error {
	if err := e.ready(); err != nil {
		return err
	}
	if len(arrays) < 1 || len(arrays) > maxArrays {
		return fmt.Errorf("%w: %d state arrays (1..%d)", ErrRemoteInternal, len(arrays), maxArrays)
	}
	total := int64(stateFixed + 4*len(arrays))
	var sizes int64
	for _, a := range arrays {
		sizes += int64(len(a))
	}
	if total+sizes > int64(e.lim.MaxFrame) {
		return fmt.Errorf("%w: state frame of %d bytes exceeds the limit %d", ErrRemoteInternal, total+sizes, e.lim.MaxFrame)
	}
	if err := e.t.state(layer, tokenEnd, sizes); err != nil {
		return fmt.Errorf("%w: %v", ErrRemoteInternal, err)
	}
	bufs := make([][]byte, 0, 1+len(arrays))
	bufs = append(bufs, encodeStatePrefix(layer, tokenEnd, arrays))
	bufs = append(bufs, arrays...)
	e.emitted++
	return e.w.send(e.ctx, &outFrame{bufs: bufs})
}

func (e *Emitter) ready() error {
	if err := context.Cause(e.ctx); err != nil {
		return err
	}
	if e.t == nil {
		return fmt.Errorf("%w: KV emitted before the header", ErrRemoteInternal)
	}
	return nil
}

// ---- socket writer ----

type outFrame struct {
	bufs [][]byte
}

// writer owns a socket's write side: it drains its own bounded queue and,
// in a striped transfer (stripe.go), the transfer's shared chunk queue,
// with vectored writes; it sends Keepalives when both stay empty, and its
// last frame (Done or Error) once both are closed and drained.
type writer struct {
	conn net.Conn
	q    chan *outFrame
	bulk chan *outFrame // shared by the transfer's writers; nil: not striped
	gate chan struct{}  // bulk is taken from once this is closed (nil: at once)
	last []byte         // set before q is closed
	dead chan struct{}  // closed when run returns
	idle time.Duration
	keep time.Duration // Keepalive after this long without frames
}

func newWriter(conn net.Conn, depth int, idle, keep time.Duration, bulk chan *outFrame, gate chan struct{}) *writer {
	return &writer{conn: conn, q: make(chan *outFrame, depth), bulk: bulk, gate: gate, dead: make(chan struct{}), idle: idle, keep: keep}
}

// send queues f, blocking while the queue is full.
func (w *writer) send(ctx context.Context, f *outFrame) error {
	select {
	case w.q <- f:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-w.dead:
		return fmt.Errorf("%w: socket writer stopped", ErrClosed)
	}
}

// closeWith tells run to write last (when not nil) after what is queued,
// then return. The shared queue, if any, must be closed too.
func (w *writer) closeWith(last []byte) {
	w.last = last
	close(w.q)
}

func (w *writer) run() error {
	defer close(w.dead)
	keep := time.NewTimer(w.keep)
	defer keep.Stop()
	keepalive := smallFrame(frameKeepalive, nil)
	var batch net.Buffers
	q, bulk, gate := w.q, w.bulk, w.gate
	if gate != nil {
		bulk = nil // until the gate opens
	}
	open := func() bool { // the gate, without blocking
		if gate != nil {
			select {
			case <-gate:
				gate, bulk = nil, w.bulk
			default:
			}
		}
		return gate == nil
	}
	// take returns a queued frame, preferring q (the header and states
	// precede chunks), without blocking; ok is false when none is ready.
	take := func() (f *outFrame, ok bool) {
		for q != nil {
			select {
			case f, open := <-q:
				if open {
					return f, true
				}
				q = nil
				continue
			default:
			}
			break
		}
		for bulk != nil {
			select {
			case f, open := <-bulk:
				if open {
					return f, true
				}
				bulk = nil
				continue
			default:
			}
			break
		}
		return nil, false
	}
	for {
		open()
		f, ok := take()
		for !ok && (q != nil || bulk != nil || gate != nil) {
			select {
			case <-gate:
				gate, bulk = nil, w.bulk
				f, ok = take()
				continue
			case g, open := <-q:
				if !open {
					q = nil
				} else {
					f, ok = g, true
				}
			case g, open := <-bulk:
				if !open {
					bulk = nil
				} else {
					f, ok = g, true
				}
			case <-keep.C:
				f, ok = &outFrame{bufs: [][]byte{keepalive}}, true
			}
		}
		ending := !ok // both queues closed and drained, the gate open
		batch = batch[:0]
		if ok {
			batch = append(batch, f.bufs...)
		}
		// Coalesce whatever else is already queued into the same writev.
		for ok && len(batch) < 64 {
			var g *outFrame
			if g, ok = take(); ok {
				batch = append(batch, g.bufs...)
			}
		}
		// open() first: it may hand this writer the shared queue to drain.
		if open() && q == nil && bulk == nil && len(batch) < 64 {
			ending = true
			if w.last != nil {
				batch = append(batch, w.last)
			}
		}
		if len(batch) > 0 {
			w.conn.SetWriteDeadline(time.Now().Add(w.idle))
			b := batch
			_, err := b.WriteTo(w.conn)
			clear(batch)
			if err != nil {
				return err
			}
		}
		if ending {
			return nil
		}
		keep.Reset(w.keep)
	}
}

// ---- admission ----

// admission is a counting semaphore with a bounded FIFO queue.
type admission struct {
	mu        sync.Mutex
	active    int
	maxActive int
	maxQueue  int
	waiters   []chan struct{}
}

func newAdmission(maxActive, maxQueue int) *admission {
	return &admission{maxActive: maxActive, maxQueue: maxQueue}
}

func (a *admission) load() (running, waiting int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.active, len(a.waiters)
}

// acquire takes a slot, waiting in FIFO order; a full queue is ErrBusy.
func (a *admission) acquire(ctx context.Context) error {
	a.mu.Lock()
	if a.active < a.maxActive && len(a.waiters) == 0 {
		a.active++
		a.mu.Unlock()
		return nil
	}
	if len(a.waiters) >= a.maxQueue {
		r, w := a.active, len(a.waiters)
		a.mu.Unlock()
		return fmt.Errorf("%w: %d running, %d waiting", ErrBusy, r, w)
	}
	ch := make(chan struct{})
	a.waiters = append(a.waiters, ch)
	a.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, c := range a.waiters {
			if c == ch {
				a.waiters = append(a.waiters[:i], a.waiters[i+1:]...)
				return context.Cause(ctx)
			}
		}
		// Granted while giving up: pass the slot on.
		a.releaseLocked()
		return context.Cause(ctx)
	}
}

func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked()
}

func (a *admission) releaseLocked() {
	if len(a.waiters) > 0 {
		ch := a.waiters[0]
		a.waiters = a.waiters[1:]
		close(ch) // the slot passes to the first waiter
		return
	}
	a.active--
}
