package kvwire

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Parallel streams (PROTOCOL.md §17): one transfer's Chunk frames striped
// over several authenticated connections, joined to the transfer by a
// single-use random id, and reassembled by (layer, token) on the client.

// MaxStreams is the most connections one transfer may use.
const MaxStreams = 16

// streamsSize is the payload size of both the Streams and the Join frame.
const streamsSize = 36

// JoinID binds secondary connections to a transfer.
type JoinID [32]byte

func encodeStreams(n int, id *JoinID) []byte {
	var p [streamsSize]byte
	p[0] = byte(n)
	copy(p[4:], id[:])
	return smallFrame(frameStreams, p[:])
}

// parseStreams decodes a Streams payload for a request that asked for
// asked streams; errors wrap ErrCorrupt.
func parseStreams(p []byte, asked int) (n int, id JoinID, err error) {
	if len(p) != streamsSize {
		return 0, id, corruptf("streams frame of %d bytes", len(p))
	}
	if p[1] != 0 || p[2] != 0 || p[3] != 0 {
		return 0, id, corruptf("streams frame reserved bytes non-zero")
	}
	n = int(p[0])
	if n < 1 || n > asked {
		return 0, id, corruptf("server grants %d streams, %d asked", n, asked)
	}
	copy(id[:], p[4:])
	if (n == 1) != (id == JoinID{}) {
		return 0, id, corruptf("server grants %d streams with a join id %x…", n, id[:4])
	}
	return n, id, nil
}

func encodeJoin(index int, id *JoinID) []byte {
	var p [streamsSize]byte
	p[0] = byte(index)
	copy(p[4:], id[:])
	return smallFrame(frameJoin, p[:])
}

// parseJoin decodes a Join payload (untrusted: from a client that has
// passed the handshake). Errors wrap ErrBadRequest.
func parseJoin(p []byte) (index int, id JoinID, err error) {
	if len(p) != streamsSize {
		return 0, id, fmt.Errorf("%w: join of %d bytes", ErrBadRequest, len(p))
	}
	if p[1] != 0 || p[2] != 0 || p[3] != 0 {
		return 0, id, fmt.Errorf("%w: join reserved bytes non-zero", ErrBadRequest)
	}
	index = int(p[0])
	if index < 1 || index >= MaxStreams {
		return 0, id, fmt.Errorf("%w: join index %d outside 1..%d", ErrBadRequest, index, MaxStreams-1)
	}
	copy(id[:], p[4:])
	return index, id, nil
}

// ---- server side ----

// transfer is one striped request on the server: the shared queue its
// connections' writers take chunks from, and the secondaries joined so far.
type transfer struct {
	id     JoinID
	n      int
	remote netip.Addr
	ctx    context.Context
	cancel context.CancelCauseFunc
	bulk   chan *outFrame
	// joinBy is when the server stops waiting for the secondaries.
	joinBy time.Time

	mu      sync.Mutex
	used    []bool
	joined  int
	closed  bool
	writers []*writer
	conns   []net.Conn
	all     chan struct{} // closed when every secondary has joined
	// gate opens (is closed) when every secondary has joined, or the
	// transfer ends: only then do the writers take chunks, so that no
	// connection's socket buffer swallows a head start.
	gate     chan struct{}
	gateOnce sync.Once
	timer    *time.Timer
}

// unsentLimit is the TCP_NOTSENT_LOWAT of a striped connection.
const unsentLimit = 128 << 10

func (t *transfer) openGate() {
	t.gateOnce.Do(func() {
		close(t.gate)
		t.timer.Stop()
	})
}

// joinRegistry maps live join ids to their transfers.
type joinRegistry struct {
	mu sync.Mutex
	m  map[JoinID]*transfer
}

