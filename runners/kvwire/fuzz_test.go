package kvwire

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the committed fuzz seed corpora under testdata/fuzz")

// fuzzLimits are small so the fuzzer reaches the limit checks, and so the
// allocation bound can be asserted.
var fuzzLimits = Limits{MaxTokens: 64, MaxFrame: 4096}

// largestPayload is the largest payload any frame type may declare under
// fuzzLimits: no buffer may ever grow beyond it.
func largestPayload(l Limits) int {
	m := 0
	for typ := range 256 {
		m = max(m, l.maxPayload(uint8(typ)))
	}
	return m
}

// discardSink accepts everything and checks the sizes it is given.
type discardSink struct {
	t   *testing.T
	req *Request // when set, a ranged request's header must carry its range
	h   *Header
}

func (s *discardSink) Begin(h *Header) error {
	if r := s.req; r != nil && r.HasRange() && (h.FirstLayer != r.LayerStart || h.Layers() != r.LayerEnd-r.LayerStart) {
		s.t.Fatalf("sink begun with layers [%d, +%d) for a request of [%d, %d)", h.FirstLayer, h.Layers(), r.LayerStart, r.LayerEnd)
	}
	s.h = h
	return nil
}
func (s *discardSink) Chunk(layer, start, n int, k, v []byte) error {
	if int64(len(k)) != s.h.KVBytes(n) || len(v) != len(k) {
		s.t.Fatalf("sink got K %d / V %d bytes for %d tokens", len(k), len(v), n)
	}
	if layer < 0 || layer >= s.h.Layers() || s.h.Kinds[layer] != LayerAttention {
		s.t.Fatalf("sink got a chunk for layer %d of %d", layer, s.h.Layers())
	}
	if s.h.DType == DTypeF8E4M3 { // widen as the decode runner does
		for _, sec := range [][]byte{k, v} {
			if err := DecodeFP8(make([]byte, 4*n*s.h.KVHeads*s.h.HeadDim), DTypeF32, sec, s.h.KVHeads); err != nil {
				return err
			}
		}
	}
	return nil
}
func (s *discardSink) State(layer, end int, arrays [][]byte) error {
	if layer < 0 || layer >= s.h.Layers() || s.h.Kinds[layer] != LayerRecurrent {
		s.t.Fatalf("sink got a state for layer %d of %d", layer, s.h.Layers())
	}
	return nil
}
func (s *discardSink) Done(t Totals) error { return nil }
func (s *discardSink) Rollback()           {}

func fuzzStreamSeeds() [][]byte {
	return append(streamSeeds(DTypeBF16), streamSeeds(DTypeF8E4M3)[0])
}

// fuzzRange is the layer range the frame fuzzer's request asks for when
// bit 1 of its first byte is set: layers [1, 3) of rangeSeedModel.
var fuzzRange = [2]int{1, 3}

// fuzzRequest is the request the frame fuzzer's stream answers.
func fuzzRequest(ranged bool) *Request {
	req := &Request{Tokens: tokens(8)}
	if ranged {
		req.LayerStart, req.LayerEnd = fuzzRange[0], fuzzRange[1]
	}
	return req
}

// rangeStreamSeeds are whole streams answering fuzzRequest(true): the
// header for layers [1, 3) of a three-layer model, then their frames.
func rangeStreamSeeds() [][]byte {
	m := &testModel{fp: Fingerprint{2}, kinds: []LayerKind{LayerRecurrent, LayerAttention, LayerRecurrent}, windows: []int{0, 3, 0},
		kvHeads: 2, headDim: 4, dtype: DTypeBF16, block: 3, tail: 1}
	full := streamFrom(m, fuzzRequest(true))
	return [][]byte{full, full[:len(full)*2/3]}
}

