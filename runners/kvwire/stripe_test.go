package kvwire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stripeProxy forwards each TCP connection to target, numbering them in
// accept order (0 is a transfer's primary: the client dials its
// secondaries only after the server's Streams frame). Server → client
// bytes of connection i are paced to rate(i) bytes/s (0: unlimited), and
// connection cut (when ≥ 0) is closed once cutAfter bytes have gone
// through it.
type stripeProxy struct {
	target   string
	rate     func(i int) float64
	cut      int
	cutAfter int64
	step     int64 // the pacer's step (proxy.step)
	conns    atomic.Int32
	cutDone  atomic.Bool
	l        net.Listener
	wg       sync.WaitGroup
}

func startStripeProxy(t testing.TB, p *stripeProxy) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.l = l
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			i := int(p.conns.Add(1)) - 1
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(i, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.wg.Wait()
	})
	return l.Addr().String()
}

func (p *stripeProxy) serve(i int, c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	// A small receive window: the link, not this socket's buffer, holds
	// what is in flight, so the server sees each connection's real pace.
	s.(*net.TCPConn).SetReadBuffer(64 << 10)
	go func() {
		io.Copy(s, c)
		s.(*net.TCPConn).CloseWrite()
	}()
	if i == p.cut {
		io.CopyN(c, s, p.cutAfter)
		p.cutDone.Store(true)
		return // both sides closed: a dropped connection
	}
	var rate float64
	if p.rate != nil {
		rate = p.rate(i)
	}
	(&proxy{rate: rate, step: p.step}).pace(c, s)
}

// layerStreams is what a sink received, per layer: the chunks' ranges and
// bytes in the order they were applied.
func layerStreams(s *recordSink) map[int][]recChunk {
	out := map[int][]recChunk{}
	for _, c := range s.chunks {
		out[c.layer] = append(out[c.layer], c)
	}
	return out
}

// TestStripedEqualsSingle: a transfer striped over N connections hands the
// sink, layer by layer, exactly the bytes the same transfer over one
// connection does, and commits the same totals and states.
func TestStripedEqualsSingle(t *testing.T) {
	hybrid := &testModel{fp: Fingerprint{9}, kinds: []LayerKind{LayerAttention, LayerRecurrent, LayerAttention, LayerAttention}, kvHeads: 2, headDim: 16, dtype: DTypeF16, block: 5, tail: 2}
	many := &testModel{fp: Fingerprint{7}, kinds: make([]LayerKind, 6), kvHeads: 2, headDim: 32, dtype: DTypeBF16, block: 8, tail: 1}
	cases := []struct {
		name     string
		m        *testModel
		n, start int
		streams  int
		secret   string
	}{
		{"2 streams", smallModel(), 200, 0, 2, ""},
		{"2 streams, past the primary's unsent limit", many, 1500, 0, 2, ""},
		{"4 streams, start_pos > 0", many, 300, 41, 4, ""},
		{"16 streams, authenticated", many, 500, 0, 16, "s3cret"},
		{"4 streams, recurrent states", hybrid, 120, 3, 4, "s3cret"},
		{"4 streams, fewer chunks than streams", smallModel(), 20, 0, 4, ""},
		{"4 streams, empty range", smallModel(), 10, 9, 4, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, srv := startServer(t, ServerConfig{Producer: tc.m.producer(), Secret: []byte(tc.secret)})
			c := NewClient(ClientConfig{Secret: []byte(tc.secret)})
			fetch := func(streams int) (*recordSink, Stats) {
				req := &Request{ID: "r", Model: "m", Fingerprint: tc.m.fp, Tokens: tokens(tc.n), StartPos: tc.start, Streams: streams, Deadline: time.Minute}
				sink := &recordSink{}
				st, err := c.Fetch(context.Background(), addr, req, tc.m.expect(), sink)
				if err != nil {
					t.Fatalf("%d streams: %v", streams, err)
				}
				if sink.rollbacks != 0 || sink.totals == nil {
					t.Fatalf("%d streams: %d rollbacks, totals %v", streams, sink.rollbacks, sink.totals)
				}
				return sink, st
			}
			one, st1 := fetch(1)
			many, stN := fetch(tc.streams)
			if st1.Streams != 1 || stN.Streams != tc.streams {
				t.Fatalf("streams used: %d and %d, want 1 and %d", st1.Streams, stN.Streams, tc.streams)
			}
			if *one.totals != *many.totals || stN.PayloadBytes != st1.PayloadBytes || stN.Chunks != st1.Chunks {
				t.Fatalf("totals %+v / %+v, stats %+v / %+v", one.totals, many.totals, st1, stN)
			}
			// Which connection takes a chunk is the scheduler's choice while
			// the primary can absorb the whole transfer; once the payload is
			// several times the primary's unsent limit, the primary must
			// block on its socket and the secondaries must carry a share.
			if st1.PayloadBytes >= 4*unsentLimit && stN.SecondaryChunks == 0 {
				t.Fatalf("no chunk of %d (%d bytes) came over a secondary connection", len(one.chunks), st1.PayloadBytes)
			}
			a, b := layerStreams(one), layerStreams(many)
			if len(a) != len(b) {
				t.Fatalf("%d layers vs %d", len(a), len(b))
			}
			for l, ca := range a {
				cb := b[l]
				if len(ca) != len(cb) {
					t.Fatalf("layer %d: %d chunks vs %d", l, len(ca), len(cb))
				}
				for i := range ca {
					x, y := ca[i], cb[i]
					if x.start != y.start || x.n != y.n || !bytes.Equal(x.k, y.k) || !bytes.Equal(x.v, y.v) {
						t.Fatalf("layer %d chunk %d: [%d,+%d) vs [%d,+%d) or bytes differ", l, i, x.start, x.n, y.start, y.n)
					}
				}
			}
			for l, s := range one.states {
				u := many.states[l]
				if s.end != u.end || !slices.EqualFunc(s.arrays, u.arrays, bytes.Equal) {
					t.Fatalf("layer %d state differs", l)
				}
			}
			many.verifyPerLayer(t, tc.m, &Request{Tokens: tokens(tc.n), StartPos: tc.start})
			waitIdle(t, srv)
		})
	}
}

