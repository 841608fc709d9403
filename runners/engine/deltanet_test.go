package engine_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

type qwen3NextFixture struct {
	Prompts []struct {
		Tokens    []int32   `json:"tokens"`
		Logits    string    `json:"logits_f32_b64"`
		Greedy    []int32   `json:"greedy"`
		MinMargin float64   `json:"min_margin"`
		Margins   []float64 `json:"margins"` // bf16 fixtures: each greedy step's top-two gap
	} `json:"prompts"`
}

func loadQwen3NextFixture(t *testing.T, name ...string) qwen3NextFixture {
	t.Helper()
	file := "qwen3_next"
	if len(name) > 0 {
		file = name[0]
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "reference", file+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx qwen3NextFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Prompts) != 4 {
		t.Fatalf("%d prompts in the fixture", len(fx.Prompts))
	}
	return fx
}

// TestQwen3NextMatchesMLXLM runs the tiny Qwen3-Next model that
// scripts/reference/qwen3_next_reference.py built with mlx-lm's own classes
// (4 layers: Gated DeltaNet, gated attention with partial rotary, twice;
// a dense MLP, then routed experts with a shared expert) and compares with
// mlx-lm's outputs: last-position logits cosine ≥ 0.9999 and identical
// 32-token greedy continuations, for prompts of 1 to 150 tokens, in one
// pass and in prefill chunks of 16 (the 150-token prompt spans 10 chunks,
// so conv and recurrent states cross chunk boundaries). The same for the
// model quantized by mlx-lm (4-bit, 8-bit routers, float32 scales):
// cosine ≥ 0.9999 and the same greedy tokens wherever mlx-lm's top two
// stayed 0.001 apart. And Qwen3.5, dense and MoE (mlx-lm's qwen3_5 and
// qwen3_5_moe: text_config, separate DeltaNet projections, weights under
// language_model.*), built by the same script.
func TestQwen3NextMatchesMLXLM(t *testing.T) {
	for _, name := range []string{"qwen3_next", "qwen3_next_q4", "qwen3_5", "qwen3_5_moe"} {
		t.Run(name, func(t *testing.T) { testQwen3Next(t, name) })
	}
}

func testQwen3Next(t *testing.T, name string) {
	fx := loadQwen3NextFixture(t, name)
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", name), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, p := range fx.Prompts {
		want := fixture.F32FromBase64(t, p.Logits)
		for _, chunk := range []int{0, 16} {
			c := m.NewCache()
			var logits []float32
			if chunk == 0 {
				logits, err = m.Forward(ctx, c, p.Tokens)
			} else {
				if len(p.Tokens) > 1 {
					if err := m.Prefill(ctx, c, p.Tokens[:len(p.Tokens)-1], chunk, nil); err != nil {
						t.Fatal(err)
					}
				}
				logits, err = m.Forward(ctx, c, p.Tokens[len(p.Tokens)-1:])
			}
			if err != nil {
				t.Fatal(err)
			}
			cs := fixture.Cosine(logits, want)
			greedy := greedyFrom(t, m, c, logits, len(p.Greedy))
			t.Logf("prompt %d (%d tokens), chunk %d: cosine %.7f, greedy equal %v", i, len(p.Tokens), chunk, cs, slices.Equal(greedy, p.Greedy))
			if cs < 0.9999 {
				t.Errorf("prompt %d chunk %d: cosine %.7f < 0.9999", i, chunk, cs)
			}
			if p.MinMargin >= 0.001 && !slices.Equal(greedy, p.Greedy) {
				t.Errorf("prompt %d chunk %d: greedy %v, mlx-lm %v", i, chunk, greedy, p.Greedy)
			}
			c.Free()
		}
	}
}

