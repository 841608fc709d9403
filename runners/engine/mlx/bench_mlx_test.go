//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// benchModel returns the model directory to benchmark: $EXO_MLX_BENCH_MODEL
// (written there first, with SmolLM2-135M's shapes and random weights in
// $EXO_MLX_BENCH_DTYPE f32|bf16, when it holds no config.json; with
// $EXO_MLX_BENCH_SHAPE=8b Llama-3-8B's widths, =tiny the small model), or a
// small generated model.
func benchModel(b testing.TB) string {
	dir := os.Getenv("EXO_MLX_BENCH_MODEL")
	dt := engine.F32
	if os.Getenv("EXO_MLX_BENCH_DTYPE") == "bf16" {
		dt = engine.BF16
	}
	tiny := testmodel.Spec{Arch: "llama", DType: dt, Seed: 1, Layers: 4, Hidden: 256, Heads: 4, KVHeads: 2, Intermediate: 512, Vocab: 512, MaxPositions: 2048}
	if dir == "" {
		dir = filepath.Join(b.TempDir(), "m")
		if err := testmodel.Write(dir, tiny); err != nil {
			b.Fatal(err)
		}
		return dir
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		return dir
	}
	if os.Getenv("EXO_MLX_BENCH_SHAPE") == "tiny" { // the host-bound model, in a directory mlx-lm can load too
		if err := testmodel.Write(dir, tiny); err != nil {
			b.Fatal(err)
		}
		return dir
	}
	// SmolLM2-135M: 30 layers, width 576, 9 heads of 64 over 3 KV heads,
	// MLP 1536, vocabulary 49152.
	// testmodel's tokenizer cannot learn 49152 tokens: write the model with
	// a small vocabulary, then replace the weights and config's vocab_size
	// (the benchmark feeds token ids, not text).
	spec := testmodel.Spec{Arch: "llama", DType: dt, Seed: 1, Layers: 30, Hidden: 576, Heads: 9, KVHeads: 3, HeadDim: 64,
		Intermediate: 1536, Vocab: 512, MaxPositions: 8192}
	vocab := 49152
	if os.Getenv("EXO_MLX_BENCH_SHAPE") == "8b" {
		// Llama-3-8B's width, heads and MLP with $EXO_MLX_BENCH_LAYERS
		// layers (default 2) and tied embeddings (8B's are not), so that
		// it fits in memory here: a step's per-layer work and its
		// 128256-wide head are 8B's, its depth is not.
		spec = testmodel.Spec{Arch: "llama", DType: dt, Seed: 1, Layers: benchInt("EXO_MLX_BENCH_LAYERS", 2), Hidden: 4096,
			Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336, Vocab: 512, MaxPositions: 8192}
		vocab = 128256
	}
	if err := testmodel.Write(dir, spec); err != nil {
		b.Fatal(err)
	}
	spec.Vocab = vocab
	tensors, err := testmodel.Tensors(spec)
	if err != nil {
		b.Fatal(err)
	}
	tied := vocab == 128256 // 8B-shaped: the embedding is the head (2 GiB less in f32)
	if tied {
		tensors = slices.DeleteFunc(tensors, func(t engine.Tensor) bool { return strings.HasPrefix(t.Name, "lm_head.") })
	}
	if err := weights.WriteSafetensorsFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		b.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	cfg["vocab_size"] = spec.Vocab
	if tied {
		cfg["tie_word_embeddings"] = true
	}
	if raw, err = json.MarshalIndent(cfg, "", "  "); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

func benchInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchSampling is the sampling of the decode benchmarks: greedy, or
// $EXO_MLX_BENCH_TEMP > 0 with $EXO_MLX_BENCH_TOPP (seeded per row).
func benchSampling(row int) sample.Params {
	t, _ := strconv.ParseFloat(os.Getenv("EXO_MLX_BENCH_TEMP"), 64)
	p, _ := strconv.ParseFloat(os.Getenv("EXO_MLX_BENCH_TOPP"), 64)
	if t <= 0 {
		return sample.Params{}
	}
	return sample.Params{Temperature: t, TopP: p, Seed: int64(row + 1)}
}

// benchFeatures are the decode benchmarks' request features:
// $EXO_MLX_BENCH_LOGPROBS=N asks every row for logprobs with N top
// alternatives (unset: none); $EXO_MLX_BENCH_GRAMMAR=1 constrains every
// row with a mask made on the host from its last token (a grammar's
// shape: tokens whose id plus the last token's is a multiple of 3 are
// not allowed; its host cost is a pass over the vocabulary, as
// maskConstraint's, not a JSON grammar's trie walk, which
// maskConstraint prefetches on another goroutine).
func benchFeatures() (logprobs bool, top int, grammar bool) {
	if v, ok := os.LookupEnv("EXO_MLX_BENCH_LOGPROBS"); ok {
		top, _ = strconv.Atoi(v)
		logprobs = true
	}
	return logprobs, top, os.Getenv("EXO_MLX_BENCH_GRAMMAR") == "1"
}

// benchMask sets dst (V floats) to -Inf where benchFeatures' mask does
// not allow a token after last.
func benchMask(dst []float32, last int32) {
	ninf := float32(math.Inf(-1))
	for id := range dst {
		if (int32(id)+last)%3 == 0 {
			dst[id] = ninf
		}
	}
}

func benchPrompt(n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*7919 + 13) % (vocab - 3))
	}
	return p
}

