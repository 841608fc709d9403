package decode

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// codeFile is a ~100-line Python file whose answer to "rename one name"
// repeats most of it.
func codeFile() string {
	var b strings.Builder
	b.WriteString("import math\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass Item:\n    name: str\n    price: float\n    quantity: int\n\n\n")
	for i, f := range []string{"apples", "pears", "plums", "grapes", "lemons", "cherries", "peaches", "melons"} {
		fmt.Fprintf(&b, "def total_%s(items):\n", f)
		fmt.Fprintf(&b, "    \"\"\"Return the total price of the %s in items.\"\"\"\n", f)
		b.WriteString("    total = 0.0\n")
		b.WriteString("    for item in items:\n")
		fmt.Fprintf(&b, "        if item.name == %q:\n", f)
		fmt.Fprintf(&b, "            total += compute_price(item) * %d\n", i+1)
		b.WriteString("    return round(total, 2)\n\n\n")
	}
	b.WriteString("def compute_price(item):\n    \"\"\"Price of one line: price times quantity, never negative.\"\"\"\n")
	b.WriteString("    return max(0.0, item.price * item.quantity)\n\n\n")
	b.WriteString("def main():\n    items = [Item(\"apples\", 0.5, 10), Item(\"pears\", 0.75, 4), Item(\"plums\", 1.25, 2)]\n")
	b.WriteString("    print(total_apples(items), total_pears(items), total_plums(items))\n")
	b.WriteString("    print(math.fsum(compute_price(i) for i in items))\n\n\n")
	b.WriteString("if __name__ == \"__main__\":\n    main()\n")
	return b.String()
}

// stepTime is a count-based estimate of the decode time of the steps a
// batcher ran between two steps() snapshots, in units of a one-position
// step: a step of P positions at ref's time for P relative to 1 position,
// chained size by size from ref's line (its cost of one more position
// there, measured between consecutive steps: see batchCost), so that the
// machine's load while each mode ran, and while each size was measured,
// does not enter a comparison of two modes weighed by the same ref.
func stepTime(before, after []int, ref *batchCost) float64 {
	t, rel := 0.0, 1.0
	for P := 1; P < len(after); P++ {
		if P > 1 {
			if t0, slope, ok := ref.line(P-1, 1); ok {
				rel *= 1 + slope/t0
			}
		}
		n := after[P]
		if P < len(before) {
			n -= before[P]
		}
		t += float64(n) * rel
	}
	return t
}

// benchBackend is the speculation benchmarks' backend: the cpu backend on
// one thread, or with EXO_BENCH_BACKEND=mlx (and EXO_MLXC_PATH) MLX's CPU
// device.
func benchBackend(b *testing.B) engine.Backend {
	be, err := backend.Open(cmp.Or(os.Getenv("EXO_BENCH_BACKEND"), "cpu"), backend.Options{Threads: 1, Device: "cpu"})
	if err != nil {
		b.Fatal(err)
	}
	return be
}

// chatPrompts are open chat requests: the answers rarely repeat their
// context.
var chatPrompts = []string{"Write a short story about a lighthouse keeper who finds a message in a bottle.",
	"Explain how a bicycle stays upright, for a ten-year-old.", "Describe a busy market in a small coastal town.",
	"Write a letter from a cat to its owner about the new dog."}

