package kvwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

func tokens(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i*7 + 1)
	}
	return t
}

func smallModel() *testModel {
	return &testModel{fp: Fingerprint{1, 2, 3}, kinds: []LayerKind{0, 0, 0}, kvHeads: 2, headDim: 8, dtype: DTypeBF16, block: 16, tail: 1}
}

func TestRoundTrip(t *testing.T) {
	hybrid := &testModel{fp: Fingerprint{9}, kinds: []LayerKind{LayerAttention, LayerRecurrent, LayerRecurrent, LayerAttention}, kvHeads: 4, headDim: 16, dtype: DTypeF16, block: 7, tail: 2}
	f32 := &testModel{fp: Fingerprint{7}, kinds: make([]LayerKind, 5), kvHeads: 1, headDim: 64, dtype: DTypeF32, block: 512, tail: 1}
	cases := []struct {
		name     string
		m        *testModel
		n, start int
		secret   string
		dtype    DType
	}{
		{"bf16 attention", smallModel(), 100, 0, "", 0},
		{"start_pos > 0", smallModel(), 100, 37, "", DTypeBF16},
		{"one block", f32, 300, 0, "", DTypeF32},
		{"many blocks f32", f32, 2000, 3, "", 0},
		{"hybrid states", hybrid, 50, 5, "", 0},
		{"empty range", smallModel(), 10, 9, "", 0},
		{"authenticated", hybrid, 64, 0, "s3cret", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := startServer(t, ServerConfig{Producer: tc.m.producer(), Secret: []byte(tc.secret)})
			c := NewClient(ClientConfig{Secret: []byte(tc.secret)})
			req := &Request{ID: "r1", Model: "m", Fingerprint: tc.m.fp, Tokens: tokens(tc.n), StartPos: tc.start, DType: tc.dtype, Deadline: time.Minute}
			sink := &recordSink{}
			st, err := c.Fetch(context.Background(), addr, req, tc.m.expect(), sink)
			if err != nil {
				t.Fatal(err)
			}
			sink.verify(t, tc.m, req)
			if st.Chunks != len(sink.chunks) || st.PayloadBytes != sink.totals.PayloadBytes || st.WireBytes <= st.PayloadBytes ||
				st.Duration <= 0 || st.FirstHeader <= 0 || st.FirstHeader > st.Duration || st.WireWait <= 0 || st.WireWait > st.Duration {
				t.Errorf("stats %+v, totals %+v", st, sink.totals)
			}
		})
	}
}

