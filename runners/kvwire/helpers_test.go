package kvwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// pattern fills b with bytes determined by (seed, layer, position, which).
func pattern(b []byte, layer, pos int, which byte) {
	x := uint32(layer)*2654435761 ^ uint32(pos)*40503 ^ uint32(which)*97
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// testModel is the geometry a test producer serves.
type testModel struct {
	fp      Fingerprint
	kinds   []LayerKind
	kvHeads int
	headDim int
	dtype   DType
	block   int   // tokens per prefill block
	tail    int   // tokens the decode side computes itself
	windows []int // nil: every layer full
}

func (m *testModel) expect() *Expect {
	return &Expect{Fingerprint: m.fp, Kinds: m.kinds, KVHeads: m.kvHeads, HeadDim: m.headDim, Windows: m.windows}
}

// expectRange is what a client holding layers [a, b) of m expects.
func (m *testModel) expectRange(a, b int) *Expect {
	e := &Expect{Fingerprint: m.fp, Kinds: m.kinds[a:b], KVHeads: m.kvHeads, HeadDim: m.headDim}
	if m.windows != nil {
		e.Windows = m.windows[a:b]
	}
	return e
}

// layers is the model layers [a, b) that req asks for (every layer when
// it names no range).
func (m *testModel) layers(req *Request) (a, b int) {
	if req.HasRange() {
		return req.LayerStart, req.LayerEnd
	}
	return 0, len(m.kinds)
}

// header is what the producer sends for req: the requested layers only.
// Chunk and state bytes are those of the model's layer (first_layer +
// the stream's index), so a sink can tell which layer it was given.
func (m *testModel) header(req *Request) Header {
	end := max(len(req.Tokens)-m.tail, req.StartPos)
	a, b := m.layers(req)
	h := Header{Fingerprint: m.fp, DType: m.dtype, KVHeads: m.kvHeads, HeadDim: m.headDim,
		FirstLayer: a, Kinds: m.kinds[a:b], TokenStart: req.StartPos, TokenEnd: end}
	if m.windows != nil {
		h.Windows = m.windows[a:b]
	}
	return h
}

// chunkBytes is what the producer sends (and the sink must receive) for a
// layer and token range: K and V, each laid out per position block.
func (m *testModel) chunkBytes(layer, start, n int) (k, v []byte) {
	h := Header{DType: m.dtype, KVHeads: m.kvHeads, HeadDim: m.headDim}
	k = make([]byte, h.KVBytes(n))
	v = make([]byte, h.KVBytes(n))
	pattern(k, layer, start*1000+n, 'k')
	pattern(v, layer, start*1000+n, 'v')
	return k, v
}

func (m *testModel) stateBytes(layer, end int) [][]byte {
	a := make([]byte, 48)
	b := make([]byte, 16)
	pattern(a, layer, end, 's')
	pattern(b, layer, end, 't')
	return [][]byte{a, b}
}

// producer streams the model's KV block by block, layer by layer, with a
// state per recurrent layer after each block.
func (m *testModel) producer() ProducerFunc {
	return func(ctx context.Context, req *Request, e *Emitter) error {
		if !req.Fingerprint.IsZero() && req.Fingerprint != m.fp {
			return fmt.Errorf("%w: fingerprint %v", ErrMismatch, req.Fingerprint)
		}
		if _, b := m.layers(req); b > len(m.kinds) {
			return fmt.Errorf("%w: layers to %d of %d", ErrMismatch, b, len(m.kinds))
		}
		h := m.header(req)
		if err := e.Header(h); err != nil {
			return err
		}
		for s := h.TokenStart; s < h.TokenEnd; s += m.block {
			n := min(m.block, h.TokenEnd-s)
			for l, kind := range h.Kinds {
				g := h.FirstLayer + l
				var err error
				if kind == LayerAttention {
					from := max(s, h.LayerStart(l)) // a sliding layer: its window only
					if from >= s+n {
						continue
					}
					k, v := m.chunkBytes(g, from, s+n-from)
					err = e.Chunk(l, from, s+n-from, k, v)
				} else {
					err = e.State(l, s+n, m.stateBytes(g, s+n)...)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// recordSink keeps everything it is given (copies) and counts calls.
type recordSink struct {
	mu        sync.Mutex
	header    *Header
	chunks    []recChunk
	states    map[int]recState
	stateSum  map[int]int64 // bytes of every state frame per layer
	totals    *Totals
	begins    int
	rollbacks int
	failAt    int // Chunk returns an error at this chunk number (1-based; 0 never)
}

type recChunk struct {
	layer, start, n int
	k, v            []byte
}

type recState struct {
	end    int
	arrays [][]byte
}

func (s *recordSink) Begin(h *Header) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begins++
	s.header = h
	s.chunks = nil
	s.states = map[int]recState{}
	s.stateSum = map[int]int64{}
	return nil
}

func (s *recordSink) Chunk(layer, start, n int, k, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.chunks = append(s.chunks, recChunk{layer, start, n, bytes.Clone(k), bytes.Clone(v)})
	if s.failAt > 0 && len(s.chunks) == s.failAt {
		return errSinkFull
	}
	return nil
}

var errSinkFull = errors.New("sink full")

func (s *recordSink) State(layer, end int, arrays [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := make([][]byte, len(arrays))
	for i, a := range arrays {
		cp[i] = bytes.Clone(a)
	}
	s.states[layer] = recState{end, cp}
	for _, a := range arrays {
		s.stateSum[layer] += int64(len(a))
	}
	return nil
}

func (s *recordSink) Done(t Totals) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals = &t
	return nil
}

func (s *recordSink) Rollback() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rollbacks++
}

// verify checks that the sink holds exactly what m's producer sends for req.
func (s *recordSink) verify(t *testing.T, m *testModel, req *Request) {
	t.Helper()
	h := m.header(req)
	if s.header == nil || s.header.TokenStart != h.TokenStart || s.header.TokenEnd != h.TokenEnd || s.header.Fingerprint != m.fp || s.header.DType != m.dtype ||
		s.header.FirstLayer != h.FirstLayer || s.header.Layers() != h.Layers() {
		t.Fatalf("header %+v, want %+v", s.header, h)
	}
	if s.totals == nil {
		t.Fatal("no Done")
	}
	var want []recChunk
	for st := h.TokenStart; st < h.TokenEnd; st += m.block {
		n := min(m.block, h.TokenEnd-st)
		for l, kind := range h.Kinds {
			if from := max(st, h.LayerStart(l)); kind == LayerAttention && from < st+n {
				k, v := m.chunkBytes(h.FirstLayer+l, from, st+n-from)
				want = append(want, recChunk{l, from, st + n - from, k, v})
			}
		}
	}
	if len(s.chunks) != len(want) {
		t.Fatalf("%d chunks, want %d", len(s.chunks), len(want))
	}
	for i, c := range s.chunks {
		w := want[i]
		if c.layer != w.layer || c.start != w.start || c.n != w.n || !bytes.Equal(c.k, w.k) || !bytes.Equal(c.v, w.v) {
			t.Fatalf("chunk %d: layer %d [%d,+%d) differs from layer %d [%d,+%d) sent", i, c.layer, c.start, c.n, w.layer, w.start, w.n)
		}
	}
	for l, kind := range h.Kinds {
		if kind != LayerRecurrent || h.TokenEnd == h.TokenStart {
			continue
		}
		got, ok := s.states[l]
		want := m.stateBytes(h.FirstLayer+l, h.TokenEnd)
		if !ok || got.end != h.TokenEnd || len(got.arrays) != len(want) || !bytes.Equal(got.arrays[0], want[0]) || !bytes.Equal(got.arrays[1], want[1]) {
			t.Fatalf("layer %d state %+v, want end %d", l, got, h.TokenEnd)
		}
	}
	if s.rollbacks != 0 {
		t.Fatalf("%d rollbacks after success", s.rollbacks)
	}
}

// startServer serves cfg on a loopback port until the test ends.
func startServer(t testing.TB, cfg ServerConfig) (string, *Server) {
	t.Helper()
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testutil.Serve(t, context.Background(), srv.Serve), srv
}

// proxy forwards TCP between a client and target. With mangle, the
// server→client bytes pass through it (it may change them in place and
// returns how many to forward and whether to cut the connection after
// them); without, they are spliced and paced to rate bytes/s (see pace).
type proxy struct {
	target string
	mangle func(off int64, b []byte) (n int, cut bool)
	rate   float64
	// step is how many bytes pass between two waits of the pacer
	// (default 256 KiB): a smaller one paces a slow link from its first
	// bytes instead of letting a first burst through.
	step int64
	l    net.Listener
	wg   sync.WaitGroup
}

func startProxy(t testing.TB, p *proxy) string {
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
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.wg.Wait()
	})
	return l.Addr().String()
}

func (p *proxy) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		io.Copy(s, c)
		s.(*net.TCPConn).CloseWrite()
	}()
	if p.mangle == nil {
		p.pace(c, s)
		return
	}
	buf := make([]byte, 256<<10)
	var off int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
			fwd, cut := p.mangle(off, buf[:n])
			off += int64(n)
			if _, werr := c.Write(buf[:fwd]); werr != nil || cut {
				return
			}
		}
		if err != nil {
			c.(*net.TCPConn).CloseWrite()
			return
		}
	}
}

