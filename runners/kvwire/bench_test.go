package kvwire

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Benchmark geometry: Llama-3.1-8B-like KV in bf16 (8 KV heads × 128 head
// dim), 512-token blocks: K and V of one layer's block are 1 MiB each, so
// a chunk frame carries 2 MiB and 1 GiB is 512 chunks.
var benchModel = &testModel{fp: Fingerprint{0xbe}, kinds: make([]LayerKind, 32), kvHeads: 8, headDim: 128, dtype: DTypeBF16, block: 512, tail: 1}

const benchTotal = 1 << 30

// benchProducer emits chunks of the bench model until total payload bytes
// are out. It reuses one K and one V buffer (never modified). Each chunk
// is emitted at start + (i+1)·every when every > 0 (a paced "compute").
func benchProducer(total int64, every time.Duration) ProducerFunc {
	m := benchModel
	k, v := m.chunkBytes(0, 0, m.block)
	per := int64(len(k) + len(v))
	chunks := int((total + per - 1) / per)
	layers := len(m.kinds)
	return func(ctx context.Context, req *Request, e *Emitter) error {
		blocks := (chunks + layers - 1) / layers
		h := Header{Fingerprint: m.fp, DType: m.dtype, KVHeads: m.kvHeads, HeadDim: m.headDim,
			Kinds: m.kinds[:min(layers, chunks)], TokenStart: 0, TokenEnd: blocks * m.block}
		if err := e.Header(h); err != nil {
			return err
		}
		start := time.Now()
		i := 0
		for b := range blocks {
			for l := range h.Kinds {
				if every > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i+1) * every)))
				}
				if err := e.Chunk(l, b*m.block, m.block, k, v); err != nil {
					return err
				}
				i++
			}
		}
		return nil
	}
}

type nullSink struct{}

func (nullSink) Begin(*Header) error                       { return nil }
func (nullSink) Chunk(int, int, int, []byte, []byte) error { return nil }
func (nullSink) State(int, int, [][]byte) error            { return nil }
func (nullSink) Done(Totals) error                         { return nil }
func (nullSink) Rollback()                                 {}

// startRaw serves total bytes per connection from a 2 MiB buffer: the raw
// TCP baseline (no framing, no digest).
func startRaw(b *testing.B, total int64) string { return startRawPaced(b, total, 0) }