// TestFrameCodecs round-trips every frame type through encode → readFrame → parse.
func TestFrameCodecs(t *testing.T) {
	lim := Limits{}.withDefaults()
	read := func(b []byte) rawFrame {
		t.Helper()
		f := readFrame(bytes.NewReader(b), nil, lim)
		if f.err != nil {
			t.Fatal(f.err)
		}
		if err := f.check(); err != nil {
			t.Fatal(err)
		}
		return f
	}
	req := &Request{ID: "id-1", Model: "qwen", Fingerprint: Fingerprint{5}, Tokens: []int32{1, 2, 3, 1 << 30}, StartPos: 2, DType: DTypeF16, Deadline: 1500 * time.Millisecond}
	b, err := encodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseRequest(read(b).payload, lim)
	if err != nil || fmt.Sprint(*got) != fmt.Sprint(*req) {
		t.Fatalf("request %+v, %v; want %+v", got, err, req)
	}
	h := &Header{Fingerprint: Fingerprint{1}, DType: DTypeBF16, KVHeads: 8, HeadDim: 128, Kinds: []LayerKind{0, 1, 0}, TokenStart: 3, TokenEnd: 99}
	gh, err := parseHeader(read(encodeHeader(h)).payload)
	if err != nil || fmt.Sprint(*gh) != fmt.Sprint(*h) {
		t.Fatalf("header %+v, %v", gh, err)
	}
	h = &Header{Fingerprint: Fingerprint{1}, DType: DTypeBF16, KVHeads: 8, HeadDim: 128, Kinds: []LayerKind{0, 0, 1}, Windows: []int{128, 0, 0}, TokenStart: 3, TokenEnd: 999}
	gh, err = parseHeader(read(encodeHeader(h)).payload)
	if err != nil || fmt.Sprint(*gh) != fmt.Sprint(*h) || gh.LayerStart(0) != 999-127 || gh.LayerStart(1) != 3 {
		t.Fatalf("header with windows %+v, %v", gh, err)
	}
	for _, bad := range []*Header{
		{DType: DTypeBF16, KVHeads: 1, HeadDim: 1, Kinds: []LayerKind{0, 1}, Windows: []int{0, 4}}, // recurrent with a window
		{DType: DTypeBF16, KVHeads: 1, HeadDim: 1, Kinds: []LayerKind{0, 0}, Windows: []int{4}},    // windows for one layer of two
	} {
		if validateHeader(bad) == nil {
			t.Fatalf("header %+v accepted", bad)
		}
	}
	k, v := []byte("kkkkkkkk"), []byte("vvvvvvvv")
	hdr := make([]byte, frameHeaderSize+chunkPrefixSize)
	putChunkPrefix(hdr, 2, 10, 4, k, v)
	f := read(bytes.Join([][]byte{hdr, k, v}, nil))
	l, s, n, gk, gv, err := parseChunk(f.payload)
	if err != nil || l != 2 || s != 10 || n != 4 || !bytes.Equal(gk, k) || !bytes.Equal(gv, v) {
		t.Fatalf("chunk %d %d %d %q %q %v", l, s, n, gk, gv, err)
	}
	arrays := [][]byte{[]byte("abc"), {}, []byte("defg")}
	f = read(bytes.Join(append([][]byte{encodeStatePrefix(1, 42, arrays)}, arrays...), nil))
	l, e, ga, err := parseState(f.payload, nil)
	if err != nil || l != 1 || e != 42 || len(ga) != 3 || string(ga[0]) != "abc" || len(ga[1]) != 0 || string(ga[2]) != "defg" {
		t.Fatalf("state %d %d %q %v", l, e, ga, err)
	}
	tot := Totals{TokenEnd: 99, Chunks: 7, States: 2, PayloadBytes: 1 << 40}
	if gt, err := parseDone(read(encodeDone(tot)).payload); err != nil || gt != tot {
		t.Fatalf("done %+v %v", gt, err)
	}
	rerr := parseError(read(encodeError(codeBusy, "queue full")).payload)
	var re *RemoteError
	if !errors.As(rerr, &re) || re.Code != codeBusy || re.Reason != "queue full" || !errors.Is(rerr, ErrBusy) {
		t.Fatalf("error frame %v", rerr)
	}
	long := parseError(read(encodeError(codeInternal, strings.Repeat("é", 2000))).payload)
	if !errors.As(long, &re) || len(re.Reason) > maxReasonLen || !errors.Is(long, ErrRemoteInternal) {
		t.Fatalf("long reason %v", long)
	}
	if f := read(smallFrame(frameKeepalive, nil)); f.typ != frameKeepalive || len(f.payload) != 0 {
		t.Fatalf("keepalive %+v", f)
	}
	mac := bytes.Repeat([]byte{3}, macSize)
	for _, typ := range []uint8{frameAuthProof, frameAuthOK} {
		if f := read(smallFrame(typ, mac)); f.typ != typ || !bytes.Equal(f.payload, mac) {
			t.Fatalf("auth frame %d %+v", typ, f)
		}
	}
}

// fakeHello reads the client's Hello and answers with version v and the
// given magic; then it reads the request.
func fakeHello(c net.Conn, m [4]byte, v uint16) {
	var b [helloSize]byte
	io.ReadFull(c, b[:])
	var n [32]byte
	putHello(b[:], v, 0, &n)
	copy(b[:4], m[:])
	c.Write(b[:])
}

func readRequest(c net.Conn) *Request {
	f := readFrame(c, nil, Limits{}.withDefaults())
	if f.err != nil {
		return nil
	}
	r, _ := parseRequest(f.payload, Limits{}.withDefaults())
	return r
}

// scripted answers a Hello and a request with raw frames.
func scripted(frames ...[]byte) func(c net.Conn) {
	return func(c net.Conn) {
		fakeHello(c, magic, Version)
		readRequest(c)
		for _, f := range frames {
			c.Write(f)
		}
	}
}

func chunkFrame(layer, start, n int, k, v []byte) []byte {
	hdr := make([]byte, frameHeaderSize+chunkPrefixSize)
	putChunkPrefix(hdr, layer, start, n, k, v)
	return bytes.Join([][]byte{hdr, k, v}, nil)
}

