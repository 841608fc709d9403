package engine_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// cpuTime is this process's user+system CPU time. On a shared machine the
// wall-clock tokens/s depends on the other tenants; tokens per CPU-second
// (reported next to it) does much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportTokens(b *testing.B, tokens int, cpu0 time.Duration) {
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(tokens)/cpu.Seconds(), "tokens/cpu-s")
	}
}

// benchPrompt is n token ids of real text (the tokenizer's encoding of a
// repeated paragraph), so attention sees a realistic sequence.
func benchPrompt(b *testing.B, s smol, n int) []int32 {
	text := "The quick brown fox jumps over the lazy dog while the committee debates the merits of rotary position embeddings. "
	var ids []int32
	for len(ids) < n {
		ids = append(ids, s.tok.Encode(text)...)
	}
	return ids[:n]
}

// BenchmarkSmolLM2Prefill measures prompt processing of SmolLM2-135M
// (Q4_1 GGUF, or $EXO_SMOLLM2_GGUF) on the cpu backend: tokens/s for a
// 128-token prompt, and for 512 and 2048 (chunks of 512) as sub-benchmarks
// (-bench 'SmolLM2Prefill/2048').
func BenchmarkSmolLM2Prefill(b *testing.B) {
	s := loadSmol(b)
	ctx := context.Background()
	for _, n := range []int{128, 512, 2048} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ids := benchPrompt(b, s, n)
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				c := s.m.NewCache()
				if err := s.m.Prefill(ctx, c, ids, 0, nil); err != nil {
					b.Fatal(err)
				}
			}
			reportTokens(b, len(ids)*b.N, cpu0)
		})
	}
}

// BenchmarkSmolLM2Decode measures generation speed: one token per
// iteration after a 128-token prompt (the cache grows by one each step).
func BenchmarkSmolLM2Decode(b *testing.B) {
	s := loadSmol(b)
	ids := benchPrompt(b, s, 128)
	ctx := context.Background()
	c := s.m.NewCache()
	if err := s.m.Prefill(ctx, c, ids, 0, nil); err != nil {
		b.Fatal(err)
	}
	tok := ids[len(ids)-1]
	// One step before timing: the logits buffer, the backend's step arena
	// and the model's scratch take their size (reused afterwards).
	logits, err := s.m.ForwardInto(ctx, c, []int32{tok}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		if c.Len() > 1024 {
			c.Truncate(len(ids))
		}
		if logits, err = s.m.ForwardInto(ctx, c, []int32{tok}, logits); err != nil {
			b.Fatal(err)
		}
		tok = int32(argmax(logits))
	}
	reportTokens(b, b.N, cpu0)
}

// BenchmarkSmolLM2DecodeBatch measures batched generation: one
// ForwardBatchInto step of B sequences (each after the same 128-token
// prompt) per iteration; tokens/s counts all B sequences' tokens, to
// compare with BenchmarkSmolLM2Decode (B = 1 through ForwardInto).
func BenchmarkSmolLM2DecodeBatch(b *testing.B) {
	s := loadSmol(b)
	ids := benchPrompt(b, s, 128)
	ctx := context.Background()
	for _, B := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("B=%d", B), func(b *testing.B) {
			caches := make([]engine.KVCache, B)
			toks := make([]int32, B)
			for i := range caches {
				caches[i] = s.m.NewCache()
				if err := s.m.Prefill(ctx, caches[i], ids, 0, nil); err != nil {
					b.Fatal(err)
				}
				toks[i] = ids[len(ids)-1-i]
			}
			flat := make([]float32, 0, B*s.m.Info().Vocab)                           // reused
			if _, err := s.m.ForwardBatchInto(ctx, caches, toks, flat); err != nil { // warm
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if caches[0].Len() > 1024 {
					for _, c := range caches {
						c.Truncate(len(ids))
					}
				}
				logits, err := s.m.ForwardBatchInto(ctx, caches, toks, flat)
				if err != nil {
					b.Fatal(err)
				}
				for i := range toks {
					toks[i] = int32(argmax(logits[i]))
				}
			}
			reportTokens(b, B*b.N, cpu0)
		})
	}
}

// BenchmarkSmolLM2VerifyBatch measures what verifying drafts costs in a
// batch: four sequences (each after the same 128-token prompt), each
// verifying k drafts (k+1 positions), as one ForwardBatchAllInto step
// ("batched", how the decode batcher verifies) against four
// ForwardAllInto forwards of their own ("alone", how each generation
// verified before), and against a plain step of the four (ForwardBatchInto,
// one position each: "plain"). Every iteration rolls the caches back to
// where they were (every draft rejected), so each step sees the same
// context.
func BenchmarkSmolLM2VerifyBatch(b *testing.B) {
	s := loadSmol(b)
	ids := benchPrompt(b, s, 128)
	ctx := context.Background()
	const B = 4
	caches := make([]engine.KVCache, B)
	for i := range caches {
		caches[i] = s.m.NewCache()
		if err := s.m.Prefill(ctx, caches[i], ids, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
	V := s.m.Info().Vocab
	for _, k := range []int{0, 2, 8} {
		chunks := make([][]int32, B)
		toks := make([]int32, B)
		for i := range chunks {
			toks[i] = ids[len(ids)-1-i]
			chunks[i] = append([]int32{toks[i]}, ids[10+i:10+i+k]...)
		}
		flat := make([]float32, 0, B*(k+1)*V)
		run := map[string]func() error{
			"batched": func() error { _, err := s.m.ForwardBatchAllInto(ctx, caches, chunks, flat); return err },
			"alone": func() error {
				for i, c := range caches {
					if _, err := s.m.ForwardAllInto(ctx, c, chunks[i], flat); err != nil {
						return err
					}
				}
				return nil
			},
		}
		if k == 0 {
			run = map[string]func() error{"plain": func() error { _, err := s.m.ForwardBatchInto(ctx, caches, toks, flat); return err }}
		}
		for _, name := range []string{"plain", "batched", "alone"} {
			f, ok := run[name]
			if !ok {
				continue
			}
			b.Run(fmt.Sprintf("%s/k=%d", name, k), func(b *testing.B) {
				step := func() {
					if err := f(); err != nil {
						b.Fatal(err)
					}
					for _, c := range caches {
						c.Truncate(len(ids))
					}
				}
				step() // warm
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					step()
				}
				reportTokens(b, B*(k+1)*b.N, cpu0)
			})
		}
	}
}
