package engine_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// TestBlocksDescribeThemselves: every block of a loaded model reports the
// kind Info gives its layer and lists its weights with a shard rule, each
// named once; for dense models every name is a tensor of the checkpoint
// (a Linear's prefix + ".weight", or the tensor itself).
func TestBlocksDescribeThemselves(t *testing.T) {
	ref := filepath.Join("testdata", "reference")
	gemma := t.TempDir()
	if err := testmodel.Write(gemma, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 4}); err != nil {
		t.Fatal(err)
	}
	moe := t.TempDir()
	if err := testmodel.Write(moe, testmodel.Spec{Arch: "qwen2moe", Seed: 5}); err != nil {
		t.Fatal(err)
	}
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir   string
		dense bool
	}{
		{filepath.Join(ref, "smollm3"), true}, {filepath.Join(ref, "olmo2"), true}, {gemma, true},
		{filepath.Join(ref, "qwen3_next"), false}, {moe, false},
	} {
		m, err := engine.Load(context.Background(), tc.dir, b, engine.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		src, err := weights.Open(tc.dir)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, n := range src.Names() {
			names[n] = true
		}
		info := m.Info()
		seen := map[string]bool{}
		for i, blk := range m.Blocks() {
			k := blk.Kind()
			wantWindow := 0
			if info.Windows != nil {
				wantWindow = info.Windows[i]
			}
			if k.Window != wantWindow {
				t.Errorf("%s layer %d: kind %+v, Info windows %v", tc.dir, i, k, info.Windows)
			}
			if info.Recurrent != nil && info.Recurrent[i] != k.Recurrent || info.Recurrent == nil && k.Recurrent {
				t.Errorf("%s layer %d: kind %+v, Info recurrent %v", tc.dir, i, k, info.Recurrent)
			}
			ws := blk.Weights()
			if len(ws) < 4 {
				t.Errorf("%s layer %d: weights %v", tc.dir, i, ws)
			}
			for _, w := range ws {
				if seen[w.Name] || !strings.HasPrefix(w.Name, "model.layers.") {
					t.Errorf("%s layer %d: weight %q listed twice or outside the layers", tc.dir, i, w.Name)
				}
				seen[w.Name] = true
				if tc.dense && !names[w.Name] && !names[w.Name+".weight"] {
					t.Errorf("%s layer %d: weight %q is not in the checkpoint", tc.dir, i, w.Name)
				}
				if strings.HasSuffix(w.Name, "o_proj") && w.Shard != engine.SplitInput || strings.HasSuffix(w.Name, "q_proj") && w.Shard != engine.SplitOutput {
					t.Errorf("%s: %s shards as %v", tc.dir, w.Name, w.Shard)
				}
			}
		}
		src.Close()
		m.Close()
	}
}

// TestNewArchConfigs: SmolLM3's NoPE settings and OLMo 2's refusals.
func TestNewArchConfigs(t *testing.T) {
	base := `"hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,"vocab_size":10`
	for _, tc := range []struct {
		cfg, err string
	}{
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `}`, ""},
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `,"no_rope_layers":[1,0,1]}`, "no_rope_layers"},
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `,"no_rope_layers":[1,0,1,2]}`, "no_rope_layers"},
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `,"no_rope_layer_interval":0}`, "no_rope_layer_interval"},
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `,"mlp_bias":true}`, "mlp_bias"},
		{`{"architectures":["SmolLM3ForCausalLM"],` + base + `,"layer_types":["full_attention","sliding_attention","full_attention","full_attention"]}`, "layer_types"},
		{`{"architectures":["Olmo2ForCausalLM"],` + base + `}`, ""},
		{`{"architectures":["Olmo2ForCausalLM"],` + base + `,"mlp_bias":true}`, "mlp_bias"},
	} {
		c, err := engine.ParseConfig([]byte(tc.cfg))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.cfg, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one naming %s", tc.cfg, err, tc.err)
		case tc.err == "" && strings.Contains(tc.cfg, "SmolLM3") && !c.TieEmbeddings:
			t.Errorf("%s: tie_word_embeddings defaults to false, HF's default is true", tc.cfg)
		}
	}
}