func TestClientErrors(t *testing.T) {
	m := smallModel()
	req := func() *Request { return &Request{ID: "e", Model: "m", Tokens: tokens(40), StartPos: 0} }
	hdr := m.header(req())
	goodHeader := encodeHeader(&hdr)
	k, v := m.chunkBytes(0, 0, 16)
	oversize := make([]byte, frameHeaderSize)
	putFrameHeader(oversize, frameChunk, DefaultMaxFrame+1)
	blocked := make(chan struct{})
	t.Cleanup(func() { close(blocked) })
	blockProducer := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-blocked:
			return nil
		}
	})
	realSrv := func(cfg ServerConfig) func(t *testing.T) string {
		return func(t *testing.T) string {
			if cfg.Producer == nil {
				cfg.Producer = m.producer()
			}
			a, _ := startServer(t, cfg)
			return a
		}
	}
	fake := func(script func(c net.Conn)) func(t *testing.T) string {
		return func(t *testing.T) string { return testutil.Peer(t, script) }
	}
	flipAt := func(at int64) func(t *testing.T) string {
		return func(t *testing.T) string {
			a, _ := startServer(t, ServerConfig{Producer: m.producer()})
			return startProxy(t, &proxy{target: a, mangle: func(off int64, b []byte) (int, bool) {
				if at >= off && at < off+int64(len(b)) {
					b[at-off] ^= 0x20
				}
				return len(b), false
			}})
		}
	}
	cutAt := func(at int64) func(t *testing.T) string {
		return func(t *testing.T) string {
			a, _ := startServer(t, ServerConfig{Producer: m.producer()})
			return startProxy(t, &proxy{target: a, mangle: func(off int64, b []byte) (int, bool) {
				if off+int64(len(b)) >= at {
					return int(at - off), true
				}
				return len(b), false
			}})
		}
	}
	// Offsets into the server→client stream: hello, header frame, first chunk frame.
	chunk0 := int64(helloSize + len(goodHeader))
	cases := []struct {
		name    string
		server  func(t *testing.T) string
		client  ClientConfig
		req     *Request
		exp     *Expect
		want    error
		noBegin bool
	}{
		{name: "wrong magic", server: fake(func(c net.Conn) { fakeHello(c, [4]byte{'H', 'T', 'T', 'P'}, Version) }), want: ErrVersion},
		{name: "wrong version", server: fake(func(c net.Conn) { fakeHello(c, magic, Version+1) }), want: ErrVersion},
		{name: "older server (version 4, no layer ranges)", server: fake(func(c net.Conn) { fakeHello(c, magic, 4) }), want: ErrVersion},
		{name: "older server (version 5, no head ranges)", server: fake(func(c net.Conn) { fakeHello(c, magic, 5) }), want: ErrVersion},
		{name: "wrong secret", server: realSrv(ServerConfig{Secret: []byte("a")}), client: ClientConfig{Secret: []byte("b")}, want: ErrAuth},
		{name: "no secret when required", server: realSrv(ServerConfig{Secret: []byte("a")}), want: ErrAuth},
		{name: "secret but server does not authenticate", server: realSrv(ServerConfig{}), client: ClientConfig{Secret: []byte("a")}, want: ErrAuth},
		{name: "truncated frame", server: cutAt(chunk0 + 100), want: ErrClosed},
		{name: "server closes between frames", server: cutAt(chunk0), want: ErrClosed},
		{name: "flipped byte in chunk payload", server: flipAt(chunk0 + 40), want: ErrCorrupt},
		{name: "flipped byte in frame header", server: flipAt(chunk0 + 9), want: ErrCorrupt},
		{name: "flipped byte in header frame", server: flipAt(helloSize + 20), want: ErrCorrupt},
		{name: "oversize length", server: fake(scripted(goodHeader, oversize)), want: ErrCorrupt},
		{name: "unknown frame type", server: fake(scripted(goodHeader, smallFrame(77, nil))), want: ErrCorrupt},
		{name: "chunk before header", server: fake(scripted(chunkFrame(0, 0, 16, k, v))), want: ErrCorrupt},
		{name: "chunk out of order", server: fake(scripted(goodHeader, chunkFrame(0, 16, 16, k, v))), want: ErrCorrupt},
		{name: "chunk wrong size", server: fake(scripted(goodHeader, chunkFrame(0, 0, 15, k, v))), want: ErrCorrupt},
		{name: "done with wrong totals", server: fake(scripted(goodHeader, encodeDone(Totals{TokenEnd: 39}))), want: ErrCorrupt},
		{name: "request frame from server", server: fake(scripted(goodHeader, smallFrame(frameRequest, nil))), want: ErrCorrupt},
		{name: "wrong fingerprint", server: realSrv(ServerConfig{}), exp: &Expect{Fingerprint: Fingerprint{0xff}, Kinds: m.kinds, KVHeads: 2, HeadDim: 8}, want: ErrMismatch},
		{name: "wrong geometry", server: realSrv(ServerConfig{}), exp: &Expect{Fingerprint: m.fp, Kinds: m.kinds, KVHeads: 4, HeadDim: 8}, want: ErrMismatch},
		{name: "wrong layer count", server: realSrv(ServerConfig{}), exp: &Expect{Fingerprint: m.fp, Kinds: m.kinds[:2], KVHeads: 2, HeadDim: 8}, want: ErrMismatch},
		{name: "wrong dtype", server: realSrv(ServerConfig{}), req: &Request{Tokens: tokens(40), DType: DTypeF32}, want: ErrMismatch},
		{name: "producer refuses fingerprint", server: realSrv(ServerConfig{}), req: &Request{Tokens: tokens(40), Fingerprint: Fingerprint{8}}, want: ErrMismatch, noBegin: true},
		{name: "too many tokens", server: realSrv(ServerConfig{Limits: Limits{MaxTokens: 10}}), want: ErrBadRequest, noBegin: true},
		{name: "producer fails", server: realSrv(ServerConfig{Producer: ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
			return errors.New("out of memory")
		})}), want: ErrRemoteInternal, noBegin: true},
		{name: "producer panics", server: realSrv(ServerConfig{Producer: ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
			panic("boom")
		})}), want: ErrRemoteInternal, noBegin: true},
		{name: "producer stops early", server: realSrv(ServerConfig{Producer: ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
			return e.Header(m.header(r))
		})}), want: ErrRemoteInternal},
		{name: "request deadline on the server", server: realSrv(ServerConfig{Producer: blockProducer}), req: &Request{Tokens: tokens(40), Deadline: 50 * time.Millisecond}, want: ErrTimeout, noBegin: true},
		{name: "no deadline sent: the server's MaxDuration", server: realSrv(ServerConfig{Producer: blockProducer, MaxDuration: 50 * time.Millisecond}), req: &Request{Tokens: tokens(40)}, want: ErrTimeout, noBegin: true},
		{name: "silent server (hello timeout)", server: fake(func(c net.Conn) { io.Copy(io.Discard, c) }), client: ClientConfig{ConnectTimeout: 100 * time.Millisecond}, want: ErrTimeout, noBegin: true},
		{name: "silent after the hello (idle timeout)", server: fake(func(c net.Conn) { fakeHello(c, magic, Version); io.Copy(io.Discard, c) }), client: ClientConfig{IdleTimeout: 100 * time.Millisecond}, want: ErrTimeout, noBegin: true},
		{name: "connection refused", server: func(t *testing.T) string {
			l, _ := net.Listen("tcp", "127.0.0.1:0")
			a := l.Addr().String()
			l.Close()
			return a
		}, want: ErrClosed, noBegin: true},
		{name: "network not allowed", server: realSrv(ServerConfig{AllowedNets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}), want: ErrClosed, noBegin: true},
		{name: "sink fails", server: realSrv(ServerConfig{}), want: errSinkFull},
		{name: "bad request locally", server: realSrv(ServerConfig{}), req: &Request{Tokens: tokens(4), StartPos: 4}, want: ErrBadRequest, noBegin: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.server(t)
			r := tc.req
			if r == nil {
				r = req()
			}
			exp := tc.exp
			if exp == nil {
				exp = m.expect()
			}
			sink := &recordSink{}
			if tc.want == errSinkFull {
				sink.failAt = 2
			}
			_, err := NewClient(tc.client).Fetch(context.Background(), addr, r, exp, sink)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			t.Logf("%v", err)
			if sink.rollbacks != 1 || sink.totals != nil {
				t.Fatalf("rollbacks %d, done %v", sink.rollbacks, sink.totals)
			}
			if tc.noBegin && sink.begins != 0 {
				t.Fatalf("sink began on a refused request")
			}
		})
	}
}