// open registers a transfer of n streams (n ≥ 2) from remote.
func (r *joinRegistry) open(ctx context.Context, cancel context.CancelCauseFunc, n, depth int, remote netip.Addr, joinBy time.Time) *transfer {
	t := &transfer{n: n, remote: remote, ctx: ctx, cancel: cancel, bulk: make(chan *outFrame, depth),
		joinBy: joinBy, used: make([]bool, n), all: make(chan struct{}), gate: make(chan struct{})}
	// Secondaries that do not join in time fail the transfer (the client
	// opens them at once; one that cannot is gone).
	t.timer = time.AfterFunc(time.Until(joinBy), func() {
		t.mu.Lock()
		j := t.joined
		t.mu.Unlock()
		if j < n-1 {
			cancel(fmt.Errorf("%w: %d of %d secondary streams joined within the handshake timeout", ErrRemoteInternal, j, n-1))
		}
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[JoinID]*transfer{}
	}
	for {
		rand.Read(t.id[:])
		if _, dup := r.m[t.id]; !dup && t.id != (JoinID{}) {
			break
		}
	}
	r.m[t.id] = t
	return t
}

func (r *joinRegistry) forget(t *transfer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[t.id] == t {
		delete(r.m, t.id)
	}
}

var errBadJoin = fmt.Errorf("%w: unknown or used join id", ErrAuth)

// join attaches conn as secondary index of the transfer id names, with a
// writer of its own over the transfer's shared queue. It refuses an id it
// does not know, an index out of range or already used, another source
// address and a transfer that has ended.
func (r *joinRegistry) join(id JoinID, index int, conn net.Conn, mk func(t *transfer) *writer) (*transfer, *writer, error) {
	r.mu.Lock()
	t := r.m[id]
	r.mu.Unlock()
	if t == nil {
		return nil, nil, errBadJoin
	}
	if remoteAddr(conn) != t.remote {
		return nil, nil, fmt.Errorf("%w (from %v, the transfer's peer is %v)", errBadJoin, remoteAddr(conn), t.remote)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || index >= t.n || t.used[index] {
		return nil, nil, errBadJoin
	}
	t.used[index] = true
	t.joined++
	w := mk(t)
	t.writers = append(t.writers, w)
	t.conns = append(t.conns, conn)
	if t.joined == t.n-1 {
		close(t.all)
		r.forget(t)
		t.openGate()
	}
	return t, w, nil
}

// end closes the transfer to joins and returns its secondaries' writers.
func (t *transfer) end() []*writer {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	return t.writers
}

// closeConns closes every secondary connection (the client is gone).
func (t *transfer) closeConns() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.Close()
	}
}

