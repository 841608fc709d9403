package decode

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// TestFP8WireAgainstBF16: the tiny Qwen3-Next model (attention + Gated
// DeltaNet layers, MoE) prefilled by a real producer over loopback TCP,
// once with the bf16 wire and once with FP8 (states stay float32).
// Attention KV bytes on the wire (transfer totals less the state bytes) are
// half of bf16's plus the per-head scales; over 2,000 positions (4 prompts
// of 600 wire tokens, 500 teacher-forced steps each) next-token logits have
// mean cosine ≥ 0.999 and top-1 agreement ≥ 99 %. A few positions fall to
// ~0.83: every one of them comes after a step where the FP8 run's router
// chose other experts than the bf16 run's (a near-tied top-k of this
// random-weight model flips under the KV perturbation; a different expert
// is a different function). The test records each step's routing in both
// runs (engine.LoadOptions.RouteObserver) and holds every position routed
// alike so far to cosine ≥ 0.999 and top-1 ≥ 99 %; see docs/BENCHMARKS.md
// "FP8 KV wire: per-position cosine". The dense tiny models are held to
// the per-position bound everywhere (TestFP8WireDenseTinyModels).
func TestFP8WireAgainstBF16(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("2,000 positions of numerics (not under -race or -short)")
	}
	rec := &routeRecorder{}
	m := loadReference(t, "qwen3_next", engine.LoadOptions{RouteObserver: rec.observe})
	fp8AgainstBF16(t, m, 4, 601, 500, false, rec)
}

// TestFP8WireDenseTinyModels: on dense tiny models (Llama; Qwen3 with q/k
// norms and head_dim ≠ hidden/heads) every one of 2,000 positions has next-token logits
// cosine ≥ 0.999 against the bf16 wire, and top-1 agreement is ≥ 99 %.
func TestFP8WireDenseTinyModels(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("2,000 positions of numerics (not under -race or -short)")
	}
	for _, arch := range []string{"llama", "qwen3"} {
		t.Run(arch, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), arch)
			if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 7, MaxPositions: 2048}); err != nil {
				t.Fatal(err)
			}
			m, err := engine.Load(context.Background(), dir, cpu.New(2), engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() }) // after fp8AgainstBF16's producer (servePrefill)
			fp8AgainstBF16(t, m, 4, 601, 500, true, nil)
		})
	}
}

// TestFP8WireAgainstBF16SmolLM2: the same on SmolLM2-135M (4 × 500
// positions after 257-token wire prompts). Minutes on 2 cores, so it runs
// only with EXO_FP8_SMOLLM2=1; every position's cosine is asserted ≥ 0.999.
// Measured 2026-12-03 (197 s; again 458 s on a busier machine, the same
// numbers): mean cosine 0.999995, min 0.999976, top-1 agreement 100 %,
// attention KV 0.5005 of bf16's bytes.
func TestFP8WireAgainstBF16SmolLM2(t *testing.T) {
	if os.Getenv("EXO_FP8_SMOLLM2") == "" {
		t.Skip("set EXO_FP8_SMOLLM2=1 (minutes on 2 cores)")
	}
	m, err := engine.Load(context.Background(), testenv.SmolLM2(t), cpu.New(2), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() }) // after fp8AgainstBF16's producer (servePrefill)
	fp8AgainstBF16(t, m, 4, 257, 500, true, nil)
}

// routeRecorder collects the experts each sparse layer chose during one
// Forward (engine.LoadOptions.RouteObserver).
type routeRecorder struct{ got [][]int32 }

func (r *routeRecorder) observe(layer int, experts [][]int32) {
	for _, e := range experts {
		s := append([]int32{int32(layer)}, e...)
		slices.Sort(s[1:])
		r.got = append(r.got, s)
	}
}

// take returns what was recorded since the last take.
func (r *routeRecorder) take() [][]int32 {
	g := r.got
	r.got = nil
	return g
}