// rawServerExchange sends client bytes to a real server and returns what
// it answers until it closes.
func rawServerExchange(t *testing.T, cfg ServerConfig, send []byte) []byte {
	t.Helper()
	if cfg.Producer == nil {
		cfg.Producer = smallModel().producer()
	}
	addr, _ := startServer(t, cfg)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(send)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	out, _ := io.ReadAll(c)
	return out
}

// serverError returns the Error frame a server answered after its Hello.
func serverError(t *testing.T, out []byte) error {
	t.Helper()
	if len(out) < helloSize {
		t.Fatalf("server sent %d bytes", len(out))
	}
	f := readFrame(bytes.NewReader(out[helloSize:]), nil, Limits{}.withDefaults())
	if f.err != nil || f.check() != nil || f.typ != frameError {
		t.Fatalf("no error frame after hello: %+v", f)
	}
	return parseError(f.payload)
}

func TestServerRefuses(t *testing.T) {
	var n [32]byte
	hello := func(m [4]byte, v, flags uint16) []byte {
		b := make([]byte, helloSize)
		putHello(b, v, flags, &n)
		copy(b, m[:])
		return b
	}
	good := hello(magic, Version, 0)
	reqFrame, _ := encodeRequest(&Request{Tokens: tokens(8)})
	big := make([]byte, frameHeaderSize)
	putFrameHeader(big, frameRequest, 1<<30)
	flipped := bytes.Clone(reqFrame)
	flipped[frameHeaderSize+50] ^= 1
	cases := []struct {
		name string
		cfg  ServerConfig
		send []byte
		want error
	}{
		{"wrong magic", ServerConfig{}, hello([4]byte{'G', 'E', 'T', ' '}, Version, 0), ErrVersion},
		{"wrong version", ServerConfig{}, hello(magic, Version+1, 0), ErrVersion},
		{"older peer (version 1, no windows in the header)", ServerConfig{}, hello(magic, 1, 0), ErrVersion},
		{"older peer (version 2, no fp8 wire dtype)", ServerConfig{}, hello(magic, 2, 0), ErrVersion},
		{"older peer (version 3, no parallel streams)", ServerConfig{}, hello(magic, 3, 0), ErrVersion},
		{"older peer (version 4, no layer ranges)", ServerConfig{}, hello(magic, 4, 0), ErrVersion},
		{"older peer (version 5, no head ranges)", ServerConfig{}, hello(magic, 5, 0), ErrVersion},
		{"no secret when required", ServerConfig{Secret: []byte("x")}, good, ErrAuth},
		{"wrong proof", ServerConfig{Secret: []byte("x")}, append(hello(magic, Version, flagHasSecret), smallFrame(frameAuthProof, make([]byte, 32))...), ErrAuth},
		{"oversize request length", ServerConfig{}, append(bytes.Clone(good), big...), ErrBadRequest},
		{"request with flipped byte", ServerConfig{}, append(bytes.Clone(good), flipped...), ErrBadRequest},
		{"truncated request", ServerConfig{HandshakeTimeout: 200 * time.Millisecond}, append(bytes.Clone(good), reqFrame[:20]...), nil},
		{"too many tokens", ServerConfig{Limits: Limits{MaxTokens: 4}}, append(bytes.Clone(good), reqFrame...), ErrBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := rawServerExchange(t, tc.cfg, tc.send)
			if tc.want == nil {
				// The server gives up at its handshake deadline and closes
				// after its Hello, without a frame.
				if len(out) != helloSize {
					t.Fatalf("server sent %d bytes, want just its hello", len(out))
				}
				return
			}
			if err := serverError(t, out); !errors.Is(err, tc.want) {
				t.Fatalf("server answered %v, want %v", err, tc.want)
			}
			if _, _, _, err := parseHello(out[:helloSize]); err != nil {
				t.Fatalf("server hello: %v", err)
			}
		})
	}
}