// BenchmarkDecode measures greedy decode tokens/s (one Forward per token,
// logits to the host, argmax) after a $EXO_MLX_BENCH_CONTEXT-token prompt
// (default 128); the cache is cut back to the prompt every 256 tokens.
func BenchmarkDecode(b *testing.B) {
	be := newTestBackend(b)
	m := load(b, benchModel(b), be)
	ctx := context.Background()
	c := m.NewCache()
	defer c.Free()
	prompt := benchPrompt(benchInt("EXO_MLX_BENCH_CONTEXT", 128), m.Info().Vocab)
	if err := m.Prefill(ctx, c, prompt, 0, nil); err != nil {
		b.Fatal(err)
	}
	tok := prompt[len(prompt)-1]
	b.ReportAllocs()
	n := 0
	cpu0 := cpuTime()
	var host time.Duration // a step's time outside MLX's eval
	for b.Loop() {
		if c.Len() >= len(prompt)+256 {
			c.Truncate(len(prompt))
		}
		t0, e0 := time.Now(), be.evalNanos.Load()
		logits, err := m.Forward(ctx, c, []int32{tok})
		if err != nil {
			b.Fatal(err)
		}
		host += time.Since(t0) - time.Duration(be.evalNanos.Load()-e0)
		tok = argmax(logits)
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
	// host-ms/tok: building and queueing the step's graph, the MLX
	// thread's op calls and reading the logits back; eval excluded.
	b.ReportMetric(host.Seconds()*1e3/float64(n), "host-ms/tok")
	reportCPU(b, cpu0, n)
}

// cpuTime is the process's user+system CPU time (every thread: Go's, MLX's
// and OpenBLAS's), a measure less disturbed by other load than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration, tokens int) {
	if d := cpuTime() - start; d > 0 && tokens > 0 {
		b.ReportMetric(float64(d.Milliseconds())/float64(tokens), "cpu-ms/tok")
	}
}