// streamFrom is the whole server→client stream m's producer sends for req
// (header, keepalive, a block's chunks and states in turn, Done).
func streamFrom(m *testModel, req *Request) []byte {
	h := m.header(req)
	var full bytes.Buffer
	full.Write(encodeHeader(&h))
	full.Write(smallFrame(frameKeepalive, nil))
	var tot Totals
	for s := h.TokenStart; s < h.TokenEnd; s += m.block {
		n := min(m.block, h.TokenEnd-s)
		for l, kind := range h.Kinds {
			if kind == LayerRecurrent {
				arrays := m.stateBytes(h.FirstLayer+l, s+n)
				full.Write(encodeStatePrefix(l, s+n, arrays))
				full.Write(bytes.Join(arrays, nil))
				tot.States++
				tot.PayloadBytes += int64(len(arrays[0]) + len(arrays[1]))
				continue
			}
			from := max(s, h.LayerStart(l))
			if from >= s+n {
				continue
			}
			k, v := m.chunkBytes(h.FirstLayer+l, from, s+n-from)
			full.Write(chunkFrame(l, from, s+n-from, k, v))
			tot.Chunks++
			tot.PayloadBytes += int64(len(k) + len(v))
		}
	}
	tot.TokenEnd = h.TokenEnd
	full.Write(encodeDone(tot))
	return full.Bytes()
}

func streamSeeds(dt DType) [][]byte {
	m := &testModel{fp: Fingerprint{1}, kinds: []LayerKind{LayerAttention, LayerRecurrent}, kvHeads: 2, headDim: 4, dtype: dt, block: 3, tail: 1}
	req := fuzzRequest(false)
	h := m.header(req)
	var full bytes.Buffer
	full.Write(encodeHeader(&h))
	full.Write(smallFrame(frameKeepalive, nil))
	var tot Totals
	for s := h.TokenStart; s < h.TokenEnd; s += m.block {
		n := min(m.block, h.TokenEnd-s)
		k, v := m.chunkBytes(0, s, n)
		if dt == DTypeF8E4M3 { // valid scales
			for hd := range m.kvHeads {
				le.PutUint32(k[4*hd:], math.Float32bits(0.5))
				le.PutUint32(v[4*hd:], math.Float32bits(2))
			}
		}
		full.Write(chunkFrame(0, s, n, k, v))
		arrays := m.stateBytes(1, s+n)
		full.Write(encodeStatePrefix(1, s+n, arrays))
		full.Write(bytes.Join(arrays, nil))
		tot.Chunks++
		tot.States++
		tot.PayloadBytes += int64(len(k)+len(v)) + int64(len(arrays[0])+len(arrays[1]))
	}
	tot.TokenEnd = h.TokenEnd
	full.Write(encodeDone(tot))
	reqFrame, _ := encodeRequest(req)
	return [][]byte{
		full.Bytes(),
		encodeHeader(&h),
		append(encodeHeader(&h), encodeError(codeBusy, "busy")...),
		encodeError(codeMismatch, "no"),
		reqFrame,
		smallFrame(frameAuthOK, make([]byte, 32)),
		full.Bytes()[:len(full.Bytes())/2],
	}
}