func TestBusyAndFIFO(t *testing.T) {
	m := smallModel()
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	started := make(chan string, 8)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		mu.Lock()
		order = append(order, r.ID)
		mu.Unlock()
		started <- r.ID
		if r.ID == "first" {
			<-release
		}
		return m.producer()(ctx, r, e)
	})
	// Short idle timeouts: queued requests survive only thanks to keepalives.
	addr, srv := startServer(t, ServerConfig{Producer: p, MaxActive: 1, MaxQueue: 2, IdleTimeout: 400 * time.Millisecond})
	c := NewClient(ClientConfig{IdleTimeout: 400 * time.Millisecond})
	errs := make(chan error, 3)
	fetch := func(id string) {
		_, err := c.Fetch(context.Background(), addr, &Request{ID: id, Tokens: tokens(40)}, m.expect(), &recordSink{})
		errs <- err
	}
	go fetch("first")
	<-started
	go fetch("second")
	waitLoad(t, srv, 1)
	go fetch("third")
	waitLoad(t, srv, 2)
	_, err := c.Fetch(context.Background(), addr, &Request{ID: "fourth", Tokens: tokens(40)}, m.expect(), &recordSink{})
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("fourth: %v, want busy", err)
	}
	time.Sleep(1200 * time.Millisecond) // three times both idle timeouts
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[first second third]" {
		t.Fatalf("admission order %v", order)
	}
	// The server counts a transfer done after its handler returns, which
	// is after the client has read Done: wait for the count, do not race it
	// (a CI failure: Running 1 right after the last Fetch returned).
	waitIdle(t, srv)
}