// BenchmarkPrefill measures prefill tokens/s for a $EXO_MLX_BENCH_PREFILL-
// token prompt (default 512) in one chunk into an empty cache.
func BenchmarkPrefill(b *testing.B) {
	be := newTestBackend(b)
	m := load(b, benchModel(b), be)
	ctx := context.Background()
	c := m.NewCache()
	defer c.Free()
	prompt := benchPrompt(benchInt("EXO_MLX_BENCH_PREFILL", 512), m.Info().Vocab)
	// One untimed prefill first, as the mlx-lm script discards its first
	// repetition: the first pass pays for first-touch page faults and, where
	// MLX compiles kernels (Metal, CUDA, CPU fusion), for compiling them.
	if err := m.Prefill(ctx, c, prompt, len(prompt), nil); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(prompt)) * 4)
	b.ReportAllocs()
	// Peak memory above weights and cache: what a prefill's activations
	// take while its graph runs (mlx-lm's mx.get_peak_memory likewise).
	c.Truncate(0)
	base, _, err := be.ActiveMemory()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := be.PeakMemory(true); err != nil {
		b.Fatal(err)
	}
	n := 0
	cpu0 := cpuTime()
	for b.Loop() {
		c.Truncate(0)
		if err := m.Prefill(ctx, c, prompt, len(prompt), nil); err != nil {
			b.Fatal(err)
		}
		n += len(prompt)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
	reportCPU(b, cpu0, n)
	if peak, err := be.PeakMemory(false); err == nil {
		b.ReportMetric(float64(peak-base)/(1<<20), "peak-MB")
	}
}