// FuzzFrameDecoder feeds arbitrary server→client bytes (after the Hello)
// through the client's frame reader and stream state machine: it must
// never panic, never grow a buffer beyond the declared limits, fail only
// with the package's sentinel errors, and, for a request with a layer
// range, never hand the sink a header or a layer outside that range; a
// header it accepts re-encodes to the same bytes.
func FuzzFrameDecoder(f *testing.F) {
	for _, s := range fuzzStreamSeeds() {
		f.Add(append([]byte{0}, s...))
		f.Add(append([]byte{1}, s...))
	}
	for _, s := range rangeStreamSeeds() {
		f.Add(append([]byte{2}, s...))
		f.Add(append([]byte{3}, s...))
	}
	bound := largestPayload(fuzzLimits)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		// The first byte's low bit asks to reseal every frame's CRC, so the
		// fuzzer also explores the payload parsers and the ordering rules
		// behind the digest; otherwise the bytes go in as they are. Its
		// bit 1 makes the request ask for the layers fuzzRange.
		req := fuzzRequest(data[0]&2 != 0)
		if data[0]&1 == 1 {
			data = resealFrames(bytes.Clone(data[1:]))
		} else {
			data = data[1:]
		}
		var st Stats
		rs := &recvState{req: req, sink: &discardSink{t: t, req: req}, lim: fuzzLimits, st: &st}
		r := bytes.NewReader(data)
		var buf []byte
		for {
			fr := readFrame(r, buf, fuzzLimits)
			if cap(fr.buf) > bound {
				t.Fatalf("buffer grew to %d bytes, limit %d", cap(fr.buf), bound)
			}
			if fr.err != nil {
				return
			}
			// Round trip: a header the parser accepts re-encodes to the
			// same bytes (first layer, kinds and windows included).
			if fr.typ == frameHeader && fr.check() == nil {
				if h, err := parseHeader(fr.payload); err == nil {
					if re := encodeHeader(h)[frameHeaderSize:]; !bytes.Equal(re, fr.payload) {
						t.Fatalf("header re-encodes differently:\n% x\n% x", re, fr.payload)
					}
				}
			}
			done, err := rs.handle(&fr)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrMismatch) && !errors.As(err, new(*RemoteError)) {
					t.Fatalf("error without a sentinel: %v", err)
				}
				return
			}
			if done {
				return
			}
			buf = fr.buf
		}
	})
}

// resealFrames rewrites the CRC of each whole frame in b.
func resealFrames(b []byte) []byte {
	for o := 0; o+frameHeaderSize <= len(b); {
		n := int(le.Uint32(b[o+4 : o+8]))
		if n < 0 || n > len(b)-o-frameHeaderSize {
			break
		}
		end := o + frameHeaderSize + n
		le.PutUint32(b[o+8:o+12], frameCRC(b[o:], b[o+frameHeaderSize:end]))
		o = end
	}
	return b
}

// FuzzRequest: the server's request parser never panics, allocates at most
// the declared token count (≤ MaxTokens), fails only with ErrBadRequest,
// and what it accepts re-encodes to the same bytes.
func FuzzRequest(f *testing.F) {
	for _, r := range []*Request{
		{ID: "a", Model: "qwen3-8b", Tokens: tokens(10), StartPos: 3, DType: DTypeBF16, Deadline: 2000e6},
		{Tokens: []int32{0}},
		{ID: "x", Fingerprint: Fingerprint{1, 2}, Tokens: tokens(64), StartPos: 63, DType: DTypeF32},
		{ID: "p", Model: "m", Tokens: tokens(130), PrefixProbe: true},
		{ID: "stage", Model: "m", Tokens: tokens(12), StartPos: 4, LayerStart: 3, LayerEnd: 9, Streams: 2},
		{Tokens: tokens(2), LayerStart: 0, LayerEnd: 1024, DType: DTypeF8E4M3},
		{ID: "rank", Model: "m", Tokens: tokens(9), StartPos: 2, HeadStart: 2, HeadEnd: 4},
		{Tokens: tokens(3), LayerStart: 1, LayerEnd: 2, HeadStart: 0, HeadEnd: 1024, DType: DTypeF8E4M3},
	} {
		b, err := encodeRequest(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[frameHeaderSize:])
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		req, err := parseRequest(p, fuzzLimits)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error without ErrBadRequest: %v", err)
			}
			return
		}
		if len(req.Tokens) > fuzzLimits.MaxTokens || req.StartPos >= len(req.Tokens) {
			t.Fatalf("accepted %d tokens, start_pos %d", len(req.Tokens), req.StartPos)
		}
		if checkRange(req.LayerStart, req.LayerEnd) != nil {
			t.Fatalf("accepted layer range [%d, %d)", req.LayerStart, req.LayerEnd)
		}
		if checkHeads(req.HeadStart, req.HeadEnd) != nil {
			t.Fatalf("accepted kv head range [%d, %d)", req.HeadStart, req.HeadEnd)
		}
		b, err := encodeRequest(req)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(b[frameHeaderSize:], p) {
			t.Fatalf("re-encoded request differs:\n% x\n% x", b[frameHeaderSize:], p)
		}
	})
}

