package decode

import (
	"context"
	"encoding/binary"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/half"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// quantSink wraps a cacheSink: each bf16 chunk's K and/or V goes through an
// E4M3 round trip with one scale per group before import: "head" (per head
// over the chunk, as the FP8 wire does), "tok" (per head and tokN tokens)
// or "chan" (per head and channel over the chunk).
type quantSink struct {
	*cacheSink
	k, v  bool
	group string // "head", "tokN", "chan"
	tokN  int
	heads int
	hd    int
}

// roundTrip quantizes b (bf16, [heads, t, hd]) to E4M3 and back in place.
func roundTrip(b []byte, heads, hd int, group string, tokN int) {
	n := len(b) / 2
	t := n / heads / hd
	get := func(h, i, d int) float32 { return half.BF16ToF32(binary.LittleEndian.Uint16(b[2*((h*t+i)*hd+d):])) }
	set := func(h, i, d int, x float32) { binary.LittleEndian.PutUint16(b[2*((h*t+i)*hd+d):], half.F32ToBF16(x)) }
	q := func(x, s float32) float32 { return kvwire.E4M3ToF32(kvwire.F32ToE4M3(x/s)) * s }
	for h := range heads {
		switch group {
		case "head", "tok":
			g := t
			if group == "tok" {
				g = tokN
			}
			for i0 := 0; i0 < t; i0 += g {
				var amax float32
				for i := i0; i < min(i0+g, t); i++ {
					for d := range hd {
						amax = max(amax, float32(math.Abs(float64(get(h, i, d)))))
					}
				}
				s := amax / 448
				if s == 0 {
					s = 1
				}
				for i := i0; i < min(i0+g, t); i++ {
					for d := range hd {
						set(h, i, d, q(get(h, i, d), s))
					}
				}
			}
		case "chan":
			for d := range hd {
				var amax float32
				for i := range t {
					amax = max(amax, float32(math.Abs(float64(get(h, i, d)))))
				}
				s := amax / 448
				if s == 0 {
					s = 1
				}
				for i := range t {
					set(h, i, d, q(get(h, i, d), s))
				}
			}
		}
	}
}

func (s *quantSink) Chunk(layer, ts, tc int, k, v []byte) error {
	k, v = append([]byte(nil), k...), append([]byte(nil), v...)
	if s.k {
		roundTrip(k, s.heads, s.hd, s.group, s.tokN)
	}
	if s.v {
		roundTrip(v, s.heads, s.hd, s.group, s.tokN)
	}
	return s.cacheSink.Chunk(layer, ts, tc, k, v)
}

// TestFP8ScaleExperiment is the investigation behind docs/BENCHMARKS.md
// "FP8 KV wire: per-position cosine", by hand only:
//
//	EXO_FP8_EXPERIMENT=qwen3_next go test ./runners/decode -run TestFP8ScaleExperiment -v
//
// (a directory under engine/testdata/reference, or gen:ARCH for a 4-layer
// testmodel; EXO_FP8_EXPERIMENT_SPEC=1 runs the wire's own scaling only).
// Against the bf16 wire over 2,000 teacher-forced positions it prints the
// logits cosine and top-1 agreement of FP8 round trips of K and V, K alone,
// V alone, and with finer scales (per head and 16 tokens, per head and
// token, per head and channel).
func TestFP8ScaleExperiment(t *testing.T) {
	which := os.Getenv("EXO_FP8_EXPERIMENT")
	if which == "" {
		t.Skip("set EXO_FP8_EXPERIMENT=MODEL (by hand: tens of seconds per model)")
	}
	path := filepath.Join("..", "engine", "testdata", "reference", which)
	if a, ok := strings.CutPrefix(which, "gen:"); ok {
		path = filepath.Join(t.TempDir(), "m")
		if err := testmodel.Write(path, testmodel.Spec{Arch: a, Seed: 7, Layers: 4, MaxPositions: 2048, SlidingWindow: map[string]int{"mistral": 128}[a]}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := engine.Load(context.Background(), path, cpu.New(2), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	info := m.Info()
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 64, Metrics: metrics.New("prefill")})
	defer prod.Close()
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Serve(sctx, l)
	client := kvwire.NewClient(kvwire.ClientConfig{})
	fp := kvwire.Fingerprint(m.Fingerprint())
	kinds := make([]kvwire.LayerKind, info.Layers)
	for i, r := range info.Recurrent {
		if r {
			kinds[i] = kvwire.LayerRecurrent
		}
	}
	exp := &kvwire.Expect{Fingerprint: fp, Kinds: kinds, Windows: info.Windows, KVHeads: info.KVHeads, HeadDim: info.HeadDim}
	variants := []struct {
		name  string
		k, v  bool
		group string
		tokN  int
	}{
		{"K+V head/64 (spec now)", true, true, "head", 0},
		{"K only", true, false, "head", 0},
		{"V only", false, true, "head", 0},
		{"K+V tok16", true, true, "tok", 16},
		{"K+V tok1", true, true, "tok", 1},
		{"K+V chan", true, true, "chan", 0},
	}
	if os.Getenv("EXO_FP8_EXPERIMENT_SPEC") != "" {
		variants = variants[:1]
	}
	const prompts, plen, steps = 4, 601, 500
	type acc struct {
		minC, sum     float64
		low, agree, n int
		lowAt         []int
	}
	res := make([]acc, len(variants))
	for i := range res {
		res[i].minC = 1
	}
	for p := range prompts {
		prompt := make([]int32, plen)
		for i := range prompt {
			prompt[i] = int32(3 + (i*37+p*101+i*i*7)%min(500, info.Vocab-3))
		}
		get := func(q *quantSink) engine.KVCache {
			c := m.NewCache()
			var sink kvwire.Sink = &cacheSink{cache: c}
			if q != nil {
				q.cacheSink = &cacheSink{cache: c}
				sink = q
			}
			req := &kvwire.Request{ID: "x", Model: "m", Fingerprint: fp, Tokens: prompt, DType: kvwire.DTypeBF16}
			if _, err := client.Fetch(ctx, l.Addr().String(), req, exp, sink); err != nil {
				t.Fatal(err)
			}
			return c
		}
		ref := get(nil)
		caches := make([]engine.KVCache, len(variants))
		for i, v := range variants {
			caches[i] = get(&quantSink{k: v.k, v: v.v, group: v.group, tokN: v.tokN, heads: info.KVHeads, hd: info.HeadDim})
		}
		last := prompt[plen-1]
		for st := range steps {
			a, err := m.Forward(ctx, ref, []int32{last})
			if err != nil {
				t.Fatal(err)
			}
			ta := argmaxHybrid(a)
			for i := range variants {
				b, err := m.Forward(ctx, caches[i], []int32{last})
				if err != nil {
					t.Fatal(err)
				}
				cs := cosine(a, b)
				r := &res[i]
				r.minC = math.Min(r.minC, cs)
				r.sum += cs
				r.n++
				if cs < 0.999 {
					r.low++
					r.lowAt = append(r.lowAt, st)
				}
				if argmaxHybrid(b) == ta {
					r.agree++
				}
			}
			last = int32(ta)
		}
	}
	for i, v := range variants {
		r := res[i]
		t.Logf("%-24s n=%d mean %.6f min %.6f below0.999 %d top1 %.4f\n", v.name, r.n, r.sum/float64(r.n), r.minC, r.low, float64(r.agree)/float64(r.n))
		t.Logf("   below 0.999 at steps %v", r.lowAt)
	}
}