// fp8AgainstBF16 compares the FP8 wire with the bf16 wire over
// prompts × steps positions: mean cosine ≥ 0.999 and top-1 ≥ 99 % always,
// and with perPosition every position's cosine ≥ 0.999. With rec (an MoE
// model loaded with rec.observe) each step's expert choices are compared
// between the two runs: every position whose routing has been identical
// in both since the prompt (this step and all earlier ones) must have
// cosine ≥ 0.999, and top-1 agreement over those positions must be
// ≥ 99 %; positions after a switch are counted and logged, not asserted
// (a different expert is a different function, not FP8 error).
func fp8AgainstBF16(t *testing.T, m *engine.Model, prompts, plen, steps int, perPosition bool, rec *routeRecorder) {
	ctx := context.Background()
	info := m.Info()
	attn := 0
	for l := range info.Layers {
		if info.Recurrent == nil || !info.Recurrent[l] {
			attn++
		}
	}
	const chunk = 64
	addr := servePrefill(t, m, chunk, nil)
	remote := func(dt kvwire.DType) *KVRemote {
		r := loopbackRemote(m, addr)
		r.WireDType = dt
		return r
	}
	r32, r16, r8 := remote(kvwire.DTypeF32), remote(kvwire.DTypeBF16), remote(kvwire.DTypeF8E4M3)
	// Context, not asserted: the same comparison of the bf16 wire against
	// the f32 wire (bf16's own loss).
	var baseMin, baseSum float64 = 1, 0

	var positions, agree int
	minCos, sumCos := 1.0, 0.0
	// With rec: positions routed alike so far, and those after a switch.
	var same, sameAgree, nSwitchedPrompts int
	sameMin := 1.0
	var sameLow, after []float64
	var low []float64
	for p := range prompts {
		prompt := make([]int32, plen)
		for i := range prompt {
			prompt[i] = int32(3 + (i*37+p*101+i*i*7)%min(500, info.Vocab-3))
		}
		c32, c16, c8 := m.NewCache(), m.NewCache(), m.NewCache()
		if _, err := r32.Prefill(ctx, "f", prompt, 0, c32, nil); err != nil {
			t.Fatal(err)
		}
		st16, err := r16.Prefill(ctx, "a", prompt, 0, c16, nil)
		if err != nil {
			t.Fatal(err)
		}
		st8, err := r8.Prefill(ctx, "b", prompt, 0, c8, nil)
		if err != nil {
			t.Fatal(err)
		}
		wire := plen - 1
		kv16 := int64(2 * attn * info.KVHeads * info.HeadDim * 2 * wire)
		states := st16.Bytes - kv16
		kv8 := st8.Bytes - states
		chunks := int64(attn * ((wire + chunk - 1) / chunk))
		if want := kv16/2 + 2*4*int64(info.KVHeads)*chunks; kv8 != want || states < 0 {
			t.Fatalf("prompt %d: fp8 KV %d bytes, want %d (bf16 KV %d, states %d)", p, kv8, want, kv16, states)
		}
		if p == 0 {
			t.Logf("wire totals: bf16 %d B, fp8 %d B; attention KV bf16 %d B, fp8 %d B (%.4f), states %d B each",
				st16.Bytes, st8.Bytes, kv16, kv8, float64(kv8)/float64(kv16), states)
		}
		last := prompt[plen-1]
		var g16, g8 []int32
		switched := false
		for s := range steps {
			if rec != nil {
				rec.take()
			}
			a, err := m.Forward(ctx, c16, []int32{last})
			if err != nil {
				t.Fatal(err)
			}
			var ra [][]int32
			if rec != nil {
				ra = rec.take()
			}
			b, err := m.Forward(ctx, c8, []int32{last})
			if err != nil {
				t.Fatal(err)
			}
			if rec != nil {
				rb := rec.take()
				if len(ra) == 0 || !slices.EqualFunc(ra, rb, slices.Equal) {
					if !switched {
						nSwitchedPrompts++
					}
					switched = true
				}
			}
			f, err := m.Forward(ctx, c32, []int32{last})
			if err != nil {
				t.Fatal(err)
			}
			bc := cosine(f, a)
			baseMin, baseSum = math.Min(baseMin, bc), baseSum+bc
			cs := cosine(a, b)
			minCos = math.Min(minCos, cs)
			sumCos += cs
			if cs < 0.999 {
				low = append(low, cs)
			}
			ta, tb := argmax(a), argmax(b)
			if ta == tb {
				agree++
			}
			positions++
			if rec != nil {
				if switched {
					after = append(after, cs)
				} else {
					same++
					if ta == tb {
						sameAgree++
					}
					sameMin = math.Min(sameMin, cs)
					if cs < 0.999 {
						sameLow = append(sameLow, cs)
					}
				}
			}
			if s < 24 {
				g16, g8 = append(g16, int32(ta)), append(g8, int32(tb))
			}
			last = int32(ta) // teacher-forced on the bf16 path's greedy token
		}
		diff := 0
		for i := range g16 {
			if g16[i] != g8[i] {
				diff++
			}
		}
		t.Logf("prompt %d greedy (first 24, teacher-forced): bf16 %v\n fp8 %v (%d differ)", p, g16, g8, diff)
	}
	frac := float64(agree) / float64(positions)
	mean := sumCos / float64(positions)
	t.Logf("baseline bf16 wire vs f32 wire: mean cosine %.6f, min %.6f", baseSum/float64(positions), baseMin)
	t.Logf("%d positions: mean cosine %.6f, min %.6f, %d below 0.999 %v; top-1 agreement %.4f", positions, mean, minCos, len(low), low, frac)
	if positions < 2000 || mean < 0.999 || frac < 0.99 {
		t.Fatalf("%d positions: mean cosine %.6f (want ≥ 0.999), top-1 agreement %.4f (want ≥ 0.99)", positions, mean, frac)
	}
	if rec != nil {
		afterLow := 0
		for _, c := range after {
			if c < 0.999 {
				afterLow++
			}
		}
		t.Logf("routing: %d positions routed alike in both runs so far (min cosine %.6f, %d below 0.999, top-1 %d/%d); "+
			"%d positions after an expert switch (%d of %d prompts switched), %d of them below 0.999",
			same, sameMin, len(sameLow), sameAgree, same, len(after), nSwitchedPrompts, prompts, afterLow)
		if same == 0 {
			t.Fatal("no position routed alike: the observer saw nothing")
		}
		if len(sameLow) > 0 || float64(sameAgree) < 0.99*float64(same) {
			t.Fatalf("positions routed alike: %d below cosine 0.999 %v, top-1 %d/%d (want none, ≥ 99 %%)", len(sameLow), sameLow, sameAgree, same)
		}
	}
	if perPosition && len(low) > 0 {
		t.Fatalf("%d of %d positions have cosine < 0.999 (min %.6f), want none", len(low), positions, minCos)
	}
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