// verifyPerLayer is verify for a sink whose layers may interleave in any
// order: each layer's chunks must be exactly what the producer sent.
func (s *recordSink) verifyPerLayer(t *testing.T, m *testModel, req *Request) {
	t.Helper()
	h := m.header(req)
	got := layerStreams(s)
	for l, kind := range m.kinds {
		if kind != LayerAttention {
			continue
		}
		i := 0
		for st := h.TokenStart; st < h.TokenEnd; st += m.block {
			n := min(m.block, h.TokenEnd-st)
			k, v := m.chunkBytes(l, st, n)
			if i >= len(got[l]) {
				t.Fatalf("layer %d: missing chunk at %d", l, st)
			}
			c := got[l][i]
			if c.start != st || c.n != n || !bytes.Equal(c.k, k) || !bytes.Equal(c.v, v) {
				t.Fatalf("layer %d chunk %d: [%d,+%d), want [%d,+%d) (or bytes differ)", l, i, c.start, c.n, st, n)
			}
			i++
		}
		if i != len(got[l]) {
			t.Fatalf("layer %d: %d chunks, want %d", l, len(got[l]), i)
		}
	}
}

// waitIdle waits until the server has no request running or waiting.
func waitIdle(t *testing.T, srv *Server) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if l := srv.Load(); l.Running == 0 && l.Waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server still busy: %+v", srv.Load())
		}
	}
}

// TestStripedOutOfOrder: the primary is paced slowly while the secondaries
// are not, so later chunks of a layer arrive before earlier ones; the
// sink still gets each layer in order and the right bytes.
func TestStripedOutOfOrder(t *testing.T) {
	m := &testModel{fp: Fingerprint{3}, kinds: make([]LayerKind, 4), kvHeads: 2, headDim: 64, dtype: DTypeBF16, block: 16, tail: 1}
	addr, _ := startServer(t, ServerConfig{Producer: m.producer()})
	// Paced in 4 KiB steps: with the default 256 KiB the primary's share
	// of this 0.8 MB transfer went through in its first burst, at full
	// speed, and whether any chunk waited was down to scheduling (a CI
	// failure: 77 of 100 chunks over secondaries, none waited).
	paddr := startStripeProxy(t, &stripeProxy{target: addr, cut: -1, step: 4 << 10, rate: func(i int) float64 {
		if i == 0 {
			return 200e3 // the primary: 200 kB/s
		}
		return 0
	}})
	c := NewClient(ClientConfig{})
	req := &Request{Tokens: tokens(400), Streams: 4, Deadline: time.Minute}
	sink := &recordSink{}
	st, err := c.Fetch(context.Background(), paddr, req, m.expect(), sink)
	if err != nil {
		t.Fatal(err)
	}
	sink.verifyPerLayer(t, m, req)
	t.Logf("%d chunks, %d over secondaries, %d waited for an earlier one", st.Chunks, st.SecondaryChunks, st.ChunksWaited)
	if sink.totals == nil || sink.rollbacks != 0 || st.Streams != 4 || st.SecondaryChunks <= st.Chunks/2 || st.ChunksWaited == 0 {
		t.Fatalf("stats %+v, rollbacks %d", st, sink.rollbacks)
	}
}

