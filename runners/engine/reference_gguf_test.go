package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// ggufLlamaFixture is what scripts/reference/gguf_llamacpp.py records: per
// GGUF file (f32, llama.cpp's quantizations of it, MXFP4 experts) and
// prompt, llama.cpp's last-position logits and 32-token greedy
// continuation, on the file and, for a quantized one, on its weights
// dequantized to f32.
type ggufLlamaFixture struct {
	Files []struct {
		Type    string         `json:"type"`
		File    string         `json:"file"`
		Prompts []ggufLlamaRun `json:"prompts"`
		// For a quantized file: llama.cpp on the same weights
		// dequantized to f32 (no 8-bit rounding of activations).
		Dequantized []ggufLlamaRun `json:"dequantized_prompts"`
	} `json:"files"`
}

type ggufLlamaRun struct {
	Tokens []int32 `json:"tokens"`
	Logits string  `json:"logits_f32_b64"`
	Greedy []int32 `json:"greedy"`
}

// ggufTolerance: f32 files must agree closely with llama.cpp (which runs
// them with an F32 KV cache) and give the same greedy text. Quantized files
// are held to the same bounds against llama.cpp on their dequantized
// weights; against llama.cpp on the file itself only loosely, since
// llama.cpp rounds activations to 8 bits inside quantized matmuls (lowest
// measured: 0.9984, Qwen3.5 Q4_0), and their greedy continuations are
// compared teacher-forced (teacherForced).
var ggufTolerance = map[string]float64{"f32": 0.99999, "q8_0": 0.997, "q4_0": 0.997, "mxfp4": 0.997}

// ggufSlack is how far below the engine's top logit llama.cpp's greedy
// token may be on a quantized file (the tiny models' logits span about ±6;
// gaps up to 0.12 were measured on Q8_0, where llama.cpp's rounding of
// activations is the larger part of the difference: the engine's Q8_0
// logits are closer to llama.cpp's f32 ones than llama.cpp's Q8_0 are).
const ggufSlack = 0.25

// ggufForcedSteps is how many teacher-forced steps are held to ggufSlack
// (an engine computing with llama.cpp-style 8-bit activations was seen
// 0.68 off at step 13 on the Qwen3.5-MoE Q4_0 fixture, a routing flip).
const ggufForcedSteps = 8

