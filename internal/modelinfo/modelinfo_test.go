package modelinfo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/hf"
)

// TestTinyModels reads the tiny models testmodel writes and checks every
// fact against the Spec and against the tensors testmodel generated (their
// data lengths, by the layer index in their names).
func TestTinyModels(t *testing.T) {
	layerRe := regexp.MustCompile(`\.layers\.(\d+)\.`)
	for _, s := range []testmodel.Spec{
		{Arch: "llama", Layers: 3},
		{Arch: "qwen3", Layers: 4, DType: engine.BF16},
		{Arch: "qwen3moe", Layers: 3, QuantBits: 4},
		{Arch: "gemma3", Layers: 4, Tied: true},
	} {
		t.Run(s.Arch, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, s); err != nil {
				t.Fatal(err)
			}
			n, err := s.Normalized()
			if err != nil {
				t.Fatal(err)
			}
			f, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if f.Layers != n.Layers || f.Heads != n.Heads || f.KVHeads != n.KVHeads || f.HeadDim != n.HeadDim || f.Hidden != n.Hidden {
				t.Errorf("shape: layers %d heads %d kv %d head dim %d hidden %d; spec %+v", f.Layers, f.Heads, f.KVHeads, f.HeadDim, f.Hidden, n)
			}
			if f.Intermediate != n.Intermediate || f.MaxContext != n.MaxPositions {
				t.Errorf("intermediate %d context %d, want %d %d", f.Intermediate, f.MaxContext, n.Intermediate, n.MaxPositions)
			}
			if s.Arch == "qwen3moe" && (f.Experts != n.Experts || f.MoEIntermediate != n.MoEIntermediate) {
				t.Errorf("experts %d × %d, want %d × %d", f.Experts, f.MoEIntermediate, n.Experts, n.MoEIntermediate)
			}
			ts, err := testmodel.Tensors(s)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]int64, n.Layers)
			var embed, head, total int64
			for _, x := range ts {
				total += int64(len(x.Data))
				if m := layerRe.FindStringSubmatch(x.Name); m != nil {
					i, _ := strconv.Atoi(m[1])
					want[i] += int64(len(x.Data))
				}
				switch {
				case regexp.MustCompile(`embed_tokens`).MatchString(x.Name):
					embed += int64(len(x.Data))
				case regexp.MustCompile(`lm_head`).MatchString(x.Name):
					head += int64(len(x.Data))
				}
			}
			for i := range want {
				if f.LayerBytes[i] != want[i] {
					t.Errorf("layer %d: %d bytes, want %d", i, f.LayerBytes[i], want[i])
				}
			}
			if f.EmbedBytes != embed || f.HeadBytes != head || f.Tied != (head == 0) || f.TotalBytes() != total {
				t.Errorf("embed %d head %d tied %v total %d; want %d %d %v %d", f.EmbedBytes, f.HeadBytes, f.Tied, f.TotalBytes(), embed, head, head == 0, total)
			}
			elem := int64(4)
			if s.DType == engine.BF16 || s.QuantBits != 0 {
				elem = 2
			}
			if got, w := f.KVBytesPerTokenPerLayer(), 2*int64(n.KVHeads*n.HeadDim)*elem; got != w {
				t.Errorf("KV bytes per token per layer %d, want %d", got, w)
			}
			if f.KVLayers(0, f.Layers) != f.Layers {
				t.Errorf("KV layers %d of %d", f.KVLayers(0, f.Layers), f.Layers)
			}
		})
	}
}