// waitJoined waits until every secondary has joined, the join deadline
// passes or the transfer's context ends; it reports how many joined.
func (t *transfer) waitJoined() int {
	timer := time.NewTimer(time.Until(t.joinBy))
	defer timer.Stop()
	select {
	case <-t.all:
	case <-timer.C:
	case <-t.ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.joined
}

func remoteAddr(c net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// ---- client side ----

// mstream is one connection's frames as the client's reassembler sees
// them: those read and not yet applied, in arrival order.
type mstream struct {
	q        []rawFrame
	done     *Totals // its Done, once applied (secondaries)
	doneSeen bool    // a Done is queued or applied: a later close is the clean end
}

// reassembler merges the frames of a transfer's connections into one
// stream for recvState in a valid §12 order (PROTOCOL.md §17): frames of
// the primary (stream 0) in their order; chunks of any stream when they
// continue their layer; each secondary's Done after its chunks; the
// primary's Done last, once every secondary is done. It does no I/O, so
// the fuzz target drives it with arbitrary frames.
type reassembler struct {
	rs      *recvState
	asked   int // streams the request asked for (≥ 1)
	granted bool
	joinID  JoinID
	s       []*mstream
}

func newReassembler(rs *recvState, asked int) *reassembler {
	return &reassembler{rs: rs, asked: max(asked, 1), s: []*mstream{{}}}
}

// streams is the number of connections of the transfer (1 until the
// server's Streams frame has been applied).
func (m *reassembler) streams() int { return len(m.s) }

// push queues a frame read without a transport error from stream i.
func (m *reassembler) push(i int, f rawFrame) {
	st := m.s[i]
	if f.typ == frameDone {
		st.doneSeen = true
	}
	st.q = append(st.q, f)
}

// closed reports whether a transport error (EOF included) on stream i
// leaves the transfer intact: only after that stream's Done.
func (m *reassembler) closedOK(i int) bool { return m.s[i].doneSeen }

// step applies every frame that can be applied now and hands each freed
// buffer to free. It returns granted > 1 once, when the primary's Streams
// frame has granted that many streams (the caller then opens the
// secondaries and pushes their frames), and done after the primary's Done
// has been applied.
func (m *reassembler) step(free func(i int, buf []byte)) (granted int, done bool, err error) {
	for {
		progress := false
		for i, st := range m.s {
			if len(st.q) == 0 {
				continue
			}
			f := &st.q[0]
			if err := f.check(); err != nil {
				return 0, false, err
			}
			apply, err := m.ready(i, f)
			if err != nil {
				return 0, false, err
			}
			if !apply {
				continue
			}
			g, d, err := m.apply(i, f)
			if err != nil {
				return 0, false, err
			}
			free(i, f.buf)
			st.q = st.q[1:]
			if d {
				return 0, true, nil
			}
			if g > 1 {
				return g, false, nil
			}
			progress = true
		}
		if !progress {
			break
		}
	}
	// Stuck: every unfinished stream holds a frame that cannot be applied.
	for _, st := range m.s {
		if len(st.q) == 0 && st.done == nil {
			return 0, false, nil // waiting for this one
		}
	}
	return 0, false, corruptf("no connection of %d holds a frame that can be applied next", len(m.s))
}

// ready says whether stream i's head frame f can be applied now.
func (m *reassembler) ready(i int, f *rawFrame) (bool, error) {
	if m.s[i].done != nil {
		return false, corruptf("frame type %d on stream %d after its done", f.typ, i)
	}
	switch f.typ {
	case frameChunk:
		rs := m.rs
		if rs.h == nil || len(f.payload) < chunkPrefixSize {
			// Before the header a chunk waits for it (primary: the
			// header precedes it, so applying it is the error).
			return i == 0, nil
		}
		layer := int(le.Uint32(f.payload[0:4]))
		start := int(le.Uint32(f.payload[4:8]))
		if layer < len(rs.t.next) && rs.h.Kinds[layer] == LayerAttention && start > rs.t.next[layer] {
			if !f.waited {
				f.waited = true
				rs.st.ChunksWaited++
			}
			return false, nil // a later chunk of its layer: wait
		}
		return true, nil // the next one, or an error the tracker names
	case frameDone:
		if i != 0 {
			return true, nil
		}
		for _, st := range m.s[1:] {
			if st.done == nil {
				return false, nil
			}
		}
		return true, nil
	case frameKeepalive, frameError:
		return true, nil
	}
	if i != 0 {
		return false, corruptf("frame type %d on secondary stream %d", f.typ, i)
	}
	return true, nil
}

// apply applies stream i's head frame.
func (m *reassembler) apply(i int, f *rawFrame) (granted int, done bool, err error) {
	switch {
	case f.typ == frameStreams:
		m.rs.st.WireBytes += int64(frameHeaderSize + len(f.payload))
		if m.granted || m.asked < 2 || m.rs.h != nil {
			return 0, false, corruptf("unexpected streams frame")
		}
		n, id, err := parseStreams(f.payload, m.asked)
		if err != nil {
			return 0, false, err
		}
		m.granted, m.joinID = true, id
		for range n - 1 {
			m.s = append(m.s, &mstream{})
		}
		return n, false, nil
	case i != 0 && f.typ == frameDone:
		m.rs.st.WireBytes += int64(frameHeaderSize + len(f.payload))
		t, err := parseDone(f.payload)
		if err != nil {
			return 0, false, err
		}
		m.s[i].done = &t
		return 0, false, nil
	case f.typ == frameHeader && m.asked >= 2 && !m.granted:
		return 0, false, corruptf("header before the streams frame")
	case i == 0 && f.typ == frameDone:
		t, err := parseDone(f.payload)
		if err != nil {
			return 0, false, err
		}
		for j, st := range m.s[1:] {
			if *st.done != t {
				return 0, false, corruptf("stream %d's done %+v differs from the primary's %+v", j+1, *st.done, t)
			}
		}
	}
	done, err = m.rs.handle(f)
	if err == nil && i > 0 && f.typ == frameChunk {
		m.rs.st.SecondaryChunks++
	}
	return 0, done, err
}