// checkGGUFAgainstLlamaCpp loads every file of testdata/reference/gguf/
// <arch>_llamacpp.json on the cpu backend and compares it with llama.cpp:
// last-position logits by cosine, after a one-shot prefill and after a
// chunked one whose chunks (5 tokens) cross the window boundaries, and the
// greedy continuation (which decodes several windows further). A
// quantized file is held to the f32 bounds against llama.cpp on its
// dequantized weights, and to looser ones against llama.cpp on the file.
func checkGGUFAgainstLlamaCpp(t *testing.T, arch, wantArch string, wantWindows []int) {
	dir := filepath.Join("testdata", "reference", "gguf")
	raw, err := os.ReadFile(filepath.Join(dir, arch+"_llamacpp.json"))
	if err != nil {
		t.Fatalf("fixture missing (run scripts/reference/gguf_llamacpp.py %s): %v", arch, err)
	}
	var fx ggufLlamaFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Files) == 0 {
		t.Fatal("no files in the fixture")
	}
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, f := range fx.Files {
		t.Run(f.Type, func(t *testing.T) {
			tol, ok := ggufTolerance[f.Type]
			if !ok {
				t.Fatalf("no tolerance for %s", f.Type)
			}
			m, err := engine.Load(ctx, filepath.Join(dir, f.File), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			info := m.Info()
			if info.Arch != wantArch || !slices.Equal(info.Windows, wantWindows) {
				t.Fatalf("arch %s windows %v, want %s %v", info.Arch, info.Windows, wantArch, wantWindows)
			}
			span := 5 // the chunk size below
			if len(wantWindows) > 0 {
				span = max(span, slices.Max(wantWindows))
			}
			if len(f.Prompts) < 3 || len(f.Prompts[len(f.Prompts)-1].Tokens) < 4*span {
				t.Fatal("fixture prompts are not several windows (chunks) long")
			}
			for i, p := range f.Prompts {
				want := fixture.F32FromBase64(t, p.Logits)
				for _, chunk := range []int{0, 5} {
					c := m.NewCache()
					if chunk > 0 {
						if err := m.Prefill(ctx, c, p.Tokens[:len(p.Tokens)-1], chunk, nil); err != nil {
							t.Fatal(err)
						}
					}
					got, err := m.Forward(ctx, c, p.Tokens[c.Len():])
					if err != nil {
						t.Fatal(err)
					}
					cs := fixture.Cosine(got, want)
					if cs < tol {
						t.Errorf("prompt %d (%d tokens) chunk %d: cosine %.6f < %g", i, len(p.Tokens), chunk, cs, tol)
					}
					if f.Type == "f32" {
						greedy := greedyFrom(t, m, c, got, len(p.Greedy))
						if !slices.Equal(greedy, p.Greedy) {
							t.Errorf("prompt %d chunk %d: greedy %v, llama.cpp %v", i, chunk, greedy, p.Greedy)
						}
					}
					if chunk == 0 {
						t.Logf("prompt %d (%d tokens): cosine %.6f", i, len(p.Tokens), cs)
					}
				}
				if f.Type != "f32" {
					differ, worst := teacherForced(t, m, p.Tokens, p.Greedy, ggufSlack)
					t.Logf("prompt %d: llama.cpp's greedy tokens teacher-forced: %d of %d not the engine's top (largest gap %.3f)", i, differ, len(p.Greedy), worst)
				}
			}
			if f.Type != "f32" && len(f.Dequantized) != len(f.Prompts) {
				t.Fatalf("%d dequantized runs for %d prompts", len(f.Dequantized), len(f.Prompts))
			}
			// The strict check of a quantized file (of the loader): with
			// float activations in every matmul, the engine's logits and
			// greedy text equal llama.cpp's on the dequantized weights.
			mf := m
			if len(f.Dequantized) > 0 {
				src, err := weights.Open(filepath.Join(dir, f.File))
				if err != nil {
					t.Fatal(err)
				}
				if mf, err = engine.LoadSource(ctx, floatActivations{src}, b, engine.LoadOptions{}); err != nil {
					t.Fatal(err)
				}
				defer mf.Close()
				src.Close()
			}
			for i, p := range f.Dequantized {
				c := mf.NewCache()
				got, err := mf.Forward(ctx, c, p.Tokens)
				if err != nil {
					t.Fatal(err)
				}
				cs := fixture.Cosine(got, fixture.F32FromBase64(t, p.Logits))
				t.Logf("prompt %d: cosine %.7f with llama.cpp on the dequantized weights", i, cs)
				if cs < ggufTolerance["f32"] {
					t.Errorf("prompt %d: cosine %.7f with llama.cpp on the dequantized weights < %g", i, cs, ggufTolerance["f32"])
				}
				if greedy := greedyFrom(t, mf, c, got, len(p.Greedy)); !slices.Equal(greedy, p.Greedy) {
					t.Errorf("prompt %d: greedy %v, llama.cpp on the dequantized weights %v", i, greedy, p.Greedy)
				}
			}
		})
	}
}

// floatActivations presents a Source's quantized linears with only their
// bits, group size and mode: whatever else a loader asks of the backend for
// them (such as llama.cpp-style 8-bit activations for GGUF weights) is left
// out, so that every matmul takes float activations.
type floatActivations struct{ engine.Source }

func (s floatActivations) Quant(prefix string) engine.QuantSpec {
	q := s.Source.Quant(prefix)
	return engine.QuantSpec{Bits: q.Bits, GroupSize: q.GroupSize, Mode: q.Mode}
}

// teacherForced feeds llama.cpp's greedy continuation to the engine and
// checks each of the first ggufForcedSteps tokens against the engine's
// logits at that step: the engine's top token, or one whose logit is
// within slack of the top (where llama.cpp's 8-bit rounding of activations
// in quantized matmuls may pick the other one). Later steps are counted
// only: that rounding perturbs the recurrent state, the cache and the
// experts' routing as the continuation goes on, so that llama.cpp's run on
// a quantized file drifts from its own run on the same weights dequantized
// (on the Qwen3-Next fixture their greedy texts differ from the first token
// on one prompt); the strict check of a quantized file is against the
// latter. It returns the steps where the top tokens differ and the largest
// gap seen.
func teacherForced(t *testing.T, m *engine.Model, prompt, want []int32, slack float32) (differ int, worst float32) {
	t.Helper()
	c := m.NewCache()
	logits, err := m.Forward(context.Background(), c, prompt)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range want {
		if top := argmax(logits); int32(top) != tok {
			differ++
			gap := logits[top] - logits[tok]
			worst = max(worst, gap)
			if gap > slack && i < ggufForcedSteps {
				t.Errorf("step %d: llama.cpp's token %d is %.3f below the engine's top %d", i, tok, gap, top)
			}
		}
		if logits, err = m.Forward(context.Background(), c, []int32{tok}); err != nil {
			t.Fatal(err)
		}
	}
	return differ, worst
}

