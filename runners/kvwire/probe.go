package kvwire

import (
	"context"
	"fmt"
	"time"
)

// ProbeModel is the reserved model name of a link probe: a Request for it
// is answered by every Server itself, without its Producer and without
// waiting for admission, with a stream of zero-filled KV of a fixed,
// Llama-3.1-8B-like layout (PROTOCOL.md §16). A probe goes through the
// same Hello, authentication, frames and checksums as a real request, so it
// proves the secret and measures what the KV wire delivers on the link.
const ProbeModel = "exo/link-probe"

// ProbeMaxTokens bounds a probe (ProbeBytesPerToken each: 512 MiB).
const ProbeMaxTokens = 4096

// probeChunk is the tokens per Chunk frame of a probe.
const probeChunk = 128

// probeHeader is the layout a probe streams: 32 attention layers, 8 KV
// heads of 128, bf16 — 128 KiB of K+V per token.
func probeHeader(tokens int) Header {
	kinds := make([]LayerKind, 32)
	return Header{DType: DTypeBF16, KVHeads: 8, HeadDim: 128, Kinds: kinds, TokenEnd: tokens}
}

// ProbeBytesPerToken is the K+V payload a probe sends per token.
var ProbeBytesPerToken = func() int64 { h := probeHeader(1); return 2 * h.KVBytes(1) * int64(h.Layers()) }()

// produceProbe streams the probe's zero KV, layer by layer.
func produceProbe(req *Request, e *Emitter) error {
	n := len(req.Tokens)
	if n > ProbeMaxTokens {
		return fmt.Errorf("%w: probe of %d tokens (limit %d)", ErrBadRequest, n, ProbeMaxTokens)
	}
	if req.StartPos != 0 || !req.Fingerprint.IsZero() || req.HasRange() {
		return fmt.Errorf("%w: a probe has no start_pos, no fingerprint and no layer range", ErrBadRequest)
	}
	h := probeHeader(n)
	if err := e.Header(h); err != nil {
		return err
	}
	zero := make([]byte, h.KVBytes(probeChunk))
	for l := range h.Layers() {
		for t := 0; t < n; t += probeChunk {
			c := min(probeChunk, n-t)
			b := zero[:h.KVBytes(c)]
			if err := e.Chunk(l, t, c, b, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// ProbeResult is what a link probe measured.
type ProbeResult struct {
	Stats
	// Transfer is the time from the header to the end of the stream.
	Transfer time.Duration
}

// Goodput is the KV payload bytes per second after the header.
func (r ProbeResult) Goodput() float64 {
	if r.Transfer <= 0 {
		return 0
	}
	return float64(r.PayloadBytes) / r.Transfer.Seconds()
}

// Probe streams tokens × ProbeBytesPerToken bytes of probe KV from the
// server at addr (1 ≤ tokens ≤ ProbeMaxTokens) and measures it. With one
// token it is a cheap check that the server answers and that both sides
// hold the same secret (errors wrap ErrAuth when they do not).
func (c *Client) Probe(ctx context.Context, addr string, tokens int) (ProbeResult, error) {
	return c.ProbeStreams(ctx, addr, tokens, 1)
}

// ProbeStreams is Probe striped over streams connections (PROTOCOL.md
// §17), the way transfers with that many streams go.
func (c *Client) ProbeStreams(ctx context.Context, addr string, tokens, streams int) (ProbeResult, error) {
	if tokens < 1 || tokens > ProbeMaxTokens {
		return ProbeResult{}, fmt.Errorf("kvwire: probe of %d tokens (1 to %d)", tokens, ProbeMaxTokens)
	}
	req := &Request{ID: "probe", Model: ProbeModel, Tokens: make([]int32, tokens), Streams: streams}
	st, err := c.Fetch(ctx, addr, req, nil, discard{})
	return ProbeResult{Stats: st, Transfer: st.Duration - st.FirstHeader}, err
}

// discard is a Sink that keeps nothing.
type discard struct{}

func (discard) Begin(*Header) error                       { return nil }
func (discard) Chunk(int, int, int, []byte, []byte) error { return nil }
func (discard) State(int, int, [][]byte) error            { return nil }
func (discard) Done(Totals) error                         { return nil }
func (discard) Rollback()                                 {}