// TestWriteFuzzSeeds rewrites testdata/fuzz with -update-seeds.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite the seed corpora")
	}
	write := func(target string, seeds [][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			name := fmt.Sprintf("seed-%x", sha256.Sum256(s))[:21]
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var frames [][]byte
	for _, s := range fuzzStreamSeeds() {
		frames = append(frames, append([]byte{0}, s...), append([]byte{1}, s...))
	}
	for _, s := range rangeStreamSeeds() {
		frames = append(frames, append([]byte{2}, s...), append([]byte{3}, s...))
	}
	write("FuzzFrameDecoder", frames)
	var reqs [][]byte
	for _, r := range []*Request{
		{ID: "req-7", Model: "llama", Tokens: tokens(20), StartPos: 5, DType: DTypeF16, Deadline: 1e9},
		{Fingerprint: Fingerprint{0xff}, Tokens: tokens(1)},
		{ID: "stage-1", Model: "glm", Tokens: tokens(30), StartPos: 10, LayerStart: 46, LayerEnd: 92},
		{ID: "rank-1", Model: "glm", Tokens: tokens(30), StartPos: 10, HeadStart: 4, HeadEnd: 8},
	} {
		b, _ := encodeRequest(r)
		reqs = append(reqs, b[frameHeaderSize:])
	}
	write("FuzzRequest", reqs)
}

// TestFuzzSeedStream checks that the main frame seed is a complete valid
// stream, so the fuzzer starts from the deep end of the state machine.
func TestFuzzSeedStream(t *testing.T) {
	var st Stats
	rs := &recvState{req: &Request{Tokens: tokens(8)}, sink: &discardSink{t: t}, lim: fuzzLimits, st: &st}
	r := bytes.NewReader(fuzzStreamSeeds()[0])
	for {
		fr := readFrame(r, nil, fuzzLimits)
		if fr.err != nil {
			t.Fatal(fr.err)
		}
		done, err := rs.handle(&fr)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
	}
	if st.Chunks != 3 || st.States != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFuzzRangeSeedStream: the range seed is a complete valid stream for
// the fuzzer's ranged request (so the fuzzer starts deep in the range
// path), and the same bytes answering a request for every layer are
// refused at the header.
func TestFuzzRangeSeedStream(t *testing.T) {
	for _, ranged := range []bool{true, false} {
		var st Stats
		req := fuzzRequest(ranged)
		rs := &recvState{req: req, sink: &discardSink{t: t, req: req}, lim: fuzzLimits, st: &st}
		r := bytes.NewReader(rangeStreamSeeds()[0])
		for {
			fr := readFrame(r, nil, fuzzLimits)
			if fr.err != nil {
				t.Fatal(fr.err)
			}
			done, err := rs.handle(&fr)
			if !ranged {
				if !errors.Is(err, ErrMismatch) {
					t.Fatalf("range stream for a whole-model request: %v", err)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if done {
				if st.Chunks == 0 || st.States == 0 {
					t.Fatalf("stats %+v", st)
				}
				break
			}
		}
	}
}

// TestFP8StreamSeed: the fp8 seed of the fuzzers is a whole valid stream
// (header, chunks widened by the sink, states, Done), so the fuzzer starts
// from the real FP8 decode path.
func TestFP8StreamSeed(t *testing.T) {
	st := Stats{}
	rs := &recvState{req: &Request{Tokens: tokens(8)}, sink: &discardSink{t: t}, lim: fuzzLimits, st: &st}
	r := bytes.NewReader(streamSeeds(DTypeF8E4M3)[0])
	for {
		fr := readFrame(r, nil, fuzzLimits)
		if fr.err != nil {
			t.Fatal(fr.err)
		}
		done, err := rs.handle(&fr)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
	}
}
