package kvwire

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzJoin: the server's Join parser (bytes from a client that has passed
// the handshake) never panics, fails only with ErrBadRequest, accepts only
// indexes 1..MaxStreams-1, and what it accepts re-encodes to the same
// bytes.
func FuzzJoin(f *testing.F) {
	f.Add(encodeJoin(1, &JoinID{1, 2, 3})[frameHeaderSize:])
	f.Add(encodeJoin(MaxStreams-1, &JoinID{0xff})[frameHeaderSize:])
	f.Add(make([]byte, streamsSize))
	f.Fuzz(func(t *testing.T, p []byte) {
		i, id, err := parseJoin(p)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error without ErrBadRequest: %v", err)
			}
			return
		}
		if i < 1 || i >= MaxStreams {
			t.Fatalf("accepted index %d", i)
		}
		if b := encodeJoin(i, &id); !bytes.Equal(b[frameHeaderSize:], p) {
			t.Fatalf("re-encoded join differs:\n% x\n% x", b[frameHeaderSize:], p)
		}
	})
}

// stripedSeed is a whole valid two-stream transfer in the format of
// FuzzStripedDecoder: per frame, a stream byte, then the frame.
func stripedSeed() []byte {
	m := smallModel()
	req := &Request{Tokens: tokens(33), Streams: 2}
	h := m.header(req)
	id := JoinID{1}
	chunk := func(l, s int) []byte {
		k, v := m.chunkBytes(l, s, 16)
		return chunkFrame(l, s, 16, k, v)
	}
	tot := Totals{TokenEnd: 32, Chunks: 6, PayloadBytes: 6 * 2 * h.KVBytes(16)}
	var b bytes.Buffer
	for _, e := range []struct {
		i byte
		f []byte
	}{
		{0, encodeStreams(2, &id)}, {1, chunk(0, 16)}, {0, encodeHeader(&h)}, {1, smallFrame(frameKeepalive, nil)},
		{0, chunk(0, 0)}, {0, chunk(1, 0)}, {1, chunk(1, 16)}, {0, chunk(2, 0)}, {1, chunk(2, 16)},
		{0, encodeDone(tot)}, {1, encodeDone(tot)},
	} {
		b.WriteByte(e.i)
		b.Write(e.f)
	}
	return b.Bytes()
}

// FuzzStripedDecoder feeds arbitrary frames, each tagged with the stream
// it arrives on, through the client's reassembler and stream state
// machine (a request that asked for 4 streams): it must never panic,
// never grow a buffer beyond the limits, free every applied frame's buffer
// once, and fail only with the package's sentinel errors.
func FuzzStripedDecoder(f *testing.F) {
	seed := stripedSeed()
	f.Add(byte(0), seed)
	f.Add(byte(1), seed)
	f.Add(byte(1), seed[:len(seed)/2])
	bound := largestPayload(fuzzLimits)
	f.Fuzz(func(t *testing.T, reseal byte, data []byte) {
		req := &Request{Tokens: tokens(33), Streams: 4}
		rs := &recvState{req: req, sink: &discardSink{t: t}, lim: Limits{MaxTokens: 64, MaxFrame: 1 << 16}, st: &Stats{}}
		m := newReassembler(rs, req.Streams)
		r := bytes.NewReader(data)
		pushed, freed := 0, 0
		for {
			sel, err := r.ReadByte()
			if err != nil {
				return
			}
			fr := readFrame(r, nil, fuzzLimits)
			if cap(fr.buf) > bound {
				t.Fatalf("buffer grew to %d bytes, limit %d", cap(fr.buf), bound)
			}
			if fr.err != nil {
				return
			}
			if reseal&1 == 1 {
				fr.crc = frameCRC(fr.hdr[:], fr.payload)
			}
			m.push(int(sel)%m.streams(), fr)
			pushed++
			_, done, err := m.step(func(int, []byte) { freed++ })
			if freed > pushed {
				t.Fatalf("freed %d buffers of %d frames", freed, pushed)
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrMismatch) && !errors.As(err, new(*RemoteError)) {
					t.Fatalf("error without a sentinel: %v", err)
				}
				return
			}
			if done {
				return
			}
		}
	})
}

// TestStripedSeed: the striped fuzz seed is a whole valid transfer, so the
// fuzzer starts from the deep end of the reassembler.
func TestStripedSeed(t *testing.T) {
	req := &Request{Tokens: tokens(33), Streams: 2}
	rs := &recvState{req: req, sink: &discardSink{t: t}, lim: Limits{}.withDefaults(), st: &Stats{}}
	m := newReassembler(rs, 2)
	r := bytes.NewReader(stripedSeed())
	for {
		sel, err := r.ReadByte()
		if err != nil {
			t.Fatal("seed ended before done")
		}
		fr := readFrame(r, nil, Limits{}.withDefaults())
		if fr.err != nil {
			t.Fatal(fr.err)
		}
		m.push(int(sel)%m.streams(), fr)
		_, done, err := m.step(func(int, []byte) {})
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
	}
	if rs.st.Chunks != 6 || rs.st.SecondaryChunks != 3 || rs.st.ChunksWaited == 0 {
		t.Fatalf("stats %+v", *rs.st)
	}
}
