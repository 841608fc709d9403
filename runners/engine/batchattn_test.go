package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// batchAttnModels are the architectures a batched decode step must serve:
// every testmodel family (sliding windows and their ring caches in mistral,
// gemma3 and gptoss; sinks in gptoss; GQA everywhere; q/k norms in qwen3
// and gemma3; MoE) and the hybrid reference models (Gated DeltaNet layers
// beside attention, gated attention).
func batchAttnModels() []struct {
	name string
	dir  func(t *testing.T) string
} {
	return []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"llama", gen(testmodel.Spec{Arch: "llama", Seed: 4})},
		{"llama-bf16-q4", gen(testmodel.Spec{Arch: "llama", DType: engine.BF16, QuantBits: 4, GroupSize: 32, Seed: 4})},
		{"qwen2", gen(testmodel.Spec{Arch: "qwen2", Seed: 4})},
		{"qwen3", gen(testmodel.Spec{Arch: "qwen3", DType: engine.BF16, Seed: 4})},
		{"qwen3moe", gen(testmodel.Spec{Arch: "qwen3moe", Seed: 4, Layers: 3})},
		{"qwen2moe", gen(testmodel.Spec{Arch: "qwen2moe", Seed: 4})},
		{"mistral-sliding", gen(testmodel.Spec{Arch: "mistral", Seed: 4, SlidingWindow: 8})},
		{"gemma3", gen(testmodel.Spec{Arch: "gemma3", Seed: 4, Layers: 3})},
		{"gptoss", gen(testmodel.Spec{Arch: "gptoss", Seed: 4})},
		{"qwen3_next", ref("qwen3_next")},
		{"qwen3_5", ref("qwen3_5")},
	}
}