// BenchmarkDecodeBatch measures batched greedy decode (sampled on the host
// with $EXO_MLX_BENCH_TEMP): one ForwardBatch of B sequences (each after
// the $EXO_MLX_BENCH_CONTEXT-token prompt) per iteration; tok/s counts
// every sequence's token, allocs/op are Go allocations per step. Batch
// sizes from $EXO_MLX_BENCH_BATCHES (default "1,4,8").
func BenchmarkDecodeBatch(b *testing.B) {
	be := newTestBackend(b)
	m := load(b, benchModel(b), be)
	ctx := context.Background()
	prompt := benchPrompt(benchInt("EXO_MLX_BENCH_CONTEXT", 128), m.Info().Vocab)
	for _, B := range benchBatches([]int{1, 4, 8}) {
		b.Run(fmt.Sprintf("B=%d", B), func(b *testing.B) {
			caches := make([]engine.KVCache, B)
			toks := make([]int32, B)
			for i := range caches {
				caches[i] = m.NewCache()
				defer caches[i].Free()
				if err := m.Prefill(ctx, caches[i], prompt, 0, nil); err != nil {
					b.Fatal(err)
				}
				toks[i] = prompt[len(prompt)-1-i]
			}
			samplers := make([]*sample.Sampler, B) // nil: argmax
			for i := range samplers {
				if p := benchSampling(i); p.Temperature > 0 {
					samplers[i] = sample.New(p)
				}
			}
			lp, top, grammar := benchFeatures()
			var masked []float32
			b.ReportAllocs()
			n, steps := 0, 0
			cpu0 := cpuTime()
			var host time.Duration
			for b.Loop() {
				if caches[0].Len() >= len(prompt)+256 {
					for _, c := range caches {
						c.Truncate(len(prompt))
					}
				}
				t0, e0 := time.Now(), be.evalNanos.Load()
				logits, err := m.ForwardBatch(ctx, caches, toks)
				if err != nil {
					b.Fatal(err)
				}
				for i := range toks {
					row := logits[i]
					if grammar {
						masked = append(masked[:0], row...)
						benchMask(masked, toks[i])
						row = masked
					}
					if samplers[i] != nil {
						toks[i] = samplers[i].Sample(row, nil)
					} else {
						toks[i] = argmax(row)
					}
					if lp {
						sinkLP, _ = sample.Logprobs(logits[i], toks[i], top)
					}
				}
				host += time.Since(t0) - time.Duration(be.evalNanos.Load()-e0)
				n += B
				steps++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(host.Seconds()*1e3/float64(steps), "host-ms/step")
			reportCPU(b, cpu0, n)
		})
	}
}

// BenchmarkDecodeOverlap is BenchmarkDecodeBatch through engine.Overlap:
// each step's tokens are picked on the device (argmax, or with
// $EXO_MLX_BENCH_TEMP the sampler's rules, SampleRows) and
// the next step is queued (async_eval) before they are read back, as
// mlx-lm's generate_step does. host-ms/step is a step's wall time outside
// MLX's eval (the read-back's wait included in eval): the host's share,
// which the overlap hides behind the step in flight. Batch sizes from
// $EXO_MLX_BENCH_BATCHES (default "1,4"); allocs/op are Go allocations
// per step.
func BenchmarkDecodeOverlap(b *testing.B) {
	be := newTestBackend(b)
	m := load(b, benchModel(b), be)
	ctx := context.Background()
	prompt := benchPrompt(benchInt("EXO_MLX_BENCH_CONTEXT", 128), m.Info().Vocab)
	for _, B := range benchBatches([]int{1, 4}) {
		b.Run(fmt.Sprintf("B=%d", B), func(b *testing.B) {
			caches := make([]engine.KVCache, B)
			toks := make([]int32, B)
			for i := range caches {
				caches[i] = m.NewCache()
				defer caches[i].Free()
				if err := m.Prefill(ctx, caches[i], prompt, 0, nil); err != nil {
					b.Fatal(err)
				}
				toks[i] = prompt[len(prompt)-1-i]
			}
			// Sampled rows (EXO_MLX_BENCH_TEMP) are picked on the device
			// with uniforms drawn from each row's seeded Sampler.
			// With benchFeatures, logprobs on the device and the mask
			// made on the host while the device runs the forward.
			specs := make([]engine.SampleSpec, B)
			lp, top, grammar := benchFeatures()
			last := slices.Clone(toks)
			for i := range specs {
				p := benchSampling(i)
				specs[i].Params = p
				if p.Temperature > 0 {
					specs[i].Uniform = sample.New(p).Uniform
				}
				specs[i].Logprobs, specs[i].Top = lp, top
				if grammar {
					specs[i].Mask = func(dst []float32) error { benchMask(dst, last[i]); return nil }
					specs[i].Accept = func(tok int32) error { last[i] = tok; return nil }
				}
			}
			o, err := m.StartOverlap(ctx, caches, toks, specs)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			n, steps := 0, 0
			cpu0, made0 := cpuTime(), be.made.Load()
			var host time.Duration
			for b.Loop() {
				if caches[0].Len() >= len(prompt)+256 {
					if err := o.Stop(); err != nil {
						b.Fatal(err)
					}
					for _, c := range caches {
						c.Truncate(len(prompt))
					}
					copy(last, toks)
					if o, err = m.StartOverlap(ctx, caches, toks, specs); err != nil {
						b.Fatal(err)
					}
				}
				t0, e0 := time.Now(), be.evalNanos.Load()
				got, err := o.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				copy(toks, got)
				if lp {
					sinkLP, _ = o.Logprob(0)
				}
				host += time.Since(t0) - time.Duration(be.evalNanos.Load()-e0)
				n += B
				steps++
			}
			if err := o.Stop(); err != nil {
				b.Fatal(err)
			}
			// arrays/step: the MLX arrays the host made per step (the
			// graph's nodes, views included), against mlx-lm's graph.
			b.ReportMetric(float64(be.made.Load()-made0)/float64(steps), "arrays/step")
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(host.Seconds()*1e3/float64(steps), "host-ms/step")
			reportCPU(b, cpu0, n)
		})
	}
}

// sinkLP keeps the benchmarks' logprobs alive.
var sinkLP float64

// benchBatches is $EXO_MLX_BENCH_BATCHES ("1,4"), or def.
func benchBatches(def []int) []int {
	v := os.Getenv("EXO_MLX_BENCH_BATCHES")
	if v == "" {
		return def
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		return def
	}
	return sizes
}
