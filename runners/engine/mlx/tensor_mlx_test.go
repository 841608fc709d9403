//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// envTPModels tells a rank of checkTensorRing what to load (tpSpec, JSON).
const envTPModels = "EXO_MLX_TP_MODELS"

// tpCases are the tiny models split over the ring: dense f32, 4-bit
// (quantized_matmul on each rank's rows and whole input groups) and MoE
// (experts split along their intermediate width).
func tpCases() map[string]testmodel.Spec {
	base := testmodel.Spec{Arch: "llama", Layers: 3, Hidden: 128, Heads: 8, KVHeads: 4, HeadDim: 16, Intermediate: 256, Seed: 7}
	q4 := base
	q4.QuantBits, q4.GroupSize = 4, 32
	moe := base
	moe.Arch, moe.MoEIntermediate = "qwen3moe", 128
	return map[string]testmodel.Spec{"llama": base, "llama_q4": q4, "qwen3moe": moe}
}

// tpRun is what one model gives: the prompt's logits at every position,
// then a greedy decode's tokens and logits.
type tpRun struct {
	Prompt [][]float32
	Tokens []int32
	Steps  [][]float32
}

const tpSteps = 8

// runTP runs the prompt and a greedy decode of tpSteps tokens on m; with
// last, only the prompt's last position's logits are kept (a large
// vocabulary).
func runTP(t *testing.T, m *engine.Model, last bool) tpRun {
	t.Helper()
	ctx := context.Background()
	c := m.NewCache()
	defer c.Free()
	prompt := make([]int32, 23)
	for i := range prompt {
		prompt[i] = int32((i*37 + 11) % (m.Info().Vocab - 8))
	}
	var r tpRun
	if last {
		l, err := m.Forward(ctx, c, prompt)
		if err != nil {
			t.Fatal(err)
		}
		r.Prompt = [][]float32{slices.Clone(l)}
	} else {
		rows, err := m.ForwardAllInto(ctx, c, prompt, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			r.Prompt = append(r.Prompt, slices.Clone(row))
		}
	}
	var err error
	l := r.Prompt[len(r.Prompt)-1]
	for range tpSteps {
		tok := argmax(l)
		r.Tokens = append(r.Tokens, tok)
		if l, err = m.Forward(ctx, c, []int32{tok}); err != nil {
			t.Fatal(err)
		}
		r.Steps = append(r.Steps, slices.Clone(l))
	}
	return r
}

// maxAbsDiff is the largest elementwise difference of matching rows.
func maxAbsDiff(got, want [][]float32) float64 {
	d := 0.0
	for i := range min(len(got), len(want)) {
		for j := range min(len(got[i]), len(want[i])) {
			d = max(d, math.Abs(float64(got[i][j])-float64(want[i][j])))
		}
	}
	return d
}

func leastCosine(t *testing.T, got, want [][]float32) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	worst := 1.0
	for i := range got {
		worst = min(worst, fixture.Cosine(got[i], want[i]))
	}
	return worst
}

// The engine's tensor-parallel split over two real processes on MLX's ring
// backend (over 127.0.0.1, MLX's CPU device when EXO_MLX_TEST_DEVICE=cpu
// or no GPU): every rank's logits equal the unsharded model's on MLX
// (cosine ≥ 0.999 at every prompt position and decode step) and both
// ranks decode the same greedy tokens as the whole model.
func TestTensorParallelRing(t *testing.T) {
	if rankOut() != "" {
		t.Skip("not a rank test")
	}
	root := t.TempDir()
	models := map[string]string{}
	for name, spec := range tpCases() {
		models[name] = filepath.Join(root, name)
		if err := testmodel.Write(models[name], spec); err != nil {
			t.Fatal(err)
		}
	}
	checkTensorRing(t, 2, models, false)
}

