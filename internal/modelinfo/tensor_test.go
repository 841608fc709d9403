package modelinfo

import (
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/hf"
)

// TestTensorCheckAgreesWithTheEngine: for tiny models of several families
// and shapes (and SmolLM2's GGUF), TensorCheck accepts exactly the rank
// counts the engine's own CheckTensorSplit accepts.
func TestTensorCheckAgreesWithTheEngine(t *testing.T) {
	var paths []string
	for i, s := range []testmodel.Spec{
		{Arch: "llama", Heads: 6, KVHeads: 2, Hidden: 96, Intermediate: 96},
		{Arch: "qwen3", Heads: 8, KVHeads: 4, QuantBits: 4, GroupSize: 32},
		{Arch: "qwen3moe", Heads: 4, KVHeads: 2, QuantBits: 8, MoEIntermediate: 96, Layers: 3},
		{Arch: "qwen2moe", Heads: 4, KVHeads: 4, SharedExpertIntermediate: 80},
		{Arch: "gemma3", Heads: 4, KVHeads: 1},
		{Arch: "gptoss", Heads: 8, KVHeads: 2},
	} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, s); err != nil {
			t.Fatalf("spec %d: %v", i, err)
		}
		paths = append(paths, dir)
	}
	if p, err := hf.FindSmolLM2(t.Context()); err == nil {
		paths = append(paths, p)
	}
	for _, p := range paths {
		f, err := Read(p)
		if err != nil {
			t.Fatal(err)
		}
		src, err := weights.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := engine.ParseConfig(src.Config())
		src.Close()
		if err != nil {
			t.Fatal(err)
		}
		var accepted []int
		for n := 1; n <= 12; n++ {
			mine, theirs := f.TensorCheck(n), engine.CheckTensorSplit(cfg, n)
			if (mine == nil) != (theirs == nil) {
				t.Errorf("%s (%s) over %d ranks: TensorCheck %v; engine %v", f.Arch, p, n, mine, theirs)
			}
			if mine == nil {
				accepted = append(accepted, n)
			}
		}
		t.Logf("%s: %v", f.Arch, accepted)
		if f.Arch == "llama" && f.Format == "gguf" && fmt.Sprint(accepted) != "[1 3]" {
			t.Errorf("SmolLM2 accepts %v ranks, want [1 3]", accepted)
		}
	}
}