// TestReassemblerOrder drives the reassembler with frames in a crafted
// arrival order: stream 1's chunks (later positions of layers 0 and 1)
// before stream 0's, and the primary's Done before stream 1's.
func TestReassemblerOrder(t *testing.T) {
	m := smallModel()
	req := &Request{Tokens: tokens(33), Streams: 2}
	h := m.header(req) // [0, 32): two blocks of 16
	frame := func(b []byte) rawFrame {
		f := readFrame(bytes.NewReader(b), nil, Limits{}.withDefaults())
		if f.err != nil {
			t.Fatal(f.err)
		}
		return f
	}
	chunk := func(l, s int) rawFrame {
		k, v := m.chunkBytes(l, s, 16)
		return frame(chunkFrame(l, s, 16, k, v))
	}
	var tot Totals
	tot.TokenEnd, tot.Chunks = 32, 6
	tot.PayloadBytes = 6 * 2 * h.KVBytes(16)
	id := JoinID{1}
	var st Stats
	sink := &recordSink{}
	rs := &recvState{req: req, exp: m.expect(), sink: sink, lim: Limits{}.withDefaults(), st: &st}
	r := newReassembler(rs, 2)
	type ev struct {
		i int
		f rawFrame
	}
	order := []ev{
		{0, frame(encodeStreams(2, &id))},
		{1, chunk(0, 16)}, // waits for the header and for [0, 16)
		{1, chunk(1, 16)},
		{0, frame(encodeHeader(&h))},
		{1, chunk(2, 16)}, // waits behind layer 1's [16, 32)
		{0, chunk(0, 0)},
		{0, chunk(1, 0)},
		{0, chunk(2, 0)},
		{0, frame(encodeDone(tot))}, // waits for stream 1's Done
		{1, frame(encodeDone(tot))},
	}
	freed := 0
	for j, e := range order {
		r.push(e.i, e.f)
		g, done, err := r.step(func(int, []byte) { freed++ })
		if err != nil {
			t.Fatalf("after event %d: %v", j, err)
		}
		if j == 0 && g != 2 {
			t.Fatalf("streams granted %d", g)
		}
		if done != (j == len(order)-1) {
			t.Fatalf("event %d: done %v", j, done)
		}
	}
	if freed != len(order) || sink.totals == nil || *sink.totals != tot {
		t.Fatalf("freed %d of %d, totals %v", freed, len(order), sink.totals)
	}
	sink.verifyPerLayer(t, m, req)
	// Wire order was layer 0 [16,32) first; the sink must have seen every
	// layer's [0,16) before its [16,32).
	if st.SecondaryChunks != 3 {
		t.Fatalf("%d secondary chunks", st.SecondaryChunks)
	}

	// A gap nothing can fill: both streams hold a chunk that does not
	// continue its layer.
	sink2 := &recordSink{}
	rs2 := &recvState{req: req, exp: m.expect(), sink: sink2, lim: Limits{}.withDefaults(), st: &Stats{}}
	r2 := newReassembler(rs2, 2)
	var err error
	for _, e := range []ev{{0, frame(encodeStreams(2, &id))}, {0, frame(encodeHeader(&h))}, {0, frame(encodeDone(tot))}, {1, chunk(0, 16)}} {
		r2.push(e.i, e.f)
		if _, _, err = r2.step(func(int, []byte) {}); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("gap: %v, want ErrCorrupt", err)
	}
	// A secondary that sends a header, and a Done that differs.
	for name, evs := range map[string][]ev{
		"header on a secondary": {{0, frame(encodeStreams(2, &id))}, {1, frame(encodeHeader(&h))}},
		"done totals differ":    {{0, frame(encodeStreams(2, &id))}, {0, frame(encodeHeader(&h))}, {1, frame(encodeDone(Totals{TokenEnd: 32}))}, {0, frame(encodeDone(tot))}},
		"streams not asked for": {{0, frame(encodeStreams(2, &id))}},
		"header before streams": {{0, frame(encodeHeader(&h))}},
	} {
		asked := 2
		if name == "streams not asked for" {
			asked = 1
		}
		rs := &recvState{req: req, exp: m.expect(), sink: &recordSink{}, lim: Limits{}.withDefaults(), st: &Stats{}}
		r := newReassembler(rs, asked)
		var err error
		for _, e := range evs {
			r.push(e.i, e.f)
			if _, _, err = r.step(func(int, []byte) {}); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestStripedDroppedConnection: a connection (the primary or a secondary)
// dropped in the middle of the transfer, or a secondary that cannot even
// connect, fails the whole transfer with ErrClosed; the sink never commits
// and is rolled back; the server stops producing.
func TestStripedDroppedConnection(t *testing.T) {
	m := &testModel{fp: Fingerprint{3}, kinds: make([]LayerKind, 4), kvHeads: 2, headDim: 64, dtype: DTypeBF16, block: 16, tail: 1}
	for _, tc := range []struct {
		cut   int
		after int64
	}{{0, 40 << 10}, {2, 40 << 10}, {1, 0}} {
		t.Run(fmt.Sprintf("connection %d after %d bytes", tc.cut, tc.after), func(t *testing.T) {
			addr, srv := startServer(t, ServerConfig{Producer: m.producer()})
			p := &stripeProxy{target: addr, cut: tc.cut, cutAfter: tc.after, rate: func(int) float64 { return 2e6 }}
			paddr := startStripeProxy(t, p)
			c := NewClient(ClientConfig{})
			req := &Request{Tokens: tokens(2000), Streams: 4, Deadline: time.Minute}
			sink := &recordSink{}
			st, err := c.Fetch(context.Background(), paddr, req, m.expect(), sink)
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("err %v, want ErrClosed", err)
			}
			if !p.cutDone.Load() {
				t.Fatal("the proxy never cut the connection")
			}
			if sink.totals != nil || sink.rollbacks != 1 {
				t.Fatalf("committed %v, %d rollbacks", sink.totals, sink.rollbacks)
			}
			if tc.after == 0 { // the secondary never got its Hello: nothing applied
				if st.Chunks != 0 {
					t.Fatalf("%d chunks applied", st.Chunks)
				}
			} else if st.Chunks == 0 || st.Chunks >= len(m.kinds)*(2000/16) {
				t.Fatalf("%d chunks before the drop: the cut was not mid-transfer", st.Chunks)
			}
			waitIdle(t, srv)
		})
	}
}

// joinConn opens a connection to addr, exchanges Hellos (authenticating
// with secret) and sends a Join; it returns the server's first frame. The
// connection stays open until the test ends: closing it would tell the
// server the client went away.
func joinConn(t *testing.T, addr string, local string, secret []byte, index int, id JoinID) rawFrame {
	t.Helper()
	d := net.Dialer{Timeout: time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return rawFrame{err: err}
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	c := NewClient(ClientConfig{Secret: secret})
	br := bufioReader(conn)
	if err := c.handshake(conn, br, &Stats{}); err != nil {
		t.Error(err)
		return rawFrame{err: err}
	}
	conn.Write(encodeJoin(index, &id))
	f := readFrame(br, nil, Limits{}.withDefaults())
	if f.err == nil {
		f.err = f.check()
	}
	return f
}

// TestJoinRefused: a forged join id, a replayed one (an index already
// joined, or after every secondary has joined), an index beyond the
// grant, another source address and a join without the secret are all
// refused; the real transfer is unaffected by the forged attempts.
func TestJoinRefused(t *testing.T) {
	m := smallModel()
	secret := []byte("k")
	release := make(chan struct{})
	prod := ProducerFunc(func(ctx context.Context, req *Request, e *Emitter) error {
		select { // hold the transfer open while the test plays
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return m.producer()(ctx, req, e)
	})
	addr, srv := startServer(t, ServerConfig{Producer: prod, Secret: secret})
	cl := NewClient(ClientConfig{Secret: secret})
	// joined waits until the transfer of id has k secondaries (or is
	// forgotten, when k is all of them).
	joined := func(id JoinID, k int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			srv.joins.mu.Lock()
			tr := srv.joins.m[id]
			srv.joins.mu.Unlock()
			if tr == nil {
				return
			}
			tr.mu.Lock()
			j := tr.joined
			tr.mu.Unlock()
			if j >= k {
				return
			}
		}
		t.Fatalf("%d secondaries never joined", k)
	}

	// The primary, by hand: Hello, auth, Request(streams=3), Streams.
	conn, br, err := cl.connect(context.Background(), addr, &Stats{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &Request{Tokens: tokens(50), Streams: 3, Deadline: time.Minute}
	rf, _ := encodeRequest(req)
	conn.Write(rf)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	f := readFrame(br, nil, Limits{}.withDefaults())
	if f.err != nil || f.check() != nil || f.typ != frameStreams {
		t.Fatalf("first frame %d %v", f.typ, f.err)
	}
	n, id, err := parseStreams(f.payload, 3)
	if err != nil || n != 3 {
		t.Fatalf("streams %d %v", n, err)
	}
	refused := func(what string, f rawFrame) {
		t.Helper()
		if f.err != nil || f.typ != frameError {
			t.Fatalf("%s: got frame %d, %v; want an Error", what, f.typ, f.err)
		}
		if err := parseError(f.payload); !errors.Is(err, ErrAuth) {
			t.Fatalf("%s: %v, want ErrAuth", what, err)
		}
	}
	forged := id
	forged[7] ^= 1
	refused("forged id", joinConn(t, addr, "", secret, 1, forged))
	refused("index beyond the grant", joinConn(t, addr, "", secret, 3, id))
	refused("another source address", joinConn(t, addr, "127.0.0.2", secret, 1, id))

	// Index 1 joins; the same index again is a replay.
	var wg sync.WaitGroup
	firsts := make([]rawFrame, 3)
	join := func(i int) {
		defer wg.Done()
		firsts[i] = joinConn(t, addr, "", secret, i, id)
	}
	wg.Add(1)
	go join(1)
	joined(id, 1) // its first frame waits for KV
	refused("replayed index", joinConn(t, addr, "", secret, 1, id))
	wg.Add(1)
	go join(2)
	joined(id, 2)
	refused("id after every stream joined", joinConn(t, addr, "", secret, 2, id))
	close(release)
	wg.Wait()
	for i := 1; i <= 2; i++ {
		if f := firsts[i]; f.err != nil || (f.typ != frameChunk && f.typ != frameKeepalive && f.typ != frameDone) {
			t.Fatalf("stream %d's first frame %d, %v", i, f.typ, f.err)
		}
	}

	// Without the secret, a join never gets past the Hello.
	noSecret := NewClient(ClientConfig{})
	if _, _, err := noSecret.connect(context.Background(), addr, &Stats{}); !errors.Is(err, ErrAuth) {
		t.Fatalf("join without the secret: %v", err)
	}
}

func bufioReader(c net.Conn) *bufio.Reader { return bufio.NewReaderSize(c, 16<<10) }

// goodputModel has 64 KiB K and V per chunk (8 heads × 32 positions × 128
// × bf16): small frames, so four connections share a few-MB transfer
// evenly.
var goodputModel = &testModel{fp: Fingerprint{0x60}, kinds: make([]LayerKind, 8), kvHeads: 8, headDim: 128, dtype: DTypeBF16, block: 32, tail: 1}

// stripedGoodput fetches a transfer of about total payload bytes with
// streams connections, each paced to rate bytes/s by its own proxy link,
// and returns the payload bytes per second of the whole Fetch (handshakes
// and joins included).
func stripedGoodput(t testing.TB, addr string, streams int, total int64) (float64, Stats) {
	m := goodputModel
	perTok := int64(len(m.kinds)) * 2 * (&Header{DType: m.dtype, KVHeads: m.kvHeads, HeadDim: m.headDim}).KVBytes(1)
	n := int(total/perTok) + 1
	c := NewClient(ClientConfig{})
	req := &Request{Tokens: tokens(n), Streams: streams, Deadline: time.Minute}
	st, err := c.Fetch(context.Background(), addr, req, nil, nullSink{})
	if err != nil {
		t.Fatal(err)
	}
	return float64(st.PayloadBytes) / st.Duration.Seconds(), st
}

// goodputProducer streams goodputModel's chunks, reusing one K and one V
// buffer (the bytes do not matter here, the rate does).
func goodputProducer() ProducerFunc {
	m := goodputModel
	k, v := m.chunkBytes(0, 0, m.block)
	return func(ctx context.Context, req *Request, e *Emitter) error {
		h := m.header(req)
		if err := e.Header(h); err != nil {
			return err
		}
		for s := h.TokenStart; s < h.TokenEnd; s += m.block {
			n := min(m.block, h.TokenEnd-s)
			for l := range m.kinds {
				if err := e.Chunk(l, s, n, k[:h.KVBytes(n)], v[:h.KVBytes(n)]); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// TestStripedGoodput: each connection capped at C by a shaping proxy, a
// transfer over four streams spreads its chunks over all of them (the
// three secondaries carry at least half: ideally three quarters) and
// arrives whole. How close the rate comes to 4C is a speed, measured by
// BenchmarkStripedGoodput (docs/BENCHMARKS.md), not asserted here: a timed
// bound failed a loaded CI run (0.876 × 4C at load 12–35 on 2 cores).
func TestStripedGoodput(t *testing.T) {
	const c = 3e6
	addr, _ := startServer(t, ServerConfig{Producer: goodputProducer()})
	paddr := startStripeProxy(t, &stripeProxy{target: addr, cut: -1, rate: func(int) float64 { return c }})
	g, st := stripedGoodput(t, paddr, 4, 18e6) // 1.5 s at 4C
	t.Logf("%.2f MB/s = %.3f × 4C (%d chunks, %d over secondaries, %d waited)", g/1e6, g/(4*c), st.Chunks, st.SecondaryChunks, st.ChunksWaited)
	m := goodputModel
	perTok := int64(len(m.kinds)) * 2 * (&Header{DType: m.dtype, KVHeads: m.kvHeads, HeadDim: m.headDim}).KVBytes(1)
	if want := int64(18e6) / perTok * perTok; st.Streams != 4 || st.PayloadBytes != want {
		t.Fatalf("granted %d streams and %d payload bytes, want 4 and %d", st.Streams, st.PayloadBytes, want)
	}
	if 2*st.SecondaryChunks < st.Chunks {
		t.Errorf("%d of %d chunks over the three secondaries, want at least half", st.SecondaryChunks, st.Chunks)
	}
}

// BenchmarkStripedGoodput: N connections each paced to 10 MB/s (a stand-in
// for a per-connection ceiling such as one TCP stream's share of a
// Thunderbolt bridge), 1 and 4 streams in the same loop. Reports each
// rate, their ratio (ideal 4) and the 4-stream rate over 4C (ideal 1).
func BenchmarkStripedGoodput(b *testing.B) {
	const c = 10e6
	const total = 40e6
	addr, _ := startServer(b, ServerConfig{Producer: goodputProducer()})
	paddr := startStripeProxy(b, &stripeProxy{target: addr, cut: -1, rate: func(int) float64 { return c }})
	var t1, t4 time.Duration
	var n1, n4 int64
	b.SetBytes(2 * total)
	b.ReportAllocs()
	for b.Loop() {
		_, s1 := stripedGoodput(b, paddr, 1, total)
		_, s4 := stripedGoodput(b, paddr, 4, total)
		t1 += s1.Duration
		t4 += s4.Duration
		n1 += s1.PayloadBytes
		n4 += s4.PayloadBytes
	}
	g1 := float64(n1) / t1.Seconds()
	g4 := float64(n4) / t4.Seconds()
	b.ReportMetric(g1/1e6, "1stream_MB/s")
	b.ReportMetric(g4/1e6, "4streams_MB/s")
	b.ReportMetric(g4/g1, "ratio")
	b.ReportMetric(g4/(4*c), "of_4C")
}

// TestStreamsGrantedFewer: a server whose MaxStreams is below what the
// client asks grants fewer (down to 1: no joins), and the transfer is
// still whole.
func TestStreamsGrantedFewer(t *testing.T) {
	m := smallModel()
	for _, limit := range []int{1, 2} {
		addr, _ := startServer(t, ServerConfig{Producer: m.producer(), MaxStreams: limit})
		req := &Request{Tokens: tokens(300), Streams: 4, Deadline: time.Minute}
		sink := &recordSink{}
		st, err := NewClient(ClientConfig{}).Fetch(context.Background(), addr, req, m.expect(), sink)
		if err != nil {
			t.Fatal(err)
		}
		sink.verifyPerLayer(t, m, req)
		if st.Streams != limit || (limit == 1 && st.SecondaryChunks != 0) {
			t.Fatalf("limit %d: stats %+v", limit, st)
		}
	}
}