// TestSmolLM2 reads the real GGUF and checks it against SmolLM2-135M's
// published shape and against runners/engine/weights' own GGUF parser
// (tensor by tensor).
func TestSmolLM2(t *testing.T) {
	p, err := hf.FindSmolLM2(context.Background())
	if err != nil {
		if os.Getenv("EXO_SMOLLM2_GGUF") != "" {
			t.Fatal(err)
		}
		testutil.Missing(t, "%v", err)
	}
	f, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if f.Arch != "llama" || f.Layers != 30 || f.Heads != 9 || f.KVHeads != 3 || f.HeadDim != 64 || f.Hidden != 576 ||
		f.Intermediate != 1536 || f.MaxContext != 8192 || !f.Tied || f.HeadBytes != 0 {
		t.Errorf("facts %+v", f)
	}
	g, err := weights.OpenGGUF(p)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	layerRe := regexp.MustCompile(`^blk\.(\d+)\.`)
	want := make([]int64, 30)
	var embed, norm int64
	for _, ti := range g.Tensors() {
		if ti.Size == 0 {
			t.Fatalf("tensor %s: size unknown to weights", ti.Name)
		}
		// Sizes here include the padding to the next tensor: round up.
		sz := int64((ti.Size + g.Alignment - 1) / g.Alignment * g.Alignment)
		switch m := layerRe.FindStringSubmatch(ti.Name); {
		case m != nil:
			i, _ := strconv.Atoi(m[1])
			want[i] += sz
		case ti.Name == "token_embd.weight":
			embed += sz
		case ti.Name == "output_norm.weight":
			norm += sz
		}
	}
	for i := range want {
		if f.LayerBytes[i] != want[i] {
			t.Errorf("layer %d: %d bytes, want %d", i, f.LayerBytes[i], want[i])
		}
	}
	st, _ := os.Stat(p)
	if f.EmbedBytes != embed || f.NormBytes != norm || f.TotalBytes() != st.Size()-int64(g.DataOffset) {
		t.Errorf("embed %d norm %d total %d; want %d %d %d", f.EmbedBytes, f.NormBytes, f.TotalBytes(), embed, norm, st.Size()-int64(g.DataOffset))
	}
	if f.KVBytesPerTokenPerLayer() != 2*3*64*4 {
		t.Errorf("KV bytes per token per layer %d", f.KVBytesPerTokenPerLayer())
	}
}

// TestLocateAgreesWithTheStore builds store entries as runners/hf lays them
// out and checks that Locate finds what hf.Resolve (offline) finds, and
// refuses what it refuses.
func TestLocateAgreesWithTheStore(t *testing.T) {
	store := t.TempDir()
	commit := "0123456789abcdef0123456789abcdef01234567"
	snap := filepath.Join(store, "org", "m", "snapshots", commit)
	if err := testmodel.Write(snap, testmodel.Spec{Arch: "llama"}); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(store, "org", "m", "refs", "main"), commit+"\n")
	write(filepath.Join(snap, ".exo-manifest.json"), `{"repo":"org/m","commit":"`+commit+`","full":true,"files":[{"name":"x.gguf","size":1}]}`)
	write(filepath.Join(snap, "x.gguf"), "x")
	write(filepath.Join(store, "org", "partial", "refs", "main"), commit)
	write(filepath.Join(store, "org", "partial", "snapshots", commit, ".exo-manifest.json"), `{"full":false,"files":[]}`)
	local := filepath.Join(snap, "config.json")
	for _, src := range []string{"org/m", "org/m@main", "org/m@" + commit, "org/m/x.gguf", "org/m/y.gguf", "org/m@dev", "org/none", "org/partial", snap, local, "/nonexistent/dir"} {
		got, gerr := Locate(context.Background(), src, store)
		want, werr := hf.Resolve(context.Background(), src, hf.Options{StoreDir: store, Offline: true})
		if (gerr == nil) != (werr == nil) || got != want {
			t.Errorf("%s: Locate = %q, %v; hf.Resolve = %q, %v", src, got, gerr, want, werr)
		}
		if gerr != nil && werr != nil && errors.Is(werr, hf.ErrNotInStore) && !errors.Is(gerr, ErrNotLocal) {
			t.Errorf("%s: %v does not wrap ErrNotLocal", src, gerr)
		}
	}
	f, err := Read(snap)
	if err != nil || f.Layers != testmodel.DefaultLayers {
		t.Errorf("Read(store snapshot) = %+v, %v", f, err)
	}
}