// TestQwen35BF16MatchesMLXLM: the tiny Qwen3.5 (dense) with its weights
// in bfloat16, against mlx-lm computing in bfloat16 with the recurrent
// state and gates in float32. The cpu backend computes in float32 from the
// bf16 weights (mlx-lm rounds every activation to bf16), so: logits cosine
// ≥ 0.999 after a one-pass and a chunked prefill, and, fed mlx-lm's own
// greedy tokens, the same argmax at every step where mlx-lm's top two were
// at least 0.25 apart (8 bf16 steps of these logits; ties and near-ties
// in mlx-lm's bf16 logits are common).
func TestQwen35BF16MatchesMLXLM(t *testing.T) {
	fx := loadQwen3NextFixture(t, "qwen3_5_bf16")
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", "qwen3_5_bf16"), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	bf16Check(t, fx, func(tokens []int32, chunk int) (engine.KVCache, []float32) {
		c := m.NewCache()
		if chunk > 0 && len(tokens) > 1 {
			if err := m.Prefill(ctx, c, tokens[:len(tokens)-1], chunk, nil); err != nil {
				t.Fatal(err)
			}
			tokens = tokens[len(tokens)-1:]
		}
		logits, err := m.Forward(ctx, c, tokens)
		if err != nil {
			t.Fatal(err)
		}
		return c, logits
	}, func(c engine.KVCache, tok int32) []float32 {
		logits, err := m.Forward(ctx, c, []int32{tok})
		if err != nil {
			t.Fatal(err)
		}
		return logits
	}, 0.999, 0.25)
}

// bf16Check compares a bf16 model with the fixture: start runs a prompt
// (chunk 0: one pass) and returns its cache and last logits, step feeds one
// token. Logits cosine ≥ minCos at the prompt's end; then, teacher-forced
// with mlx-lm's greedy tokens, the argmax equals mlx-lm's wherever its
// top-two margin was ≥ minMargin.
func bf16Check(t *testing.T, fx qwen3NextFixture, start func([]int32, int) (engine.KVCache, []float32),
	step func(engine.KVCache, int32) []float32, minCos, minMargin float64) {
	t.Helper()
	for i, p := range fx.Prompts {
		if len(p.Margins) != len(p.Greedy) {
			t.Fatalf("prompt %d: %d margins for %d greedy tokens", i, len(p.Margins), len(p.Greedy))
		}
		for _, chunk := range []int{0, 16} {
			c, logits := start(p.Tokens, chunk)
			cs := fixture.Cosine(logits, fixture.F32FromBase64(t, p.Logits))
			checked, worst := 0, 0.0 // steps held to mlx-lm's token; largest margin we disagreed at
			for s, want := range p.Greedy {
				if got := int32(argmax(logits)); got != want {
					worst = max(worst, p.Margins[s])
					if p.Margins[s] >= minMargin {
						t.Errorf("prompt %d chunk %d step %d: argmax %d, mlx-lm %d (its margin %.3f)", i, chunk, s, got, want, p.Margins[s])
					}
				}
				if p.Margins[s] >= minMargin {
					checked++
				}
				logits = step(c, want)
			}
			c.Free()
			t.Logf("prompt %d (%d tokens) chunk %d: cosine %.6f, %d/%d steps checked, largest margin of a disagreement %.3f",
				i, len(p.Tokens), chunk, cs, checked, len(p.Greedy), worst)
			if cs < minCos {
				t.Errorf("prompt %d chunk %d: cosine %.6f < %g", i, chunk, cs, minCos)
			}
		}
	}
}

// TestQwen3NextHFLayout: the same models rewritten in Hugging Face's
// layout load to the same models: mlx-lm's outputs again (the ±1 round
// trip rounds the norm weights, hence cosine, not equality). Qwen3-Next:
// RMSNorm weights stored minus one, one tensor per expert, conv1d as
// PyTorch's [C, 1, K]. Qwen3.5-MoE: the same norms and conv1d, the
// language model under model.language_model.* beside a vision tower (not
// loaded), lm_head at the top, and fused experts (gate_up_proj [E, 2F, D],
// down_proj [E, D, F]).
func TestQwen3NextHFLayout(t *testing.T) {
	for _, name := range []string{"qwen3_next", "qwen3_5_moe"} {
		t.Run(name, func(t *testing.T) { testHFLayout(t, name) })
	}
}

