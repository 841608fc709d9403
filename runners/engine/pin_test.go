package engine_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/hf"
)

var updatePins = flag.Bool("update-pins", false, "rewrite testdata/pins.json from the current engine")

// pin is what testdata/pins.json records per model: the KV fingerprint
// (the wire pairs prefill and decode runners by it, so it must never change
// for an architecture that exists), Info, and the cpu backend's logits and
// greedy continuation of one prompt (a guard for refactors of the forward:
// the tolerance is tight, far below what a changed op would give).
type pin struct {
	Fingerprint string           `json:"fingerprint"`
	Info        engine.ModelInfo `json:"info"`
	Logits      string           `json:"logits_f32_b64"`
	Greedy      []int32          `json:"greedy"`
}

const pinSmolLM2 = "gguf/SmolLM2-135M-Instruct.Q4_1.gguf"

// pinModels are the models pinned: every architecture the testmodel
// package writes, the Gated DeltaNet reference checkpoints and every GGUF
// fixture.
func pinModels(t *testing.T) map[string]string {
	dir := t.TempDir()
	out := map[string]string{}
	for name, s := range map[string]testmodel.Spec{
		"llama":          {Arch: "llama", Seed: 1},
		"llama_q4":       {Arch: "llama", Seed: 1, QuantBits: 4, GroupSize: 32},
		"qwen2":          {Arch: "qwen2", Seed: 2},
		"qwen3":          {Arch: "qwen3", Seed: 3},
		"qwen3moe":       {Arch: "qwen3moe", Seed: 4, Layers: 3},
		"qwen2moe":       {Arch: "qwen2moe", Seed: 5},
		"mistral":        {Arch: "mistral", Seed: 6},
		"mistral_window": {Arch: "mistral", Seed: 6, SlidingWindow: 8},
		"gemma3":         {Arch: "gemma3", Seed: 7, Layers: 4},
		"gptoss":         {Arch: "gptoss", Seed: 8, Layers: 4},
		"gptoss_mxfp4":   {Arch: "gptoss", Seed: 8, Layers: 4, MXFP4: true, DType: engine.BF16},
	} {
		p := filepath.Join(dir, name)
		if err := testmodel.Write(p, s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = p
	}
	ref := filepath.Join("testdata", "reference")
	for _, d := range []string{"qwen3_next", "qwen3_next_q4", "qwen3_5", "qwen3_5_moe", "qwen3_5_bf16", "mlx_quantized/llama-mlx-q4g32", "smollm3", "smollm3_q4", "olmo2", "olmo2_q4"} {
		out[d] = filepath.Join(ref, d)
	}
	ggufs, _ := filepath.Glob(filepath.Join(ref, "gguf", "*.gguf"))
	ggufs = append(ggufs, filepath.Join(ref, "qwen3moe_q4_0.gguf"))
	for _, g := range ggufs {
		out["gguf/"+filepath.Base(g)] = g
	}
	if p, err := hf.FindSmolLM2(context.Background()); err == nil {
		out[pinSmolLM2] = p // a real llama GGUF, where installed
	}
	return out
}

// TestPinnedFingerprintsAndLogits checks every pinned model against
// testdata/pins.json (written by -update-pins before the engine's
// architectures were split into files; SmolLM3 and OLMo 2 were added with
// their own files): fingerprints and Info exactly,
// logits to 1e-5 of their scale, greedy continuations exactly.
func TestPinnedFingerprintsAndLogits(t *testing.T) {
	if testing.Short() {
		t.Skip("loads every architecture")
	}
	path := filepath.Join("testdata", "pins.json")
	want := map[string]pin{}
	if !*updatePins {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
	}
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prompt := testmodel.SlidingPrompts()[3]
	got := map[string]pin{}
	models := pinModels(t)
	names := make([]string, 0, len(models))
	for n := range models {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		m, err := engine.Load(ctx, models[name], b, engine.LoadOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fp := m.Fingerprint()
		p := pin{Fingerprint: hex.EncodeToString(fp[:]), Info: m.Info()}
		c := m.NewCache()
		toks := slices.Clone(prompt)
		for i := range toks {
			toks[i] %= int32(m.Info().Vocab) // the GGUF fixtures' vocabularies are small
		}
		var first []float32
		for i := range 8 {
			logits, err := m.Forward(ctx, c, toks)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if i == 0 {
				first = slices.Clone(logits)
			}
			next := int32(0)
			for j, v := range logits {
				if v > logits[next] {
					next = int32(j)
				}
			}
			p.Greedy = append(p.Greedy, next)
			toks = []int32{next}
		}
		raw := make([]byte, 4*len(first))
		for i, v := range first {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		p.Logits = base64.StdEncoding.EncodeToString(raw)
		c.Free()
		m.Close()
		got[name] = p
		if *updatePins {
			continue
		}
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: not in %s (run with -update-pins)", name, path)
			continue
		}
		if p.Fingerprint != w.Fingerprint {
			t.Errorf("%s: fingerprint %s, pinned %s", name, p.Fingerprint, w.Fingerprint)
		}
		gi, _ := json.Marshal(p.Info)
		wi, _ := json.Marshal(w.Info)
		if string(gi) != string(wi) {
			t.Errorf("%s: info %s, pinned %s", name, gi, wi)
		}
		fixture.MaxRel(t, name, first, fixture.F32FromBase64(t, w.Logits), 1e-5)
		if !slices.Equal(p.Greedy, w.Greedy) {
			t.Errorf("%s: greedy %v, pinned %v", name, p.Greedy, w.Greedy)
		}
	}
	if *updatePins {
		raw, err := json.MarshalIndent(got, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for name := range want {
		if _, ok := got[name]; !ok && name != pinSmolLM2 {
			t.Errorf("%s: pinned but no longer loaded", name)
		}
	}
}