// TestBatchedDecodeEqualsAlone: a decode step of B = 1…5 sequences of
// different lengths (batched attention: Backend.RoPERows and
// BatchAttention) gives every sequence, bit for bit, the logits and the KV
// that its own steps give it, step after step, for every architecture
// (the cpu backend's batched attention loops over the rows exactly).
// Prompts of 5…21 tokens cross the sliding models' window of 8.
func TestBatchedDecodeEqualsAlone(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, mc := range batchAttnModels() {
		t.Run(mc.name, func(t *testing.T) {
			m, err := engine.Load(ctx, mc.dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			vocab := min(m.Info().Vocab, 500)
			for B := 1; B <= 5; B++ {
				t.Run(fmt.Sprintf("B=%d", B), func(t *testing.T) {
					prompts := make([][]int32, B)
					for i := range B {
						p := make([]int32, 5+4*i)
						for j := range p {
							p[j] = int32(10 + (7*j+13*i+3)%(vocab-10))
						}
						prompts[i] = p
					}
					batchEqualsAlone(t, m, prompts, 5)
				})
			}
		})
	}
}

// batchEqualsAlone prefills each prompt into two caches, then runs steps
// batched decode steps (ForwardBatch) on one set and the same tokens one
// sequence at a time (Forward) on the other, and fails unless the logits
// and the cached KV (the window each layer keeps; a recurrent layer holds
// none) are bit for bit the same. It returns the batched caches, freed when
// the test ends.
func batchEqualsAlone(t *testing.T, m *engine.Model, prompts [][]int32, steps int) []engine.KVCache {
	t.Helper()
	ctx := context.Background()
	alone, batch := make([]engine.KVCache, len(prompts)), make([]engine.KVCache, len(prompts))
	next := make([]int32, len(prompts))
	for i, p := range prompts {
		alone[i], batch[i] = m.NewCache(), m.NewCache()
		t.Cleanup(alone[i].Free)
		t.Cleanup(batch[i].Free)
		lg, err := m.Forward(ctx, alone[i], p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(ctx, batch[i], p); err != nil {
			t.Fatal(err)
		}
		next[i] = int32(argmax(lg))
	}
	for step := range steps {
		got, err := m.ForwardBatch(ctx, batch, next)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range alone {
			want, err := m.Forward(ctx, c, next[i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[i], want) {
				t.Fatalf("step %d sequence %d: batched logits differ from its own step's", step, i)
			}
			next[i] = int32(argmax(want))
		}
	}
	for i := range alone {
		if alone[i].Len() != batch[i].Len() {
			t.Fatalf("sequence %d: %d cached positions batched, %d alone", i, batch[i].Len(), alone[i].Len())
		}
		for l := range m.Info().Layers {
			n := alone[i].Len()
			start := engine.WindowStart(alone[i].Geometry().Window(l), n)
			k1, v1, err1 := alone[i].Export(l, start, n-start)
			k2, v2, err2 := batch[i].Export(l, start, n-start)
			if err1 != nil || err2 != nil {
				// A recurrent layer holds no positions.
				if (err1 == nil) != (err2 == nil) {
					t.Fatalf("sequence %d layer %d: export %v vs %v", i, l, err1, err2)
				}
				continue
			}
			if string(k1) != string(k2) || string(v1) != string(v2) {
				t.Fatalf("sequence %d layer %d: KV differs", i, l)
			}
		}
	}
	return batch
}

// gen and ref name a model directory made when a subtest asks for it:
// one testmodel writes, or one of testdata/reference's models.
func gen(spec testmodel.Spec) func(t *testing.T) string {
	return func(t *testing.T) string { return testmodel.Dir(t, spec) }
}

func ref(name string) func(*testing.T) string {
	return func(*testing.T) string { return filepath.Join("testdata", "reference", name) }
}

// countingBackend counts the batched attention ops the model calls.
type countingBackend struct {
	engine.Backend
	rows, batch int
}

func (c *countingBackend) RoPERows(x engine.Array, positions []int, r *engine.RoPE) engine.Array {
	c.rows++
	return c.Backend.RoPERows(x, positions, r)
}

func (c *countingBackend) BatchAttention(caches []engine.KVCache, layer int, q, k, v engine.Array, scale float32, window int, sinks engine.Array) engine.Array {
	c.batch++
	return c.Backend.BatchAttention(caches, layer, q, k, v, scale, window, sinks)
}

// TestBatchedDecodeUsesBatchAttention: a decode step of several sequences
// runs each attention layer's RoPE (q and k) and attention as one op each;
// prefill chunks, single sequences and verification rows (several rows a
// sequence) take the per-sequence loop.
func TestBatchedDecodeUsesBatchAttention(t *testing.T) {
	cb := &countingBackend{Backend: mustCPU(t)}
	ctx := context.Background()
	m := writeAndLoad(t, cb, testmodel.Spec{Arch: "llama", Seed: 4, Layers: 3})
	cs := []engine.KVCache{m.NewCache(), m.NewCache(), m.NewCache()}
	for i, c := range cs {
		if _, err := m.Forward(ctx, c, []int32{int32(20 + i), 30, 40}[:1+i]); err != nil {
			t.Fatal(err)
		}
	}
	if cb.rows != 0 || cb.batch != 0 {
		t.Fatalf("prefill called RoPERows %d and BatchAttention %d times", cb.rows, cb.batch)
	}
	if _, err := m.ForwardBatch(ctx, cs, []int32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if cb.rows != 2*3 || cb.batch != 3 {
		t.Fatalf("a decode step of 3 layers: RoPERows %d, BatchAttention %d times; want 6 and 3", cb.rows, cb.batch)
	}
	if _, err := m.ForwardBatchAllInto(ctx, cs[:2], [][]int32{{4, 5}, {6}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(ctx, cs[2], []int32{7}); err != nil {
		t.Fatal(err)
	}
	if cb.rows != 6 || cb.batch != 3 {
		t.Fatalf("verification rows and a single step called the batched ops (RoPERows %d, BatchAttention %d)", cb.rows, cb.batch)
	}
}

func mustCPU(t *testing.T) engine.Backend {
	t.Helper()
	b, err := backend.Open("cpu", backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
