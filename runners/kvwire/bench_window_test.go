package kvwire

import (
	"context"
	"testing"
	"time"
)

// gpt-oss-20b's KV geometry: 24 layers alternating sliding (window 128) and
// full attention, 8 KV heads × 64 head dim, bf16; an 8,192-token prompt in
// 512-token chunks.
const (
	ossLayers, ossKVHeads, ossHeadDim, ossWindow = 24, 8, 64, 128
	ossPrompt, ossChunk                          = 8192, 512
)

// ossProducer streams the prompt's KV; with windowed set, the header states
// the windows and each sliding layer carries only [LayerStart, TokenEnd)
// (what the prefill runner does), else every layer carries every position.
func ossProducer(windowed bool) ProducerFunc {
	h := Header{Fingerprint: Fingerprint{0x05}, DType: DTypeBF16, KVHeads: ossKVHeads, HeadDim: ossHeadDim,
		Kinds: make([]LayerKind, ossLayers), TokenStart: 0, TokenEnd: ossPrompt - 1}
	if windowed {
		h.Windows = make([]int, ossLayers)
		for l := 0; l < ossLayers; l += 2 {
			h.Windows[l] = ossWindow
		}
	}
	k := make([]byte, h.KVBytes(ossChunk))
	v := make([]byte, len(k))
	pattern(k, 0, 0, 'k')
	pattern(v, 0, 0, 'v')
	return func(ctx context.Context, req *Request, e *Emitter) error {
		if err := e.Header(h); err != nil {
			return err
		}
		for s := 0; s < h.TokenEnd; s += ossChunk {
			for l := range ossLayers {
				from, to := max(s, h.LayerStart(l)), min(s+ossChunk, h.TokenEnd)
				if from >= to {
					continue
				}
				n := int(h.KVBytes(to - from))
				if err := e.Chunk(l, from, to-from, k[:n], v[:n]); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// BenchmarkSlidingWindowWire: the KV of a gpt-oss-shaped 8k-token prompt
// sent window-aware (protocol v2: sliding layers carry their last 127
// positions) and with every position, through a link shaped to 10GbE and
// over plain loopback, interleaved in one loop. Reports each variant's
// payload bytes and transfer seconds and the ratios all/windowed.
func BenchmarkSlidingWindowWire(b *testing.B) {
	for _, tc := range []struct {
		name string
		rate float64
	}{{"10GbE", 1.17e9}, {"loopback", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			winAddr, _ := startServer(b, ServerConfig{Producer: ossProducer(true)})
			allAddr, _ := startServer(b, ServerConfig{Producer: ossProducer(false)})
			if tc.rate > 0 {
				winAddr = startProxy(b, &proxy{target: winAddr, rate: tc.rate})
				allAddr = startProxy(b, &proxy{target: allAddr, rate: tc.rate})
			}
			c := NewClient(ClientConfig{})
			req := &Request{Tokens: make([]int32, ossPrompt), Deadline: time.Hour}
			var winT, allT time.Duration
			var winN, allN int64
			b.ReportAllocs()
			for b.Loop() {
				st, err := c.Fetch(context.Background(), winAddr, req, nil, nullSink{})
				if err != nil {
					b.Fatal(err)
				}
				winT += st.Duration
				winN = st.PayloadBytes
				st, err = c.Fetch(context.Background(), allAddr, req, nil, nullSink{})
				if err != nil {
					b.Fatal(err)
				}
				allT += st.Duration
				allN = st.PayloadBytes
			}
			n := float64(b.N)
			b.ReportMetric(float64(winN)/1e6, "windowed_MB")
			b.ReportMetric(float64(allN)/1e6, "all_MB")
			b.ReportMetric(float64(allN)/float64(winN), "bytes_ratio")
			b.ReportMetric(winT.Seconds()/n, "windowed_s")
			b.ReportMetric(allT.Seconds()/n, "all_s")
			b.ReportMetric(allT.Seconds()/winT.Seconds(), "time_ratio")
		})
	}
}
