package kvwire_test

import (
	"context"
	"fmt"
	"net"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// countSink counts what it is given; a decode runner's sink would Import
// each chunk into its KV cache and, on Rollback, truncate to start_pos.
type countSink struct{ chunks, bytes int }

func (s *countSink) Begin(h *kvwire.Header) error { return nil }
func (s *countSink) Chunk(layer, start, n int, k, v []byte) error {
	s.chunks++
	s.bytes += len(k) + len(v)
	return nil
}
func (s *countSink) State(layer, end int, arrays [][]byte) error { return nil }
func (s *countSink) Done(t kvwire.Totals) error                  { return nil }
func (s *countSink) Rollback()                                   {}

func Example() {
	fp := kvwire.Fingerprint{1}
	kinds := []kvwire.LayerKind{kvwire.LayerAttention, kvwire.LayerAttention}
	// Prefill side: a producer that "computes" 4-token blocks.
	srv, _ := kvwire.NewServer(kvwire.ServerConfig{
		Secret: []byte("cluster secret"),
		Producer: kvwire.ProducerFunc(func(ctx context.Context, req *kvwire.Request, e *kvwire.Emitter) error {
			h := kvwire.Header{Fingerprint: fp, DType: kvwire.DTypeBF16, KVHeads: 2, HeadDim: 4, Kinds: kinds,
				TokenStart: req.StartPos, TokenEnd: len(req.Tokens) - 1}
			if err := e.Header(h); err != nil {
				return err
			}
			for s := h.TokenStart; s < h.TokenEnd; s += 4 {
				n := min(4, h.TokenEnd-s)
				for l := range kinds {
					k := make([]byte, h.KVBytes(n)) // engine: cache.Export(l, s, n)
					v := make([]byte, h.KVBytes(n))
					if err := e.Chunk(l, s, n, k, v); err != nil {
						return err // client gone or deadline: stop computing
					}
				}
			}
			return nil
		}),
	})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, l)

	// Decode side.
	c := kvwire.NewClient(kvwire.ClientConfig{Secret: []byte("cluster secret")})
	sel := kvwire.NewSelector([]kvwire.Endpoint{{Addr: l.Addr().String()}})
	sink := &countSink{}
	req := &kvwire.Request{ID: "req-1", Model: "m", Tokens: make([]int32, 11), StartPos: 2, Fingerprint: fp}
	st, err := c.FetchAny(ctx, sel, req, &kvwire.Expect{Fingerprint: fp, Kinds: kinds, KVHeads: 2, HeadDim: 4}, sink)
	fmt.Println(err, sink.chunks, sink.bytes, st.Chunks)
	// Output: <nil> 4 512 4
}
