package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestTestmodelDirsLoadAndRun loads HF safetensors directories written by
// testmodel (llama, qwen2, qwen3 × f32, bf16, MLX 4-bit and 8-bit) through
// engine.Load (weights.Open underneath), checks the reported geometry and
// cache dtype, that logits are finite and informative, and that decoding
// after chunked prefill equals decoding after one-shot Forward.
func TestTestmodelDirsLoadAndRun(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	archs := map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM"}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe"} {
		for _, v := range []struct {
			dt        engine.DType
			bits, gs  int
			wantCache engine.DType
		}{
			{engine.F32, 0, 0, engine.F32},
			{engine.BF16, 0, 0, engine.BF16},
			{engine.BF16, 4, 64, engine.BF16},
			{engine.F32, 8, 32, engine.F32},
		} {
			name := fmt.Sprintf("%s-%v-q%d", arch, v.dt, v.bits)
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				spec := testmodel.Spec{Arch: arch, DType: v.dt, QuantBits: v.bits, GroupSize: v.gs, Seed: 3}
				if err := testmodel.Write(dir, spec); err != nil {
					t.Fatal(err)
				}
				var calls int
				m, err := engine.Load(ctx, dir, b, engine.LoadOptions{Progress: func(done, total int64) {
					calls++
					if done > total || total <= 0 {
						t.Errorf("progress %d/%d", done, total)
					}
				}})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				info := m.Info()
				norm, _ := spec.Normalized()
				if info.Arch != archs[arch] || info.Layers != norm.Layers || info.KVHeads != norm.KVHeads || info.HeadDim != norm.HeadDim || info.CacheDType != v.wantCache {
					t.Fatalf("info %+v for spec %+v", info, norm)
				}
				if calls == 0 {
					t.Fatal("no progress reported")
				}
				prompt := testmodel.ReferencePrompts()[1]
				c := m.NewCache()
				logits, err := m.Forward(ctx, c, prompt)
				if err != nil {
					t.Fatal(err)
				}
				for _, x := range logits {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatal("non-finite logits")
					}
				}
				if maxMinusMin(logits) < 0.1 {
					t.Fatalf("degenerate logits (spread %v)", maxMinusMin(logits))
				}
				want := greedyFrom(t, m, c, logits, 8)

				c2 := m.NewCache()
				if err := m.Prefill(ctx, c2, prompt[:len(prompt)-1], 3, nil); err != nil {
					t.Fatal(err)
				}
				lg, err := m.Forward(ctx, c2, prompt[len(prompt)-1:])
				if err != nil {
					t.Fatal(err)
				}
				if got := greedyFrom(t, m, c2, lg, 8); !slices.Equal(got, want) {
					t.Fatalf("chunked prefill decodes %v, one-shot %v", got, want)
				}
			})
		}
	}
}

