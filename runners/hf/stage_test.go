package hf

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loader
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

func TestParseLayers(t *testing.T) {
	if r, err := ParseLayers("3:17"); err != nil || r != (LayerRange{3, 17}) || r.String() != "3:17" {
		t.Fatalf("3:17 = %v, %v", r, err)
	}
	for _, bad := range []string{"", "3", "3:3", "4:2", "-1:2", "a:b", "1:2:3"} {
		if _, err := ParseLayers(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// stageIndex is a four-layer model's shard index: the embedding with
// layer 0, layer 2 split over two shards, the final norm and head alone,
// and multi-token-prediction weights (no stage loads them) in their own.
func stageIndex(tied bool) map[string]string {
	m := map[string]string{
		"model.embed_tokens.weight":                 "s1.safetensors",
		"model.layers.0.self_attn.q_proj.weight":    "s1.safetensors",
		"model.layers.0.mlp.down_proj.weight":       "s1.safetensors",
		"model.layers.1.self_attn.q_proj.weight":    "s2.safetensors",
		"model.layers.2.self_attn.q_proj.weight":    "s2.safetensors",
		"model.layers.2.mlp.down_proj.weight":       "s3.safetensors",
		"model.layers.3.self_attn.q_proj.weight":    "s3.safetensors",
		"model.norm.weight":                         "s4.safetensors",
		"model.layers.4.self_attn.q_proj.weight":    "mtp.safetensors", // past num_hidden_layers: a prediction block
		"mtp.fc.weight":                             "mtp.safetensors",
		"model.layers.1.post_attention_layernorm.w": "s2.safetensors",
	}
	if !tied {
		m["lm_head.weight"] = "s4.safetensors"
	}
	return m
}

// TestStageFiles: which shards each stage of a model needs, from its
// config.json and shard index.
func TestStageFiles(t *testing.T) {
	config := []byte(`{"num_hidden_layers":4}`)
	for _, tc := range []struct {
		tied bool
		r    LayerRange
		want []string
	}{
		{false, LayerRange{0, 4}, []string{"s1.safetensors", "s2.safetensors", "s3.safetensors", "s4.safetensors"}},
		{false, LayerRange{0, 1}, []string{"s1.safetensors"}},
		{false, LayerRange{1, 2}, []string{"s2.safetensors"}},
		{false, LayerRange{2, 3}, []string{"s2.safetensors", "s3.safetensors"}},
		{false, LayerRange{3, 4}, []string{"s3.safetensors", "s4.safetensors"}},
		{true, LayerRange{3, 4}, []string{"s1.safetensors", "s3.safetensors", "s4.safetensors"}}, // a tied head reads the embedding
		{true, LayerRange{1, 3}, []string{"s2.safetensors", "s3.safetensors"}},
	} {
		ix, _ := json.Marshal(map[string]any{"weight_map": stageIndex(tc.tied)})
		got, err := stageFiles(config, ix, tc.r)
		if err != nil || !slices.Equal(sortedKeys(got), tc.want) {
			t.Errorf("tied=%v layers %v: %v, %v; want %v", tc.tied, tc.r, sortedKeys(got), err, tc.want)
		}
	}
	ix, _ := json.Marshal(map[string]any{"weight_map": stageIndex(false)})
	if _, err := stageFiles(config, ix, LayerRange{2, 5}); err == nil || !strings.Contains(err.Error(), "4-layer") {
		t.Errorf("layers past the model: %v", err)
	}
	if _, err := stageFiles([]byte(`{"text_config":{"num_hidden_layers":4}}`), ix, LayerRange{0, 1}); err != nil {
		t.Errorf("a multimodal config's text_config: %v", err)
	}
	if _, err := stageFiles([]byte(`{}`), ix, LayerRange{0, 1}); err == nil {
		t.Error("a config without a layer count accepted")
	}
}

// TestPullStageFetchesOnlyItsFiles: `--layers a:b` pulls (over real HTTP
// from the fake Hub) only the config and tokenizer files and the shards
// holding the stage's layers, byte for byte once; the partial snapshot
// serves that stage (and one whose files it holds) offline but never a
// whole-model Resolve; a second stage's pull adds only its own shards; a
// range past the model fails before any weights are fetched; a GGUF file
// is fetched whole whatever the layers.
func TestPullStageFetchesOnlyItsFiles(t *testing.T) {
	h := newFakeHub(t)
	ix, _ := json.Marshal(map[string]any{"weight_map": stageIndex(false)})
	files := map[string][]byte{
		"config.json":                  []byte(`{"architectures":["LlamaForCausalLM"],"num_hidden_layers":4}`),
		"tokenizer.json":               []byte(`{"model":{"type":"BPE"}}`),
		"tokenizer_config.json":        []byte(`{}`),
		"model.safetensors.index.json": ix,
		"s1.safetensors":               randBytes(11, 70_000),
		"s2.safetensors":               randBytes(12, 90_001),
		"s3.safetensors":               randBytes(13, 80_002),
		"s4.safetensors":               randBytes(14, 60_003),
		"mtp.safetensors":              randBytes(15, 50_004),
		"README.md":                    []byte("# big\n"),
	}
	h.addRepo("org/big", false, files)
	store := t.TempDir()
	meta := []string{"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"}
	served := func() map[string]int64 {
		out := map[string]int64{}
		for n := range files {
			if b := h.servedBytes(n); b > 0 {
				out[n] = b
			}
		}
		return out
	}
	expectServed := func(step string, want map[string]int64) {
		t.Helper()
		if got := served(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: the Hub served %v, want %v", step, got, want)
		}
	}
	size := func(n string) int64 { return int64(len(files[n])) }
	metaServed := map[string]int64{}
	for _, n := range meta {
		metaServed[n] = size(n)
	}

	// Stage [2, 4): layer 2 spans s2 and s3; the last layer brings s4.
	var need int64
	c := testClient(t, h, store, func(o *Options) {
		o.Layers = LayerRange{2, 4}
		o.Plan = func(dir string, n, free int64) { need = n }
	})
	dir, err := c.pull(context.Background(), mustRef(t, "org/big"))
	if err != nil {
		t.Fatal(err)
	}
	stage := append(slices.Clone(meta), "s2.safetensors", "s3.safetensors", "s4.safetensors")
	checkSnapshot(t, dir, files, stage)
	want := map[string]int64{"s2.safetensors": size("s2.safetensors"), "s3.safetensors": size("s3.safetensors"), "s4.safetensors": size("s4.safetensors")}
	for n, b := range metaServed {
		want[n] = b
	}
	expectServed("stage 2:4", want)
	// The space check comes once the metadata is in: what remains is the
	// stage's weights.
	if w := size("s2.safetensors") + size("s3.safetensors") + size("s4.safetensors"); need != w {
		t.Errorf("space planned for %d bytes, the stage's weight files are %d", need, w)
	}

	// Offline, the partial snapshot serves its stage and any stage whose
	// shards it holds (layer 1 is all in s2), never the whole model nor a
	// stage needing another shard.
	off := Options{StoreDir: store, Offline: true, Logger: quiet}
	for _, r := range []LayerRange{{2, 4}, {3, 4}, {1, 2}, {0, 2}, {}} {
		o := off
		o.Layers = r
		p, err := Resolve(context.Background(), "org/big", o)
		switch r {
		case LayerRange{2, 4}, LayerRange{3, 4}, LayerRange{1, 2}:
			if err != nil || p != dir {
				t.Errorf("offline layers %v: %q, %v", r, p, err)
			}
		default:
			if !errors.Is(err, ErrNotInStore) {
				t.Errorf("offline layers %v from a 2:4 snapshot: %q, %v; want ErrNotInStore", r, p, err)
			}
		}
	}

	// Stage [0, 2) on the same host adds s1 only (s2 is there).
	if _, err := Resolve(context.Background(), "org/big", Options{StoreDir: store, Endpoint: h.hub.URL, Logger: quiet, Layers: LayerRange{0, 2}}); err != nil {
		t.Fatal(err)
	}
	want["s1.safetensors"] = size("s1.safetensors")
	for _, n := range meta { // the metadata is fetched again only if it changed: it is in place
		want[n] = metaServed[n]
	}
	expectServed("stage 0:2 after 2:4", want)

	// A range past the model fails once the index and config are in,
	// before any weights.
	h2 := newFakeHub(t)
	h2.addRepo("org/big", false, files)
	_, err = testClient(t, h2, t.TempDir(), func(o *Options) { o.Layers = LayerRange{3, 6} }).pull(context.Background(), mustRef(t, "org/big"))
	if err == nil || !strings.Contains(err.Error(), "3:6 of a 4-layer model") {
		t.Fatalf("layers past the model: %v", err)
	}
	for _, n := range []string{"s1.safetensors", "s2.safetensors", "s3.safetensors", "s4.safetensors"} {
		if h2.servedBytes(n) != 0 {
			t.Errorf("%s fetched for a refused range", n)
		}
	}

	// A GGUF file is fetched whole (split GGUFs are not supported).
	h3 := newFakeHub(t)
	gguf := randBytes(16, 120_000)
	h3.addRepo("org/g", false, map[string][]byte{"m-q4.gguf": gguf})
	p, err := testClient(t, h3, t.TempDir(), func(o *Options) { o.Layers = LayerRange{1, 2} }).pull(context.Background(), mustRef(t, "org/g/m-q4.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, gguf) || h3.servedBytes("m-q4.gguf") != int64(len(gguf)) {
		t.Fatalf("gguf pulled for a stage: %v, %d bytes served", err, h3.servedBytes("m-q4.gguf"))
	}
}

// TestPullStageLoads: a real tiny model (qwen2 with its own head; gemma3
// with a tied one) sharded one file per layer on the fake Hub: each
// pipeline stage pulls only its shards, and engine.Load with the same
// Layers loads the stage from that partial snapshot and computes exactly
// what the same stage loaded from the whole model computes; a whole-model
// load of a partial snapshot fails naming the missing shard.
func TestPullStageLoads(t *testing.T) {
	for _, spec := range []testmodel.Spec{
		{Arch: "qwen2", Seed: 21, Layers: 3},
		{Arch: "gemma3", Seed: 22, Layers: 3, Tied: true},
	} {
		t.Run(spec.Arch, func(t *testing.T) {
			full := filepath.Join(t.TempDir(), "full")
			if err := testmodel.Write(full, spec); err != nil {
				t.Fatal(err)
			}
			files := shardPerLayer(t, full, spec)
			h := newFakeHub(t)
			h.addRepo("org/"+spec.Arch, false, files)
			ctx := context.Background()
			var hidden []float32 // the first stage's output, the next one's input
			tokens := []int32{3, 9, 27, 81, 243, 17}
			// Each stage on its own host (its own store).
			stores := []string{t.TempDir(), t.TempDir()}
			for i, r := range []engine.LayerRange{{Start: 0, End: 1}, {Start: 1, End: 3}} {
				dir, err := Resolve(ctx, "org/"+spec.Arch, Options{StoreDir: stores[i], Endpoint: h.hub.URL, Logger: quiet, Layers: LayerRange{r.Start, r.End}})
				if err != nil {
					t.Fatal(err)
				}
				// The shards this stage needs are in the snapshot: its
				// layers', the embedding's with layer 0, the head's with
				// the last layer (and the embedding's for a tied head).
				for l := range spec.Layers {
					name := fmt.Sprintf("layer-%d.safetensors", l)
					if mine := l >= r.Start && l < r.End; mine != fileExists(filepath.Join(dir, name)) {
						t.Fatalf("stage %v: %s in the snapshot: %v", r, name, !mine)
					}
				}
				embed := r.Start == 0 || r.End == spec.Layers && spec.Tied
				if fileExists(filepath.Join(dir, "embed.safetensors")) != embed || fileExists(filepath.Join(dir, "head.safetensors")) != (r.End == spec.Layers) {
					t.Fatalf("stage %v: embed %v, head %v in the snapshot", r, fileExists(filepath.Join(dir, "embed.safetensors")), fileExists(filepath.Join(dir, "head.safetensors")))
				}
				got := stageOut(t, dir, r, tokens, hidden)
				want := stageOut(t, full, r, tokens, hidden)
				if !slices.Equal(got, want) {
					t.Fatalf("stage %v from its partial snapshot computes another output than from the whole model", r)
				}
				hidden = got
			}
			// Every shard crossed the wire once over the two hosts, but a
			// tied embedding twice (both ends of the pipeline read it).
			for n, b := range files {
				want := int64(len(b))
				if n == "embed.safetensors" && spec.Tied {
					want *= 2
				}
				if strings.HasSuffix(n, ".safetensors") && h.servedBytes(n) != want {
					t.Fatalf("%s: %d bytes served, want %d", n, h.servedBytes(n), want)
				}
			}
			// A whole-model load of a stage's snapshot fails, naming a
			// shard it lacks; a whole-model Resolve offline does not take
			// it for the model.
			dir, err := Resolve(ctx, "org/"+spec.Arch, Options{StoreDir: stores[1], Offline: true, Logger: quiet, Layers: LayerRange{1, 3}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := engine.Load(ctx, dir, cpu.New(1), engine.LoadOptions{}); err == nil || !strings.Contains(err.Error(), "-0.safetensors") && !strings.Contains(err.Error(), "embed.safetensors") {
				t.Fatalf("whole-model load of a stage's snapshot: %v", err)
			}
			if _, err := Resolve(ctx, "org/"+spec.Arch, Options{StoreDir: stores[1], Offline: true, Logger: quiet}); !errors.Is(err, ErrNotInStore) {
				t.Fatalf("whole model offline from a stage's pull: %v", err)
			}
		})
	}
}

// stageOut loads layers r of the model in dir and runs tokens (the first
// stage) or hidden (a later one) through it once.
func stageOut(t *testing.T, dir string, r engine.LayerRange, tokens []int32, hidden []float32) []float32 {
	t.Helper()
	m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{Layers: r})
	if err != nil {
		t.Fatalf("load stage %v from %s: %v", r, dir, err)
	}
	defer m.Close()
	c := m.NewCache()
	defer c.Free()
	out, err := m.StageForward(context.Background(), c, tokens, hidden)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shardPerLayer turns the model in dir into a Hub repository sharded one
// file per layer (embed.safetensors: the embedding; head.safetensors: the
// final norm and the LM head) with its shard index.
func shardPerLayer(t *testing.T, dir string, spec testmodel.Spec) map[string][]byte {
	t.Helper()
	tensors, err := testmodel.Tensors(spec)
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string][]engine.Tensor{}
	index := map[string]string{}
	for _, x := range tensors {
		var shard string
		l, part := classify(x.Name)
		switch {
		case l >= 0:
			shard = fmt.Sprintf("layer-%d.safetensors", l)
		case part == partLast:
			shard = "head.safetensors"
		default:
			shard = "embed.safetensors"
		}
		shards[shard] = append(shards[shard], x)
		index[x.Name] = shard
	}
	files := map[string][]byte{}
	for name, ts := range shards {
		var b bytes.Buffer
		if err := weights.WriteSafetensors(&b, ts, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		files[name] = b.Bytes()
	}
	ix, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": index})
	files["model.safetensors.index.json"] = ix
	for _, n := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	return files
}