// TestGGUFGemma3MatchesLlamaCpp: a Gemma 3 GGUF in llama.cpp's converter
// layout (norms stored as 1 + w, no sliding_window_pattern key so every
// 6th layer is global, linear RoPE scaling on the global layers, tied
// embeddings), f32 and quantized by llama.cpp to Q8_0 and Q4_0, against
// llama.cpp on prompts up to 5 windows long.
func TestGGUFGemma3MatchesLlamaCpp(t *testing.T) {
	checkGGUFAgainstLlamaCpp(t, "gemma3", "Gemma3ForCausalLM", []int{8, 8, 8, 8, 8, 0})
}

// TestGGUFGptOssMatchesLlamaCpp: gpt-oss GGUFs in llama.cpp's converter
// layout (alternating sliding/full layers by llama.cpp's default period,
// sinks, q/k/v/o biases, YaRN, router with a bias, stacked experts with
// biases), with dense f32 experts and with MXFP4 experts (ggml type 39),
// against llama.cpp on prompts up to 5 windows long.
func TestGGUFGptOssMatchesLlamaCpp(t *testing.T) {
	checkGGUFAgainstLlamaCpp(t, "gptoss", "GptOssForCausalLM", []int{8, 0, 8, 0})
}

// TestGGUFGptOssMatchesSafetensors: the gpt-oss GGUFs load to the same
// model as the safetensors they were written from (testmodel, regenerated
// here with the script's generator flags): logits equal bit for bit on a
// prompt 5 windows long.
func TestGGUFGptOssMatchesSafetensors(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32((i*53 + 11) % 290)
	}
	for _, mxfp4 := range []bool{false, true} {
		spec := testmodel.Spec{Arch: "gptoss", Layers: 4, Hidden: 32, Heads: 2, KVHeads: 1, HeadDim: 16, Experts: 4,
			MoEIntermediate: 32, Vocab: 300, Seed: 31, MXFP4: mxfp4}
		dir := t.TempDir()
		if err := testmodel.Write(dir, spec); err != nil {
			t.Fatal(err)
		}
		file := map[bool]string{false: "gptoss_f32.gguf", true: "gptoss_mxfp4.gguf"}[mxfp4]
		var logits [2][]float32
		for i, path := range []string{dir, filepath.Join("testdata", "reference", "gguf", file)} {
			m, err := engine.Load(ctx, path, b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if logits[i], err = m.Forward(ctx, m.NewCache(), prompt); err != nil {
				t.Fatal(err)
			}
			m.Close()
		}
		if !slices.Equal(logits[0], logits[1]) {
			t.Errorf("%s: logits differ from the safetensors model's (cosine %.7f)", file, fixture.Cosine(logits[0], logits[1]))
		}
	}
}

// TestGGUFQwen3NextMatchesLlamaCpp: a Qwen3-Next GGUF in llama.cpp's
// converter layout (attn_qkv/attn_gate regrouped from in_proj_qkvz,
// grouped ssm_ba, ssm_a = -exp(A_log), conv1d [C, K], shared experts,
// partial RoPE), f32 and quantized by llama.cpp to Q8_0, against llama.cpp
// on prompts spanning several 5-token prefill chunks (Gated DeltaNet layers
// 0 and 2, attention layers 1 and 3).
func TestGGUFQwen3NextMatchesLlamaCpp(t *testing.T) {
	checkGGUFAgainstLlamaCpp(t, "qwen3next", "Qwen3NextForCausalLM", nil)
}

// TestGGUFQwen35MatchesLlamaCpp: the mlx-lm-checked Qwen3.5 fixtures
// (dense and MoE; testdata/reference/qwen3_5*, 2 key heads and 4 value
// heads) in llama.cpp's converter layout (separate ssm_beta/ssm_alpha,
// value heads reordered to tiled order, MRoPE sections), quantized by
// llama.cpp to Q4_0, against llama.cpp on the file and on its dequantized
// weights.
func TestGGUFQwen35MatchesLlamaCpp(t *testing.T) {
	t.Run("dense", func(t *testing.T) {
		checkGGUFAgainstLlamaCpp(t, "qwen35", "Qwen3_5ForConditionalGeneration", nil)
	})
	t.Run("moe", func(t *testing.T) {
		checkGGUFAgainstLlamaCpp(t, "qwen35moe", "Qwen3_5MoeForConditionalGeneration", nil)
	})
}