func testHFLayout(t *testing.T, name string) {
	fx := loadQwen3NextFixture(t, name)
	dir := hfLayoutDir(t, name)
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, p := range fx.Prompts {
		c := m.NewCache()
		logits, err := m.Forward(ctx, c, p.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		cs := fixture.Cosine(logits, fixture.F32FromBase64(t, p.Logits))
		greedy := greedyFrom(t, m, c, logits, len(p.Greedy))
		t.Logf("prompt %d: cosine %.7f", i, cs)
		if cs < 0.9999 || !slices.Equal(greedy, p.Greedy) {
			t.Errorf("prompt %d: cosine %.7f, greedy %v, mlx-lm %v", i, cs, greedy, p.Greedy)
		}
		c.Free()
	}
}

// TestQwen3NextChunkInvariantAndRollback: on the cpu backend the 150-token
// prompt's logits after prefill in chunks of 1, 7 and 64 equal one pass
// bit for bit (recurrent and conv states carried across chunks, MoE rows
// sorted or not). A hybrid cache rolls back exactly to where the last step
// began (a failed step's Truncate); other Truncates go back to the latest
// kept position at or below the target (prefill chunk boundaries, the end
// of a prefill), or to 0, and continuing from there gives the same logits
// as a fresh cache.
func TestQwen3NextChunkInvariantAndRollback(t *testing.T) {
	fx := loadQwen3NextFixture(t)
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", "qwen3_next"), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p := fx.Prompts[3].Tokens
	want, err := m.Forward(ctx, m.NewCache(), p)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 7, 64} {
		c := m.NewCache()
		if err := m.Prefill(ctx, c, p[:len(p)-1], chunk, nil); err != nil {
			t.Fatal(err)
		}
		got, err := m.Forward(ctx, c, p[len(p)-1:])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("chunks of %d: logits differ from one pass (cosine %.9f)", chunk, fixture.Cosine(got, want))
		}
	}

	c := m.NewCache()
	if _, err := m.Forward(ctx, c, p[:100]); err != nil {
		t.Fatal(err)
	}
	a, err := m.Forward(ctx, c, p[100:120])
	if err != nil {
		t.Fatal(err)
	}
	c.Truncate(100) // where the last step began: exact
	if c.Len() != 100 {
		t.Fatalf("Len %d after Truncate(100)", c.Len())
	}
	again, err := m.Forward(ctx, c, p[100:120])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, again) {
		t.Fatal("rolled-back state gives other logits")
	}
	c.Truncate(50) // not a step boundary the cache kept
	if c.Len() != 0 {
		t.Fatalf("Len %d after Truncate(50), want 0 (recurrent state cannot go back there)", c.Len())
	}
	fresh, err := m.Forward(ctx, c, p[:120])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, a) {
		t.Fatal("an emptied cache does not start afresh")
	}
	// Prefill in chunks of 32 keeps the states at 32, 64, 96; decode a
	// few tokens past them, then go back to 80: the cache resumes at 64.
	c2 := m.NewCache()
	if err := m.Prefill(ctx, c2, p[:110], 32, nil); err != nil {
		t.Fatal(err)
	}
	for _, tok := range p[110:115] {
		if _, err := m.Forward(ctx, c2, []int32{tok}); err != nil {
			t.Fatal(err)
		}
	}
	c2.Truncate(80)
	if c2.Len() != 64 {
		t.Fatalf("Len %d after Truncate(80), want the chunk boundary 64", c2.Len())
	}
	resumed, err := m.Forward(ctx, c2, p[64:120])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resumed, a) {
		t.Fatal("resuming from a kept chunk boundary gives other logits than a fresh cache")
	}
	// A chat turn: prefill the prompt but its last token, run that one and
	// decode past it; the next turn shares the prompt, not the answer, and
	// resumes where the prefill ended (the state kept there), not at 0.
	c3 := m.NewCache()
	if err := m.Prefill(ctx, c3, p[:99], 0, nil); err != nil {
		t.Fatal(err)
	}
	for _, tok := range p[99:106] {
		if _, err := m.Forward(ctx, c3, []int32{tok}); err != nil {
			t.Fatal(err)
		}
	}
	c3.Truncate(103)
	if c3.Len() != 99 {
		t.Fatalf("Len %d after Truncate(103), want the end of the prefill 99", c3.Len())
	}
	resumed, err = m.Forward(ctx, c3, p[99:120])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resumed, a) {
		t.Fatal("resuming from the end of a prefill gives other logits than a fresh cache")
	}
	if _, _, err := c.Export(0, 0, 10); err == nil {
		t.Fatal("Export of a recurrent layer succeeded")
	}
	if _, _, err := c.Export(1, 0, 10); err != nil {
		t.Fatalf("Export of an attention layer: %v", err)
	}
}

