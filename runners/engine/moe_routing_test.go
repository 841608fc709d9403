package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// syncCounter wraps a Backend and counts its synchronizations: Eval calls
// and read-backs (Float32, Bytes).
type syncCounter struct {
	engine.Backend
	evals, reads int
}

func (c *syncCounter) Eval(a ...engine.Array) error { c.evals++; return c.Backend.Eval(a...) }
func (c *syncCounter) Float32(a engine.Array) ([]float32, error) {
	c.reads++
	return c.Backend.Float32(a)
}
func (c *syncCounter) Bytes(a engine.Array) ([]byte, error) { c.reads++; return c.Backend.Bytes(a) }

func loadSpec(t *testing.T, b engine.Backend, spec testmodel.Spec, opts engine.LoadOptions) *engine.Model {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestMoEDecodeStepIsOneEval: with routing inside the graph a MoE decode
// step (single and batched) synchronizes once, an Eval followed by the
// read of its logits, however many sparse layers: Qwen3-MoE and gpt-oss
// (biased, clamped experts; f32 and MXFP4). The host-routing baseline pays
// one more Eval and read per sparse layer (which shows the counter sees
// them).
func TestMoEDecodeStepIsOneEval(t *testing.T) {
	ctx := context.Background()
	for _, spec := range []testmodel.Spec{
		{Arch: "qwen3moe", DType: engine.F32, Seed: 2, Layers: 3, AllSparse: true},
		{Arch: "gptoss", DType: engine.F32, Seed: 2, Layers: 3},
		{Arch: "gptoss", DType: engine.BF16, Seed: 2, Layers: 3, MXFP4: true},
	} {
		for _, host := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s-%v-mxfp4=%v-host=%v", spec.Arch, spec.DType, spec.MXFP4, host), func(t *testing.T) {
				oneEvalPerStep(t, ctx, spec, host)
			})
		}
	}
}

func oneEvalPerStep(t *testing.T, ctx context.Context, spec testmodel.Spec, host bool) {
	prompt := testmodel.ReferencePrompts()[2]
	cb, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := &syncCounter{Backend: cb}
	m := loadSpec(t, b, spec, engine.LoadOptions{HostMoERouting: host})
	sparse := m.Info().Layers
	wantEvals, wantReads := 1, 1
	if host {
		wantEvals, wantReads = 1+sparse, 1+sparse
	}
	c, c2 := m.NewCache(), m.NewCache()
	lg, err := m.Forward(ctx, c, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(ctx, c2, prompt[:5]); err != nil {
		t.Fatal(err)
	}
	tok := int32(argmax(lg))
	for step := range 4 {
		b.evals, b.reads = 0, 0
		if lg, err = m.Forward(ctx, c, []int32{tok}); err != nil {
			t.Fatal(err)
		}
		if b.evals != wantEvals || b.reads != wantReads {
			t.Fatalf("step %d: %d evals and %d reads, want %d and %d", step, b.evals, b.reads, wantEvals, wantReads)
		}
		tok = int32(argmax(lg))
	}
	b.evals, b.reads = 0, 0
	if _, err := m.ForwardBatch(ctx, []engine.KVCache{c, c2}, []int32{tok, 7}); err != nil {
		t.Fatal(err)
	}
	if b.evals != wantEvals || b.reads != wantReads {
		t.Fatalf("batched step: %d evals and %d reads, want %d and %d", b.evals, b.reads, wantEvals, wantReads)
	}
}

// TestMoEInGraphMatchesHostRouting: routing inside the graph chooses the
// experts the host did and weighs them alike (up to float32 rounding of
// the weights): logits agree closely and greedy continuations are equal,
// for prompts short (unsorted pairs) and long (sorted by expert), f32 and
// 4-bit, with and without renormalized top-k probabilities.
func TestMoEInGraphMatchesHostRouting(t *testing.T) {
	ctx := context.Background()
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []testmodel.Spec{
		{Arch: "qwen3moe", DType: engine.F32, Seed: 4, Layers: 3},
		{Arch: "qwen3moe", DType: engine.F32, Seed: 4, Layers: 3, RawTopKProb: true},
		{Arch: "qwen3moe", DType: engine.BF16, QuantBits: 4, GroupSize: 64, Seed: 4, Layers: 3, ExpertsPerToken: 3},
		{Arch: "gptoss", DType: engine.F32, Seed: 4, Layers: 3},
		{Arch: "gptoss", DType: engine.BF16, Seed: 4, Layers: 3, MXFP4: true},
	} {
		t.Run(fmt.Sprintf("%s-%v-q%d-k%d-raw%v-mxfp4%v", spec.Arch, spec.DType, spec.QuantBits, spec.ExpertsPerToken, spec.RawTopKProb, spec.MXFP4), func(t *testing.T) {
			graph := loadSpec(t, b, spec, engine.LoadOptions{})
			host := loadSpec(t, b, spec, engine.LoadOptions{HostMoERouting: true})
			for i, p := range testmodel.ReferencePrompts() {
				cg, ch := graph.NewCache(), host.NewCache()
				lg, err := graph.Forward(ctx, cg, p)
				if err != nil {
					t.Fatal(err)
				}
				lh, err := host.Forward(ctx, ch, p)
				if err != nil {
					t.Fatal(err)
				}
				if cs := fixture.Cosine(lg, lh); cs < 0.99999 {
					t.Errorf("prompt %d: cosine %.7f between in-graph and host routing", i, cs)
				}
				if g, h := greedyFrom(t, graph, cg, lg, 8), greedyFrom(t, host, ch, lh, 8); !slices.Equal(g, h) {
					t.Errorf("prompt %d: in-graph continues %v, host %v", i, g, h)
				}
			}
		})
	}
}