func waitLoad(t *testing.T, srv *Server, waiting int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if srv.Load().Waiting == waiting {
			return
		}
	}
	t.Fatalf("load %+v, want %d waiting", srv.Load(), waiting)
}

// TestClientDisconnect: the client goes away mid-stream; the producer,
// blocked on a full queue or about to emit, stops at its next emit call.
func TestClientDisconnect(t *testing.T) {
	m := &testModel{fp: Fingerprint{4}, kinds: []LayerKind{0, 0}, kvHeads: 8, headDim: 128, dtype: DTypeBF16, block: 256, tail: 1}
	const blocks = 1000
	type result struct {
		emitted, afterCancel int
		err                  error
	}
	res := make(chan result, 1)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		h := m.header(r)
		h.TokenEnd = blocks * m.block
		if err := e.Header(h); err != nil {
			return err
		}
		k, v := m.chunkBytes(0, 0, m.block) // 512 KiB each
		var out result
		defer func() { res <- out }()
		for b := range blocks {
			for l := range m.kinds {
				cancelled := ctx.Err() != nil
				if out.err = e.Chunk(l, b*m.block, m.block, k, v); out.err != nil {
					return out.err
				}
				out.emitted++
				if cancelled {
					out.afterCancel++
				}
			}
		}
		return nil
	})
	addr, srv := startServer(t, ServerConfig{Producer: p, SendQueue: 2})
	sink := &recordSink{failAt: 3}
	req := &Request{Tokens: make([]int32, blocks*m.block+1)}
	_, err := NewClient(ClientConfig{}).Fetch(context.Background(), addr, req, m.expect(), sink)
	if !errors.Is(err, errSinkFull) {
		t.Fatalf("fetch: %v", err)
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("producer did not stop after the client went away")
	}
	if !errors.Is(r.err, ErrClosed) || r.afterCancel != 0 {
		t.Fatalf("producer stopped with %v after %d chunks, %d of them accepted after cancellation", r.err, r.emitted, r.afterCancel)
	}
	// What it emitted beyond what the client read is bounded by the send
	// queue and the socket buffers, not by the prompt.
	if r.emitted > 200 {
		t.Fatalf("producer emitted %d chunks for a client that read 3", r.emitted)
	}
	t.Logf("producer stopped after %d chunks (client read 3): %v", r.emitted, r.err)
	for deadline := time.Now().Add(10 * time.Second); srv.Load().Running != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("server still running the request")
		}
	}
}

