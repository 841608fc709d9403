package kvwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// rangeModel has every kind of layer: full attention, sliding window and
// recurrent, in an order where each range below mixes them.
func rangeModel(dt DType) *testModel {
	return &testModel{fp: Fingerprint{0x5a}, dtype: dt, kvHeads: 2, headDim: 8, block: 5, tail: 1,
		kinds:   []LayerKind{LayerAttention, LayerRecurrent, LayerAttention, LayerAttention, LayerRecurrent, LayerAttention},
		windows: []int{0, 0, 4, 0, 0, 6}}
}

// layerBytes is the payload a sink received per model layer (stream layer
// + the header's first layer).
func layerBytes(s *recordSink) map[int]int64 {
	out := map[int]int64{}
	for _, c := range s.chunks {
		out[s.header.FirstLayer+c.layer] += int64(len(c.k) + len(c.v))
	}
	for l, n := range s.stateSum {
		out[s.header.FirstLayer+l] += n
	}
	return out
}

// TestLayerRangeRoundTrip: a request for layers [a, b) over real TCP gets a
// header for exactly those layers (first layer a, their kinds and
// windows) and Chunk and State frames for those layers only, indexed from
// 0 and carrying the bytes of the model's layers a…b−1; its payload is
// exactly those layers' share of the whole-model stream (the transfer's
// own counters). With one and three streams, and with the FP8 wire dtype.
func TestLayerRangeRoundTrip(t *testing.T) {
	for _, dt := range []DType{DTypeBF16, DTypeF8E4M3} {
		for _, streams := range []int{1, 3} {
			t.Run(fmt.Sprintf("%v/streams=%d", dt, streams), func(t *testing.T) {
				m := rangeModel(dt)
				addr, _ := startServer(t, ServerConfig{Producer: m.producer()})
				c := NewClient(ClientConfig{})
				const n, start = 23, 4
				whole := &recordSink{}
				wreq := &Request{ID: "whole", Model: "m", Fingerprint: m.fp, Tokens: tokens(n), StartPos: start, Streams: streams}
				if _, err := c.Fetch(context.Background(), addr, wreq, m.expect(), whole); err != nil {
					t.Fatal(err)
				}
				share := layerBytes(whole)
				for _, r := range [][2]int{{0, 2}, {2, 6}, {1, 4}, {5, 6}, {0, 6}} {
					req := &Request{ID: "range", Model: "m", Fingerprint: m.fp, Tokens: tokens(n), StartPos: start,
						Streams: streams, LayerStart: r[0], LayerEnd: r[1]}
					sink := &recordSink{}
					st, err := c.Fetch(context.Background(), addr, req, m.expectRange(r[0], r[1]), sink)
					if err != nil {
						t.Fatalf("layers %v: %v", r, err)
					}
					if sink.header.FirstLayer != r[0] || sink.header.Layers() != r[1]-r[0] {
						t.Fatalf("layers %v: header first layer %d, %d layers", r, sink.header.FirstLayer, sink.header.Layers())
					}
					// Reassembly may interleave layers differently: compare
					// in the producer's order (block, then layer).
					blk := func(c recChunk) int { return (c.start - start) / m.block }
					slices.SortStableFunc(sink.chunks, func(a, b recChunk) int {
						if d := blk(a) - blk(b); d != 0 {
							return d
						}
						return a.layer - b.layer
					})
					sink.verify(t, m, req)
					var want int64
					for l := r[0]; l < r[1]; l++ {
						want += share[l]
					}
					got := layerBytes(sink)
					for l := range share {
						if (l >= r[0] && l < r[1]) != (got[l] > 0) || got[l] > 0 && got[l] != share[l] {
							t.Fatalf("layers %v: model layer %d got %d bytes, its share is %d", r, l, got[l], share[l])
						}
					}
					if st.PayloadBytes != want || sink.totals.PayloadBytes != want || want == 0 {
						t.Fatalf("layers %v: %d payload bytes (done says %d), the range's share is %d", r, st.PayloadBytes, sink.totals.PayloadBytes, want)
					}
					if streams > 1 && st.Streams != streams {
						t.Fatalf("layers %v: %d streams, asked %d", r, st.Streams, streams)
					}
				}
			})
		}
	}
}