// TestQwen3NextDecodeStepIsOneEval: a hybrid model's decode step (routed
// experts, recurrent states) is one Eval and one read of the logits.
func TestQwen3NextDecodeStepIsOneEval(t *testing.T) {
	cb, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := &syncCounter{Backend: cb}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", "qwen3_next"), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := m.NewCache()
	logits, err := m.Forward(ctx, c, []int32{1, 2, 3, 4, 5})
	if err != nil {
		t.Fatal(err)
	}
	for step := range 3 {
		b.evals, b.reads = 0, 0
		if logits, err = m.Forward(ctx, c, []int32{int32(argmax(logits))}); err != nil {
			t.Fatal(err)
		}
		if b.evals != 1 || b.reads != 1 {
			t.Fatalf("step %d: %d evals, %d reads", step, b.evals, b.reads)
		}
	}
}

// hfLayoutDir writes the reference fixture name rewritten in Hugging
// Face's layout (see TestQwen3NextHFLayout) and returns its directory.
func hfLayoutDir(t *testing.T, name string) (dir string) {
	src := filepath.Join("testdata", "reference", name)
	in, err := weights.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	qwen35 := strings.HasPrefix(name, "qwen3_5")
	var out []engine.Tensor
	fused := map[string][]byte{} // layer prefix → gate then up, per expert
	for _, n := range in.Names() {
		tn, err := in.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		tn.Data = slices.Clone(tn.Data)
		if qwen35 {
			n = strings.Replace(strings.Replace(n, "language_model.model.", "model.language_model.", 1), "language_model.lm_head.", "lm_head.", 1)
		}
		tn.Name = n
		switch {
		case strings.HasSuffix(n, "layernorm.weight") || strings.HasSuffix(n, ".norm.weight") && !strings.Contains(n, "linear_attn") ||
			strings.HasSuffix(n, "q_norm.weight") || strings.HasSuffix(n, "k_norm.weight"):
			for i := 0; i < len(tn.Data); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(tn.Data[i:])) - 1
				binary.LittleEndian.PutUint32(tn.Data[i:], math.Float32bits(v))
			}
		case strings.HasSuffix(n, "conv1d.weight"):
			tn.Shape = []int{tn.Shape[0], 1, tn.Shape[1]}
		case strings.Contains(n, ".switch_mlp.") && qwen35:
			pre := n[:strings.Index(n, "switch_mlp.")]
			switch {
			case strings.HasSuffix(n, "down_proj.weight"):
				tn.Name = pre + "experts.down_proj"
				out = append(out, tn)
			default:
				// gate before up: collect both, interleave per expert below.
				fused[pre+strings.TrimSuffix(strings.TrimPrefix(n, pre+"switch_mlp."), ".weight")] = tn.Data
				if g, u := fused[pre+"gate_proj"], fused[pre+"up_proj"]; g != nil && u != nil {
					E, per := tn.Shape[0], len(g)/tn.Shape[0]
					var gu []byte
					for e := range E {
						gu = append(append(gu, g[e*per:(e+1)*per]...), u[e*per:(e+1)*per]...)
					}
					out = append(out, engine.Tensor{Name: pre + "experts.gate_up_proj", DType: tn.DType,
						Shape: []int{E, 2 * tn.Shape[1], tn.Shape[2]}, Data: gu})
				}
			}
			continue
		case strings.Contains(n, ".switch_mlp."):
			E, per := tn.Shape[0], len(tn.Data)/tn.Shape[0]
			for e := range E {
				out = append(out, engine.Tensor{Name: strings.Replace(n, ".switch_mlp.", fmt.Sprintf(".experts.%d.", e), 1),
					DType: tn.DType, Shape: tn.Shape[1:], Data: tn.Data[e*per : (e+1)*per]})
			}
			continue
		}
		out = append(out, tn)
	}
	in.Close()
	if qwen35 {
		out = append(out, engine.Tensor{Name: "model.visual.patch_embed.weight", DType: engine.F32, Shape: []int{2}, Data: make([]byte, 8)})
	}
	slices.SortFunc(out, func(a, b engine.Tensor) int { return strings.Compare(a.Name, b.Name) })
	dir = t.TempDir()
	if err := weights.WriteSafetensorsFile(filepath.Join(dir, "model.safetensors"), out, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		raw, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
