package modelinfo

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestWindowsAgreeWithTheEngine: the sliding windows read from config.json
// equal the windows of the model the engine loads (ModelInfo.Windows), for
// families with and without sliding layers, and a Qwen config switched to
// use_sliding_window.
func TestWindowsAgreeWithTheEngine(t *testing.T) {
	type tc struct {
		name  string
		spec  testmodel.Spec
		patch map[string]any // config.json keys set after writing
	}
	for _, c := range []tc{
		{"llama", testmodel.Spec{Arch: "llama", Layers: 3}, nil},
		{"mistral window", testmodel.Spec{Arch: "mistral", Layers: 2, SlidingWindow: 8}, nil},
		{"mistral full", testmodel.Spec{Arch: "mistral", Layers: 2}, nil},
		{"gemma3", testmodel.Spec{Arch: "gemma3", Layers: 4}, nil},
		{"gemma3 pattern 2", testmodel.Spec{Arch: "gemma3", Layers: 5, SlidingPattern: 2, SlidingWindow: 16}, nil},
		{"gptoss", testmodel.Spec{Arch: "gptoss", Layers: 4}, nil},
		{"qwen3 full", testmodel.Spec{Arch: "qwen3", Layers: 3}, map[string]any{"sliding_window": 16}},
		{"qwen2 sliding from 1", testmodel.Spec{Arch: "qwen2", Layers: 3}, map[string]any{"use_sliding_window": true, "sliding_window": 16, "max_window_layers": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, c.spec); err != nil {
				t.Fatal(err)
			}
			if c.patch != nil {
				p := filepath.Join(dir, "config.json")
				var cfg map[string]any
				b, _ := os.ReadFile(p)
				if err := json.Unmarshal(b, &cfg); err != nil {
					t.Fatal(err)
				}
				for k, v := range c.patch {
					cfg[k] = v
				}
				b, _ = json.Marshal(cfg)
				os.WriteFile(p, b, 0o644)
			}
			f, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			want := m.Info().Windows
			if want == nil {
				want = make([]int, f.Layers)
			}
			if slides := c.name != "llama" && c.name != "mistral full" && c.name != "qwen3 full"; slides != (slices.Max(want) > 0) {
				t.Fatalf("engine windows %v: the case does not test what it says", want)
			}
			if !slices.Equal(f.Window, want) {
				t.Errorf("windows %v, engine %v", f.Window, want)
			}
			// A sliding layer reserves its window, a full one the context.
			for i, w := range want {
				tokens := 1000
				if w > 0 {
					tokens = w
				}
				if got := f.KVTokens(i, 1000); got != tokens {
					t.Errorf("layer %d: %d tokens reserved, want %d", i, got, tokens)
				}
			}
		})
	}
}