// pace forwards s → c at p.rate bytes/s (unlimited when 0) in 256 KiB
// steps with io.CopyN, which on Linux splices socket to socket without
// copying through user space (the proxy must not eat the CPU the benchmark
// measures). Link model: a step leaves at max(when the previous step left,
// when its bytes were all there) + n/rate. A step whose bytes were already
// waiting keeps the schedule, so a late wake-up (sleep overshoot on a
// loaded machine) is caught up instead of lost; a step that had to wait
// for its bytes for over 5 ms (the link was idle; shorter waits are
// indistinguishable from being descheduled on a loaded machine) gets no
// credit for the idle time, and no catch-up exceeds 20 ms of link time.
func (p *proxy) pace(c, s net.Conn) {
	step := p.step
	if step <= 0 {
		step = 256 << 10
	}
	const maxLag = 20 * time.Millisecond
	next := time.Now()
	for {
		t0 := time.Now()
		n, err := io.CopyN(c, s, step)
		if p.rate > 0 && n > 0 {
			switch t1 := time.Now(); {
			case t1.Sub(t0) > 5*time.Millisecond && next.Before(t1):
				next = t1 // waited for data: the link was idle
			case t1.Sub(next) > maxLag:
				next = t1.Add(-maxLag) // catch up at most 20 ms
			}
			next = next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
		}
		if err != nil {
			c.(*net.TCPConn).CloseWrite()
			return
		}
	}
}

// counter counts calls across goroutines.
type counter struct{ n atomic.Int64 }