func greedyFrom(t testing.TB, m *engine.Model, c engine.KVCache, logits []float32, n int) []int32 {
	t.Helper()
	var out []int32
	for range n {
		tok := int32(argmax(logits))
		out = append(out, tok)
		var err error
		if logits, err = m.Forward(context.Background(), c, []int32{tok}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestMoEChunkedPrefillBitIdentical: routing is per token, so a MoE model's
// KV must not depend on how the prompt is chunked (remote prefill equals
// local prefill only if it does).
func TestMoEChunkedPrefillBitIdentical(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompt := testmodel.ReferencePrompts()[4]
	for _, spec := range []testmodel.Spec{
		{Arch: "qwen3moe", DType: engine.F32, Seed: 5, Layers: 3},
		{Arch: "qwen3moe", DType: engine.BF16, QuantBits: 4, GroupSize: 64, Seed: 5, Layers: 3},
		{Arch: "qwen2moe", DType: engine.F32, Seed: 5},
	} {
		m := writeAndLoad(t, b, spec)
		one := m.NewCache()
		if err := m.Prefill(ctx, one, prompt, 0, nil); err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []int{1, 3, 16} {
			c := m.NewCache()
			if err := m.Prefill(ctx, c, prompt, chunk, nil); err != nil {
				t.Fatal(err)
			}
			for l := range m.Info().Layers {
				k1, v1, _ := one.Export(l, 0, len(prompt))
				k2, v2, _ := c.Export(l, 0, len(prompt))
				if string(k1) != string(k2) || string(v1) != string(v2) {
					t.Fatalf("%v q%d: layer %d KV differs between chunks of %d and one-shot prefill", spec.DType, spec.QuantBits, l, chunk)
				}
			}
		}
		m.Close()
	}
}

// TestForwardBatchEqualsForward: a batched decode step gives, bit for bit,
// the logits and KV of separate Forward calls, for sequences of different
// lengths, dense, quantized and MoE.
func TestForwardBatchEqualsForward(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompts := testmodel.ReferencePrompts()[1:4]
	for _, spec := range []testmodel.Spec{
		{Arch: "llama", DType: engine.F32, Seed: 2},
		{Arch: "qwen3", DType: engine.BF16, QuantBits: 4, GroupSize: 64, Seed: 2},
		{Arch: "qwen3moe", DType: engine.F32, Seed: 2, Layers: 3},
	} {
		t.Run(spec.Arch, func(t *testing.T) {
			m := writeAndLoad(t, b, spec)
			batch := batchEqualsAlone(t, m, prompts, 6)
			// Bad calls change nothing.
			lens := []int{batch[0].Len(), batch[1].Len()}
			for _, bad := range []struct {
				caches []engine.KVCache
				toks   []int32
			}{
				{[]engine.KVCache{batch[0], batch[0]}, []int32{1, 2}},
				{[]engine.KVCache{batch[0], batch[1]}, []int32{1}},
				{[]engine.KVCache{batch[0], batch[1]}, []int32{1, 1 << 20}},
				{nil, nil},
			} {
				if _, err := m.ForwardBatch(ctx, bad.caches, bad.toks); err == nil {
					t.Errorf("ForwardBatch(%d caches, %v) succeeded", len(bad.caches), bad.toks)
				}
			}
			if batch[0].Len() != lens[0] || batch[1].Len() != lens[1] {
				t.Errorf("a refused batch changed the caches: %d %d, were %v", batch[0].Len(), batch[1].Len(), lens)
			}
		})
	}
}

// TestMistralIsLlamaWithinItsWindow: MistralForCausalLM computes what
// LlamaForCausalLM does, and a sliding_window below the context caps the
// context at the window (where full attention equals sliding attention).
func TestMistralIsLlamaWithinItsWindow(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	llama := writeAndLoad(t, b, testmodel.Spec{Arch: "llama", Seed: 6})
	prompt := testmodel.ReferencePrompts()[2]
	want, err := llama.Forward(ctx, llama.NewCache(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		window any
		maxPos int
	}{{64, testmodel.DefaultMaxPositions}, {nil, testmodel.DefaultMaxPositions}, {4096, testmodel.DefaultMaxPositions}} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 6}); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["architectures"], cfg["model_type"], cfg["sliding_window"] = []string{"MistralForCausalLM"}, "mistral", c.window
		raw, _ = json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := engine.Load(ctx, dir, b, engine.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The window slides (sliding.go): the context is not capped at it.
		if got := m.Info().MaxPositions; got != c.maxPos {
			t.Errorf("sliding_window %v: context %d, want %d", c.window, got, c.maxPos)
		}
		got, err := m.Forward(ctx, m.NewCache(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("sliding_window %v: logits differ from the Llama model's", c.window)
		}
		// The window pattern is part of the KV fingerprint: a sliding
		// model's prefill keeps and sends only its windows.
		if same := m.Fingerprint() == llama.Fingerprint(); same != (c.window == nil) {
			t.Errorf("sliding_window %v: KV fingerprint equal to the Llama model's: %v", c.window, same)
		}
		m.Close()
	}
}

// writeAndLoad writes spec's model to a temporary directory and loads it on
// b; the model is closed when the test ends.
func writeAndLoad(t *testing.T, b engine.Backend, spec testmodel.Spec) *engine.Model {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestPrefillLetsOthersStepBetweenChunks: the model is locked per prefill
// chunk, so another sequence can decode (here: from onChunk itself, which
// would deadlock under a whole-prompt lock) and the prefill's KV is still
// the one-shot KV.
func TestPrefillLetsOthersStepBetweenChunks(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := writeAndLoad(t, b, testmodel.Spec{Arch: "qwen3", Seed: 3})
	prompt := testmodel.ReferencePrompts()[4]
	other := m.NewCache()
	if _, err := m.Forward(ctx, other, prompt[:5]); err != nil {
		t.Fatal(err)
	}
	chunked := m.NewCache()
	steps := 0
	done := make(chan error, 1)
	go func() {
		done <- m.Prefill(ctx, chunked, prompt, 8, func(start, n int) error {
			_, err := m.ForwardBatch(ctx, []engine.KVCache{other}, []int32{prompt[steps%len(prompt)]})
			steps++
			return err
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Prefill with a step in onChunk did not finish: the model stays locked between chunks")
	}
	if want := (len(prompt) + 7) / 8; steps != want || other.Len() != 5+want {
		t.Fatalf("%d steps between chunks (cache %d), want %d", steps, other.Len(), want)
	}
	one := m.NewCache()
	if err := m.Prefill(ctx, one, prompt, 0, nil); err != nil {
		t.Fatal(err)
	}
	for l := range m.Info().Layers {
		k1, v1, _ := one.Export(l, 0, len(prompt))
		k2, v2, _ := chunked.Export(l, 0, len(prompt))
		if string(k1) != string(k2) || string(v1) != string(v2) {
			t.Fatalf("layer %d: KV differs after interleaved steps", l)
		}
	}
}