// startRawPaced is startRaw writing its i-th 2 MiB at start + (i+1)·every.
func startRawPaced(b *testing.B, total int64, every time.Duration) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 2<<20)
	pattern(buf, 0, 0, 'r')
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				start := time.Now()
				for n := int64(0); n < total; n += int64(len(buf)) {
					if every > 0 {
						time.Sleep(time.Until(start.Add(time.Duration(n/int64(len(buf))+1) * every)))
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	b.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

func rawFetch(b *testing.B, addr string, buf []byte) int64 {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var n int64
	for {
		m, err := io.ReadFull(c, buf)
		n += int64(m)
		if err != nil {
			return n
		}
	}
}

// benchGoodput streams benchTotal bytes per iteration both ways — raw TCP
// and kvwire — interleaved in the same loop so both see the same machine
// load, and reports each rate and their ratio.
func benchGoodput(b *testing.B, rate float64, total int64) {
	rawAddr := startRaw(b, total)
	kvAddr, _ := startServer(b, ServerConfig{Producer: benchProducer(total, 0)})
	if rate > 0 {
		rawAddr = startProxy(b, &proxy{target: rawAddr, rate: rate})
		kvAddr = startProxy(b, &proxy{target: kvAddr, rate: rate})
	}
	ra, _ := strconv.Atoi(os.Getenv("KVWIRE_BENCH_READAHEAD"))
	c := NewClient(ClientConfig{ReadAhead: ra})
	req := &Request{Tokens: make([]int32, DefaultMaxTokens), Deadline: time.Hour}
	buf := make([]byte, 2<<20)
	var rawT, kvT, rawCPU, kvCPU time.Duration
	var rawN, kvN int64
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		c0, t0 := cpuTime(), time.Now()
		rawN += rawFetch(b, rawAddr, buf)
		c1, t1 := cpuTime(), time.Now()
		st, err := c.Fetch(context.Background(), kvAddr, req, nil, nullSink{})
		if err != nil {
			b.Fatal(err)
		}
		kvT += time.Since(t1)
		kvCPU += cpuTime() - c1
		rawT += t1.Sub(t0)
		rawCPU += c1 - c0
		kvN += st.PayloadBytes
	}
	rawRate := float64(rawN) / rawT.Seconds() / 1e9
	kvRate := float64(kvN) / kvT.Seconds() / 1e9
	b.ReportMetric(rawRate, "raw_GB/s")
	b.ReportMetric(kvRate, "kvwire_GB/s")
	b.ReportMetric(kvRate/rawRate, "ratio")
	// CPU seconds (both ends, user + system) per GiB: on a shared machine
	// this is steadier than wall time, and when the CPU is the limit
	// raw/kvwire CPU is the goodput ratio the protocol allows.
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	b.ReportMetric(rawCPU.Seconds()/gib(rawN), "raw_cpu_s/GiB")
	b.ReportMetric(kvCPU.Seconds()/gib(kvN), "kvwire_cpu_s/GiB")
	b.ReportMetric((rawCPU.Seconds()/gib(rawN))/(kvCPU.Seconds()/gib(kvN)), "cpu_ratio")
}

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGoodput: plain loopback (CPU-bound) and a link shaped to 10GbE's
// 1.17 GB/s (and 1GbE's 0.117 GB/s). ns/op and MB/s cover raw + kvwire
// together; read the metrics.
func BenchmarkGoodput(b *testing.B) {
	b.Run("loopback", func(b *testing.B) { benchGoodput(b, 0, benchTotal) })
	b.Run("10GbE", func(b *testing.B) { benchGoodput(b, 1.17e9, benchTotal) })
	// A link slow enough that a loaded 2-core machine can still fill it:
	// shows the protocol's overhead when the link, not the CPU, is the limit.
	b.Run("1GbE-256MiB", func(b *testing.B) { benchGoodput(b, 0.117e9, 256<<20) })
}

// BenchmarkOverlap: a producer emitting one 2 MiB chunk every T through a
// link of B bytes/s. ideal = max(P + c/B, T + N·c/B) where P = N·T is the
// producer's time and c the chunk size: the slower of compute and wire, plus
// one chunk of the other. Reports measured/ideal (goal ≤ 1.10), and the
// same for raw TCP paced the same way through the same kind of proxy
// (raw_ratio): the gap between the two is the protocol's, the rest is the
// link emulation's on a loaded machine.
func BenchmarkOverlap(b *testing.B) {
	for _, tc := range []struct {
		name   string
		chunks int
		every  time.Duration
		rate   float64
	}{
		{"compute-bound", 64, 10 * time.Millisecond, 400e6},
		{"link-bound", 64, 5 * time.Millisecond, 200e6},
		{"balanced", 64, 8 * time.Millisecond, 262e6},
	} {
		b.Run(tc.name, func(b *testing.B) {
			per := int64(2 << 20)
			total := per * int64(tc.chunks)
			addr, _ := startServer(b, ServerConfig{Producer: benchProducer(total, tc.every)})
			c := NewClient(ClientConfig{})
			req := &Request{Tokens: make([]int32, tc.chunks/len(benchModel.kinds)*512+513), Deadline: time.Hour}
			prod := time.Duration(tc.chunks) * tc.every
			wire := time.Duration(float64(total) / tc.rate * float64(time.Second))
			one := time.Duration(float64(per) / tc.rate * float64(time.Second))
			ideal := max(prod+one, tc.every+wire)
			rawAddr := startRawPaced(b, total, tc.every)
			rawBuf := make([]byte, 2<<20)
			var worst, sum, rawSum float64
			n := 0
			b.SetBytes(total)
			b.ReportAllocs()
			for b.Loop() {
				// Fresh proxies per iteration: a link's clock starts at connect.
				b.StopTimer()
				pa := startProxy(b, &proxy{target: addr, rate: tc.rate})
				pr := startProxy(b, &proxy{target: rawAddr, rate: tc.rate})
				t0 := time.Now()
				rawFetch(b, pr, rawBuf)
				rawSum += float64(time.Since(t0)) / float64(ideal)
				b.StartTimer()
				t0 = time.Now()
				if _, err := c.Fetch(context.Background(), pa, req, nil, nullSink{}); err != nil {
					b.Fatal(err)
				}
				r := float64(time.Since(t0)) / float64(ideal)
				worst = max(worst, r)
				sum += r
				n++
			}
			b.ReportMetric(sum/float64(n), "ratio")
			b.ReportMetric(worst, "worst_ratio")
			b.ReportMetric(rawSum/float64(n), "raw_ratio")
			b.ReportMetric(ideal.Seconds()*1e3, "ideal_ms")
		})
	}
}

// BenchmarkCRC32C is the digest's cost on this machine (one core).
func BenchmarkCRC32C(b *testing.B) {
	buf := make([]byte, 2<<20)
	pattern(buf, 0, 0, 'c')
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		frameCRC(buf[:8], buf)
	}
}
