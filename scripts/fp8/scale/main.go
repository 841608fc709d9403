// Command scale is the investigation behind docs/BENCHMARKS.md "FP8 KV
// wire: per-position cosine": an experiment to run by hand, not a test (it
// measures, it asserts nothing).
//
//	go run ./scripts/fp8/scale -model qwen3_next      # a directory under runners/engine/testdata/reference
//	go run ./scripts/fp8/scale -model gen:llama       # a 4-layer random-weight testmodel
//	go run ./scripts/fp8/scale -model gen:llama -spec # the wire's own scaling only
//
// Against the bf16 wire over 2,000 teacher-forced positions it prints the
// logits cosine and top-1 agreement of FP8 round trips of K and V, K alone,
// V alone, and with finer scales (per head and 16 tokens, per head and
// token, per head and channel). Tens of seconds per model on the cpu
// backend.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loaders
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvconv"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

func main() {
	model := flag.String("model", "", "a directory under runners/engine/testdata/reference, or gen:ARCH")
	spec := flag.Bool("spec", false, "run the wire's own scaling (per head over the chunk) only")
	flag.Parse()
	if *model == "" {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/fp8/scale -model NAME|gen:ARCH [-spec]")
		os.Exit(2)
	}
	if err := run(*model, *spec); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// variant is one way of quantizing the K and/or V of each bf16 chunk
// before import.
type variant struct {
	name  string
	k, v  bool
	group string // "head", "tok", "chan"
	tokN  int
}

// sink injects a bf16 KV stream into a cache, optionally through an E4M3
// round trip of each chunk (q).
type sink struct {
	cache     engine.KVCache
	wire      engine.DType
	q         *variant
	heads, hd int
}

func (s *sink) Begin(h *kvwire.Header) error {
	s.wire = kvconv.Engine(h.DType)
	if s.wire == 0 {
		return fmt.Errorf("wire dtype %v", h.DType)
	}
	return nil
}

func (s *sink) Chunk(layer, ts, tc int, k, v []byte) error {
	k, v = append([]byte(nil), k...), append([]byte(nil), v...)
	if s.q != nil && s.q.k {
		roundTrip(k, s.heads, s.hd, s.q.group, s.q.tokN)
	}
	if s.q != nil && s.q.v {
		roundTrip(v, s.heads, s.hd, s.q.group, s.q.tokN)
	}
	var err error
	if s.wire != s.cache.DType() {
		if k, err = kvconv.Convert(k, s.wire, s.cache.DType()); err != nil {
			return err
		}
		if v, err = kvconv.Convert(v, s.wire, s.cache.DType()); err != nil {
			return err
		}
	}
	return s.cache.Import(layer, ts, tc, k, v)
}

func (s *sink) State(layer, _ int, arrays [][]byte) error {
	rs, ok := s.cache.(engine.RecurrentState)
	if !ok || !rs.Recurrent(layer) {
		return fmt.Errorf("recurrent state for layer %d, which is not recurrent here", layer)
	}
	return rs.ImportState(layer, arrays)
}

func (s *sink) Done(t kvwire.Totals) error { return s.cache.Commit(t.TokenEnd) }
func (s *sink) Rollback()                  { s.cache.Truncate(0) }

func bf16ToF32(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// f32ToBF16 rounds to nearest even (NaN stays NaN).
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// roundTrip quantizes b (bf16, [heads, t, hd]) to E4M3 and back in place.
func roundTrip(b []byte, heads, hd int, group string, tokN int) {
	n := len(b) / 2
	t := n / heads / hd
	get := func(h, i, d int) float32 { return bf16ToF32(binary.LittleEndian.Uint16(b[2*((h*t+i)*hd+d):])) }
	set := func(h, i, d int, x float32) { binary.LittleEndian.PutUint16(b[2*((h*t+i)*hd+d):], f32ToBF16(x)) }
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

func run(which string, specOnly bool) error {
	path := filepath.Join("runners", "engine", "testdata", "reference", which)
	if a, ok := strings.CutPrefix(which, "gen:"); ok {
		dir, err := os.MkdirTemp("", "fp8-scale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "m")
		if err := testmodel.Write(path, testmodel.Spec{Arch: a, Seed: 7, Layers: 4, MaxPositions: 2048, SlidingWindow: map[string]int{"mistral": 128}[a]}); err != nil {
			return err
		}
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, path, cpu.New(2), engine.LoadOptions{})
	if err != nil {
		return err
	}
	defer m.Close()
	info := m.Info()
	quiet := slog.New(slog.DiscardHandler)
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 64, Metrics: metrics.New("prefill"), Logger: quiet})
	defer prod.Close()
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod, Logger: quiet})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
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
	variants := []variant{
		{"K+V head/64 (spec now)", true, true, "head", 0},
		{"K only", true, false, "head", 0},
		{"V only", false, true, "head", 0},
		{"K+V tok16", true, true, "tok", 16},
		{"K+V tok1", true, true, "tok", 1},
		{"K+V chan", true, true, "chan", 0},
	}
	if specOnly {
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
		get := func(q *variant) (engine.KVCache, error) {
			c := m.NewCache()
			req := &kvwire.Request{ID: "x", Model: "m", Fingerprint: fp, Tokens: prompt, DType: kvwire.DTypeBF16}
			if _, err := client.Fetch(ctx, l.Addr().String(), req, exp, &sink{cache: c, q: q, heads: info.KVHeads, hd: info.HeadDim}); err != nil {
				return nil, err
			}
			return c, nil
		}
		ref, err := get(nil)
		if err != nil {
			return err
		}
		caches := make([]engine.KVCache, len(variants))
		for i := range variants {
			if caches[i], err = get(&variants[i]); err != nil {
				return err
			}
		}
		last := prompt[plen-1]
		for st := range steps {
			a, err := m.Forward(ctx, ref, []int32{last})
			if err != nil {
				return err
			}
			ta := argmax(a)
			for i := range variants {
				b, err := m.Forward(ctx, caches[i], []int32{last})
				if err != nil {
					return err
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
				if argmax(b) == ta {
					r.agree++
				}
			}
			last = int32(ta)
		}
		ref.Free()
		for _, c := range caches {
			c.Free()
		}
	}
	for i, v := range variants {
		r := res[i]
		fmt.Printf("%-24s n=%d mean %.6f min %.6f below0.999 %d top1 %.4f\n", v.name, r.n, r.sum/float64(r.n), r.minC, r.low, float64(r.agree)/float64(r.n))
		fmt.Printf("   below 0.999 at steps %v\n", r.lowAt)
	}
	return nil
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}