// SmolLM2-135M's Q4_1 GGUF (9 heads over 3 KV heads: 3 ranks) split over
// three processes on the ring backend gives the whole model's logits.
func TestTensorParallelRingSmolLM2(t *testing.T) {
	if rankOut() != "" {
		t.Skip("not a rank test")
	}
	path := testenv.SmolLM2(t)
	checkTensorRing(t, 3, map[string]string{"smollm2": path}, true)
}

// checkTensorRing runs models (name → path) whole on this process's MLX
// backend and split over n ranks on the ring, and compares them.
func checkTensorRing(t *testing.T, n int, models map[string]string, last bool) {
	b := newTestBackend(t)
	want := map[string]tpRun{}
	for name, path := range models {
		want[name] = runTP(t, load(t, path, b), last)
	}
	spec, err := json.Marshal(tpSpec{Models: models, Last: last})
	if err != nil {
		t.Fatal(err)
	}
	outs := runRanks(t, n, "TestTensorParallelRingRank", envTPModels+"="+string(spec))
	var ranks []map[string]tpRun
	for r, raw := range outs {
		var got map[string]tpRun
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("rank %d results: %v", r, err)
		}
		ranks = append(ranks, got)
	}
	for name, w := range want {
		for r, got := range ranks {
			g, ok := got[name]
			if !ok {
				t.Errorf("%s: rank %d reported nothing", name, r)
				continue
			}
			cp, cs := leastCosine(t, g.Prompt, w.Prompt), leastCosine(t, g.Steps, w.Steps)
			if cp < 0.999 || cs < 0.999 {
				t.Errorf("%s rank %d: least cosine against the whole model %.7f (prompt), %.7f (decode), want ≥ 0.999", name, r, cp, cs)
			}
			if !slices.Equal(g.Tokens, w.Tokens) {
				t.Errorf("%s rank %d: greedy tokens %v, whole model %v", name, r, g.Tokens, w.Tokens)
			}
			t.Logf("%s rank %d of %d: least cosine %.7f (prompt), %.7f (decode), largest |Δ| %.3g; tokens %v", name, r, n, cp, cs,
				max(maxAbsDiff(g.Prompt, w.Prompt), maxAbsDiff(g.Steps, w.Steps)), g.Tokens)
		}
		for r := 1; r < len(ranks); r++ {
			for i := range ranks[0][name].Steps {
				if !slices.Equal(ranks[r][name].Steps[i], ranks[0][name].Steps[i]) {
					t.Errorf("%s: ranks 0 and %d differ at decode step %d", name, r, i)
					break
				}
			}
		}
	}
}

// tpSpec tells each rank what to load (name → path) and whether to keep
// only the prompt's last logits.
type tpSpec struct {
	Models map[string]string
	Last   bool
}

// TestTensorParallelRingRank is one rank of checkTensorRing.
func TestTensorParallelRingRank(t *testing.T) {
	raw := os.Getenv(envTPModels)
	if rankOut() == "" || raw == "" {
		t.Skip("a rank of TestTensorParallelRing; runs only in the processes it starts")
	}
	var spec tpSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("%s: %v", envTPModels, err)
	}
	b := newTestBackend(t)
	c, err := JoinGroup(b, GroupOptions{Backend: "ring", Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(spec.Models)) // every rank runs them in one order
	res := map[string]tpRun{}
	for _, name := range names {
		m, err := engine.Load(context.Background(), spec.Models[name], b, engine.LoadOptions{Tensor: c})
		if err != nil {
			t.Fatalf("%s on rank %d: %v", name, c.Rank(), err)
		}
		n := c.Size()
		if s, e := m.KVHeadRange(); e-s != m.Info().KVHeads/n || s != c.Rank()*(e-s) {
			t.Errorf("%s: rank %d of %d holds KV heads [%d, %d) of %d", name, c.Rank(), n, s, e, m.Info().KVHeads)
		}
		res[name] = runTP(t, m, spec.Last)
		m.Close()
	}
	writeRankOut(t, res)
}