// processCPU is the CPU time the process has used (every thread: MLX's
// included), which a loaded machine moves less than the clock.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchModel loads SmolLM2's GGUF at path onto be for the speculation
// benchmarks: as it is (Q4_1), or with EXO_BENCH_DENSE=f32 or bf16 its
// weights dequantized to that dtype at load (testmodel.Dense: the same
// numbers, a dense model's matrix products — on MLX's CPU device its BLAS
// sgemv and sgemm instead of scalar Q4 kernels, so that a decode step is
// bound by reading the weights as on a Mac's GPU rather than by
// arithmetic) with a KV cache of that dtype.
func benchModel(b *testing.B, path string, be engine.Backend) *engine.Model {
	var dt engine.DType
	switch d := os.Getenv("EXO_BENCH_DENSE"); d {
	case "":
		m, err := engine.Load(context.Background(), path, be, engine.LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		return m
	case "f32":
		dt = engine.F32
	case "bf16":
		dt = engine.BF16
	default:
		b.Fatalf("EXO_BENCH_DENSE=%q: want f32 or bf16 (or unset: the GGUF's Q4_1)", d)
	}
	src, err := weights.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ds, err := testmodel.Dense(src, dt)
	if err != nil {
		b.Fatal(err)
	}
	m, err := engine.LoadSource(context.Background(), ds, be, engine.LoadOptions{CacheDType: dt})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkSpeculativeSmolLM2: SmolLM2 greedy decode tok/s through a
// decode Server (benchBackend's backend, benchModel's weights), without
// and with prompt-lookup speculation, interleaved in one run, for a code
// edit (a ~100-line file and an instruction to rename one function: the
// answer repeats most of the file) and an open chat prompt. On a backend
// whose plain steps are overlapped (MLX), where a speculating generation's
// steps are serial, a third server without speculation runs every step
// serially (off-serial): the cost of speculation beside the cost of
// leaving the overlapped path. It fails unless every mode produces the
// same text. Reported: each mode's decode tok/s (after the first token),
// speedup (prompt lookup over off) and, with off-serial, spec-vs-serial;
// the share of drafted tokens accepted and the drafted tokens per answer;
// position-cost, what one more position costs a lone step in a plain
// step's units, as the speculating server measured it (the runner logs the
// same number as position_cost); and est-speedup: the ratio of the plain
// mode's decode steps (off's, or off-serial's where off's are overlapped
// and untimed) to the speculating mode's, each weighed at its size's time
// relative to one position (stepTime), which the machine's load moves far
// less than the clock.
func BenchmarkSpeculativeSmolLM2(b *testing.B) {
	path := testenv.SmolLM2(b)
	be := benchBackend(b)
	m := benchModel(b, path, be)
	defer m.Close()
	const offSerial = "off-serial"
	modes := []string{SpecOff, SpecPromptLookup}
	servers := map[string]*Server{}
	newServer := func(mode string) *Server {
		st, err := NewSetup("m", m, path, gen.Defaults{})
		if err != nil {
			b.Fatal(err)
		}
		o := st.Options
		o.CacheEntries = -1
		if mode == offSerial {
			o.overlap = func(Model) bool { return false }
		} else {
			o.Speculative = mode
		}
		s := New(o)
		b.Cleanup(func() { s.Close() })
		servers[mode] = s
		return s
	}
	for _, mode := range modes {
		newServer(mode)
	}
	if servers[SpecOff].overlap {
		modes = append(modes, offSerial)
		newServer(offSerial)
	}
	plain := SpecOff // the mode whose steps est-speedup counts
	if servers[SpecOff].overlap {
		plain = offSerial
	}
	spec := &servers[SpecPromptLookup].batch.cost
	for _, w := range []struct {
		name    string
		prompts []string // iteration i asks prompts[i % len]
		tokens  int
	}{
		{"code-edit", []string{"Rename the function compute_price to line_price everywhere in this file. Reply with the whole file and nothing else.\n\n```python\n" + codeFile() + "```"}, 400},
		{"chat", chatPrompts, 200},
	} {
		b.Run(w.name, func(b *testing.B) {
			rate, est, cpu := map[string]float64{}, map[string]float64{}, map[string]float64{}
			var accepted, verified int
			for i := 0; b.Loop(); i++ {
				var texts []string
				for _, mode := range modes {
					s := servers[mode]
					before := s.batch.cost.steps()
					var em textEmitter
					req := &gen.Request{Chat: true, AddGenerationPrompt: true, MaxTokens: w.tokens, IgnoreEOS: true,
						Messages: []gen.Message{{Role: "user", Content: w.prompts[i%len(w.prompts)]}}}
					c0 := processCPU(b)
					if _, err := s.Generate(context.Background(), req, &em); err != nil {
						b.Fatal(err)
					}
					cpu[mode] += (processCPU(b) - c0).Seconds() / float64(w.tokens)
					j := s.journal.since(0)
					r := j[len(j)-1]
					rate[mode] += r.TokensPerSecond
					est[mode] += stepTime(before, s.batch.cost.steps(), spec)
					accepted, verified = accepted+r.SpecAccepted, verified+r.SpecAccepted+r.SpecRejected
					texts = append(texts, em.String())
				}
				for i, t := range texts[1:] {
					if t != texts[0] {
						b.Fatalf("%s text differs from off's:\n%q\n%q", modes[i+1], t, texts[0])
					}
				}
			}
			b.ReportMetric(rate[SpecOff]/float64(b.N), "off-tok/s")
			b.ReportMetric(rate[SpecPromptLookup]/float64(b.N), "spec-tok/s")
			b.ReportMetric(rate[SpecPromptLookup]/rate[SpecOff], "speedup")
			if r, ok := rate[offSerial]; ok {
				b.ReportMetric(r/float64(b.N), "serial-tok/s")
				b.ReportMetric(rate[SpecPromptLookup]/r, "spec-vs-serial")
			}
			if est[SpecPromptLookup] > 0 {
				b.ReportMetric(est[plain]/est[SpecPromptLookup], "est-speedup")
			}
			if t0, slope, ok := spec.line(1, 1); ok {
				b.ReportMetric(slope/t0, "position-cost")
			}
			if verified > 0 {
				b.ReportMetric(float64(accepted)/float64(verified), "acceptance")
				b.ReportMetric(float64(verified)/float64(b.N), "drafted/answer")
			}
			for _, mode := range modes {
				b.ReportMetric(1000*cpu[mode]/float64(b.N), map[string]string{SpecOff: "off", SpecPromptLookup: "spec", offSerial: "serial"}[mode]+"-cpu-ms/tok")
			}
		})
	}
}

// BenchmarkSpeculativeBatchSmolLM2: four concurrent greedy requests to one
// decode Server (MaxBatch 4) on SmolLM2, cpu backend, one thread, three
// ways in one run, interleaved round by round: speculation off,
// prompt lookup in the batcher (every member's verification in the
// batch's one forward), and prompt lookup as the per-request loop ran it
// before (specSolo: each verification a forward of its own, aside from the
// batch). Workloads: four code edits (the ~100-line file, each request
// renaming a different name: the answers repeat most of the file) and four
// open chat prompts. Each server answers each workload once untimed first
// (its prefix cache then holds the prompts, so a round times decoding).
// Reported: aggregate decode tok/s of a round (every request's tokens after
// its first, over the time from the first request's first token to the
// last one's end), each mode's ratio to off and its drafted tokens' share
// accepted, and batched-est-speedup (off's steps over the batched mode's,
// each weighed at the median time of steps of its size: stepTime). It fails
// unless every mode gives every request the same text.
func BenchmarkSpeculativeBatchSmolLM2(b *testing.B) {
	path := testenv.SmolLM2(b)
	be := benchBackend(b)
	m := benchModel(b, path, be)
	defer m.Close()
	modes := []string{"off", "batched", "solo"}
	servers := map[string]*Server{}
	for _, mode := range modes {
		st, err := NewSetup("m", m, path, gen.Defaults{})
		if err != nil {
			b.Fatal(err)
		}
		o := st.Options
		o.MaxBatch, o.CacheEntries = 4, 8
		if mode != "off" {
			o.Speculative, o.specSolo = SpecPromptLookup, mode == "solo"
		}
		s := New(o)
		defer s.Close()
		servers[mode] = s
	}
	edit := func(from, to string) string {
		return "Rename " + from + " to " + to + " everywhere in this file. Reply with the whole file and nothing else.\n\n```python\n" + codeFile() + "```"
	}
	for _, w := range []struct {
		name    string
		prompts []string
		tokens  int
	}{
		{"code-edit", []string{edit("the function compute_price", "line_price"), edit("the class Item", "LineItem"),
			edit("the function main", "run"), edit("the function total_apples", "sum_apples")}, 200},
		{"chat", chatPrompts, 200},
	} {
		b.Run(w.name, func(b *testing.B) {
			round := func(s *Server) (texts []string, rate float64, accepted, verified int, steps [2][]int) {
				steps[0] = s.batch.cost.steps()
				s.journal.mu.Lock()
				seq := s.journal.seq
				s.journal.mu.Unlock()
				texts = make([]string, len(w.prompts))
				var wg sync.WaitGroup
				for i, p := range w.prompts {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var em textEmitter
						req := &gen.Request{Chat: true, AddGenerationPrompt: true, MaxTokens: w.tokens, IgnoreEOS: true,
							Messages: []gen.Message{{Role: "user", Content: p}}}
						if _, err := s.Generate(context.Background(), req, &em); err != nil {
							b.Error(err)
						}
						texts[i] = em.String()
					}()
				}
				wg.Wait()
				var first, end time.Time
				tokens := 0
				for _, r := range s.journal.since(seq) {
					f := r.Start.Add(time.Duration(r.TTFT * float64(time.Second)))
					e := r.Start.Add(time.Duration(r.Duration * float64(time.Second)))
					if first.IsZero() || f.Before(first) {
						first = f
					}
					if e.After(end) {
						end = e
					}
					tokens += r.CompletionTokens - 1
					accepted, verified = accepted+r.SpecAccepted, verified+r.SpecAccepted+r.SpecRejected
				}
				steps[1] = s.batch.cost.steps()
				return texts, float64(tokens) / end.Sub(first).Seconds(), accepted, verified, steps
			}
			for _, mode := range modes {
				round(servers[mode]) // the prompts into the prefix cache
			}
			rate, est := map[string]float64{}, map[string]float64{}
			accepted, verified := map[string]int{}, map[string]int{}
			for b.Loop() {
				var want []string
				for _, mode := range modes {
					texts, r, a, v, steps := round(servers[mode])
					est[mode] += stepTime(steps[0], steps[1], &servers["batched"].batch.cost)
					if want == nil {
						want = texts
					} else if !slices.Equal(texts, want) {
						b.Fatalf("%s: texts differ from speculation off's", mode)
					}
					rate[mode] += r
					accepted[mode] += a
					verified[mode] += v
				}
			}
			for _, mode := range modes {
				b.ReportMetric(rate[mode]/float64(b.N), mode+"-tok/s")
				if mode != "off" {
					b.ReportMetric(rate[mode]/rate["off"], mode+"-speedup")
					if mode == "batched" {
						b.ReportMetric(est["off"]/est[mode], mode+"-est-speedup")
					}
					if verified[mode] > 0 {
						b.ReportMetric(float64(accepted[mode])/float64(verified[mode]), mode+"-acceptance")
					}
				}
			}
		})
	}
}