// TestLayerRangeRefused: the client refuses, before any KV, a header whose
// layers are not the range it asked for (or, asking for every layer, one
// that starts elsewhere than layer 0); the server refuses a producer's
// header for other layers than requested, a range beyond its model and a
// link probe with a range.
func TestLayerRangeRefused(t *testing.T) {
	m := rangeModel(DTypeBF16)
	c := NewClient(ClientConfig{})
	hdr := func(first, layers int) []byte {
		return encodeHeader(&Header{Fingerprint: m.fp, DType: DTypeBF16, KVHeads: 2, HeadDim: 8, FirstLayer: first,
			Kinds: m.kinds[first : first+layers], Windows: m.windows[first : first+layers], TokenStart: 0, TokenEnd: 9})
	}
	for _, tc := range []struct {
		name       string
		start, end int
		header     []byte
	}{
		{"range answered from layer 0", 1, 3, hdr(0, 2)},
		{"range answered with one layer more", 1, 3, hdr(1, 3)},
		{"range answered with one layer less", 1, 3, hdr(1, 1)},
		{"every layer answered from layer 2", 0, 0, hdr(2, 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, v := m.chunkBytes(0, 0, 9)
			addr := testutil.Peer(t, scripted(tc.header, chunkFrame(0, 0, 9, k, v)))
			sink := &recordSink{}
			req := &Request{Model: "m", Tokens: tokens(10), LayerStart: tc.start, LayerEnd: tc.end}
			exp := m.expect()
			if req.HasRange() {
				exp = m.expectRange(tc.start, tc.end)
			}
			_, err := c.Fetch(context.Background(), addr, req, exp, sink)
			if !errors.Is(err, ErrMismatch) || sink.begins != 0 || len(sink.chunks) != 0 || sink.rollbacks != 1 {
				t.Fatalf("err %v, %d begins, %d chunks, %d rollbacks", err, sink.begins, len(sink.chunks), sink.rollbacks)
			}
		})
	}

	// A producer that ignores the range is stopped by its own server.
	ignores := ProducerFunc(func(ctx context.Context, req *Request, e *Emitter) error {
		whole := *req
		whole.LayerStart, whole.LayerEnd = 0, 0
		return m.producer()(ctx, &whole, e)
	})
	addr, _ := startServer(t, ServerConfig{Producer: ignores})
	sink := &recordSink{}
	_, err := c.Fetch(context.Background(), addr, &Request{Model: "m", Tokens: tokens(10), LayerStart: 2, LayerEnd: 4}, m.expectRange(2, 4), sink)
	if !errors.Is(err, ErrRemoteInternal) || sink.begins != 0 {
		t.Fatalf("producer ignoring the range: %v, %d begins", err, sink.begins)
	}

	// A range beyond the model: mismatch (the test producer's check, as
	// the prefill runner's).
	addr, _ = startServer(t, ServerConfig{Producer: m.producer()})
	if _, err := c.Fetch(context.Background(), addr, &Request{Model: "m", Tokens: tokens(10), LayerStart: 4, LayerEnd: 7}, nil, &recordSink{}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("range beyond the model: %v", err)
	}
	// A link probe takes no range.
	if _, err := c.Fetch(context.Background(), addr, &Request{Model: ProbeModel, Tokens: tokens(4), LayerStart: 0, LayerEnd: 1}, nil, &recordSink{}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("probe with a range: %v", err)
	}
}

// TestLayerRangeCodec: the request's and the header's range fields round
// trip; ranges outside 0 ≤ start < end ≤ 1024 (other than unset) are
// refused when encoding and when parsing.
func TestLayerRangeCodec(t *testing.T) {
	lim := Limits{}.withDefaults()
	req := &Request{ID: "r", Model: "m", Tokens: tokens(5), StartPos: 1, LayerStart: 7, LayerEnd: 1024, Deadline: time.Second}
	b, err := encodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseRequest(b[frameHeaderSize:], lim)
	if err != nil || fmt.Sprint(*got) != fmt.Sprint(*req) || !got.HasRange() {
		t.Fatalf("request %+v, %v; want %+v", got, err, req)
	}
	for _, r := range [][2]int{{3, 3}, {4, 2}, {-1, 2}, {0, 1025}, {1, 0}} {
		bad := *req
		bad.LayerStart, bad.LayerEnd = r[0], r[1]
		if _, err := encodeRequest(&bad); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("range %v encoded: %v", r, err)
		}
		if r[0] < 0 {
			continue
		}
		p := bytes.Clone(b[frameHeaderSize:])
		le.PutUint32(p[52:56], uint32(r[0]))
		le.PutUint32(p[56:60], uint32(r[1]))
		if _, err := parseRequest(p, lim); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("range %v parsed: %v", r, err)
		}
	}
	h := &Header{Fingerprint: Fingerprint{1}, DType: DTypeF16, KVHeads: 2, HeadDim: 4, FirstLayer: 1020,
		Kinds: []LayerKind{0, 1, 0, 0}, Windows: []int{0, 0, 5, 0}, TokenStart: 2, TokenEnd: 40}
	gh, err := parseHeader(encodeHeader(h)[frameHeaderSize:])
	if err != nil || fmt.Sprint(*gh) != fmt.Sprint(*h) {
		t.Fatalf("header %+v, %v; want %+v", gh, err, h)
	}
	h.FirstLayer = 1021 // its four layers would end past 1024
	if validateHeader(h) == nil {
		t.Fatal("header past layer 1024 valid")
	}
	p := encodeHeader(&Header{DType: DTypeF16, KVHeads: 2, HeadDim: 4, Kinds: []LayerKind{0, 0}, TokenEnd: 4})[frameHeaderSize:]
	le.PutUint32(p[56:60], 1023)
	if _, err := parseHeader(p); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("header of layers [1023, 1025): %v", err)
	}
}