// TestServerShutdownMidStream: the server stops (its context ends) while
// streaming; the client fails with ErrClosed and rolls back.
func TestServerShutdownMidStream(t *testing.T) {
	m := smallModel()
	emitted := make(chan struct{})
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		h := m.header(r)
		if err := e.Header(h); err != nil {
			return err
		}
		k, v := m.chunkBytes(0, 0, 1)
		if err := e.Chunk(0, 0, 1, k, v); err != nil {
			return err
		}
		close(emitted)
		<-ctx.Done()
		return ctx.Err()
	})
	srv, err := NewServer(ServerConfig{Producer: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := testutil.Serve(t, ctx, srv.Serve) // which must end without an error
	received := make(chan struct{})
	go func() { <-emitted; <-received; cancel() }()
	sink := &notifySink{recordSink: &recordSink{}, onChunk: func() { close(received) }}
	_, err = NewClient(ClientConfig{}).Fetch(context.Background(), addr, &Request{Tokens: tokens(40)}, m.expect(), sink)
	if !errors.Is(err, ErrClosed) || sink.rollbacks != 1 || sink.begins != 1 || len(sink.chunks) != 1 || sink.totals != nil {
		t.Fatalf("err %v, begins %d, rollbacks %d", err, sink.begins, sink.rollbacks)
	}
}

func TestClientContext(t *testing.T) {
	m := smallModel()
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		<-ctx.Done()
		return ctx.Err()
	})
	addr, _ := startServer(t, ServerConfig{Producer: p})
	c := NewClient(ClientConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Fetch(ctx, addr, &Request{Tokens: tokens(40)}, m.expect(), &recordSink{})
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = c.Fetch(ctx, addr, &Request{Tokens: tokens(40)}, m.expect(), &recordSink{})
	if !errors.Is(err, context.Canceled) || Retryable(err) {
		t.Fatalf("cancel: %v", err)
	}
}

// TestServerIdleWrite: a client that stops reading (but keeps the
// connection open) cannot hold the producer: the stalled write times out
// after IdleTimeout and the producer's next emit fails.
func TestServerIdleWrite(t *testing.T) {
	m := &testModel{fp: Fingerprint{4}, kinds: []LayerKind{0}, kvHeads: 8, headDim: 128, dtype: DTypeBF16, block: 512, tail: 1}
	stopped := make(chan error, 1)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		h := m.header(r)
		if err := e.Header(h); err != nil {
			stopped <- err
			return err
		}
		k, v := m.chunkBytes(0, 0, m.block)
		for s := 0; s+m.block <= h.TokenEnd; s += m.block {
			if err := e.Chunk(0, s, m.block, k, v); err != nil {
				stopped <- err
				return err
			}
		}
		stopped <- nil
		return nil
	})
	addr, _ := startServer(t, ServerConfig{Producer: p, IdleTimeout: 200 * time.Millisecond, SendQueue: 1})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10)
	var n [32]byte
	hello := make([]byte, helloSize)
	putHello(hello, Version, 0, &n)
	reqFrame, _ := encodeRequest(&Request{Tokens: make([]int32, 200*512+1)})
	c.Write(append(hello, reqFrame...))
	// Never read: the server's socket buffer and send queue fill up.
	select {
	case err := <-stopped:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("producer stopped with %v, want ErrClosed (write timeout)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("producer still running for a client that does not read")
	}
}

// notifySink is a recordSink that calls onChunk after its first chunk.
type notifySink struct {
	*recordSink
	onChunk func()
	once    sync.Once
}

func (s *notifySink) Chunk(layer, start, n int, k, v []byte) error {
	err := s.recordSink.Chunk(layer, start, n, k, v)
	s.once.Do(s.onChunk)
	return err
}

// TestServerDrain: with DrainGrace, a server whose context ends stops
// accepting at once but lets the transfer in hand finish (a prefill
// runner's SIGTERM on a reload no longer throws away a prompt half
// prefilled); Serve returns once it has.
func TestServerDrain(t *testing.T) {
	m := smallModel()
	started, release := make(chan struct{}), make(chan struct{})
	full := m.producer()
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return full(ctx, r, e)
	})
	srv, err := NewServer(ServerConfig{Producer: p, DrainGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	fetched := make(chan error, 1)
	sink := &recordSink{}
	go func() {
		_, err := NewClient(ClientConfig{}).Fetch(context.Background(), addr, &Request{Tokens: tokens(40)}, m.expect(), sink)
		fetched <- err
	}()
	<-started
	cancel()
	// Accepting has stopped: a new connection is refused.
	testutil.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, "the listener still accepts")
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with a transfer in hand", err)
	default:
	}
	close(release)
	if err := <-fetched; err != nil || sink.rollbacks != 0 {
		t.Fatalf("the transfer in hand: %v, rollbacks %d", err, sink.rollbacks)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
