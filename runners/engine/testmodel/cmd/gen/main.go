// Command gen writes test models (runners/engine/testmodel).
//
//	go run ./runners/engine/testmodel/cmd/gen -reference DIR
//	    writes every model of testmodel.ReferenceSet under DIR/<name> and
//	    the reference prompts (token ids) to DIR/prompts.json
//	go run ./runners/engine/testmodel/cmd/gen -arch qwen3 -dtype bf16 -bits 4 -group 64 -seed 1 DIR
//	    writes one model to DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	ref := fs.Bool("reference", false, "write the reference set under DIR")
	sliding := fs.Bool("sliding-reference", false, "write the sliding-window reference set (testmodel.SlidingSet) under DIR")
	arch := fs.String("arch", "llama", "llama | qwen2 | qwen3 | qwen3moe | qwen2moe | mistral | gemma3 | gptoss")
	dtype := fs.String("dtype", "f32", "f32 | bf16")
	bits := fs.Int("bits", 0, "0 (dense), 4 or 8")
	group := fs.Int("group", 64, "quantization group size")
	seed := fs.Int64("seed", 7, "random seed")
	layers := fs.Int("layers", 0, "layers (0 = default)")
	hidden := fs.Int("hidden", 0, "hidden size (0 = default)")
	heads := fs.Int("heads", 0, "attention heads (0 = default)")
	kvHeads := fs.Int("kv-heads", 0, "KV heads (0 = default)")
	inter := fs.Int("intermediate", 0, "MLP size (0 = default)")
	vocab := fs.Int("vocab", 0, "vocabulary size (0 = default)")
	window := fs.Int("window", 0, "gemma3, gptoss, mistral: sliding window (0 = default)")
	pattern := fs.Int("pattern", 0, "gemma3: every n-th layer is global (0 = default)")
	headDim := fs.Int("head-dim", 0, "head dimension (0 = default)")
	maxPos := fs.Int("max-positions", 0, "max_position_embeddings (0 = default)")
	mxfp4 := fs.Bool("mxfp4", false, "gptoss: experts in MLX's mxfp4")
	experts := fs.Int("experts", 0, "MoE: experts (0 = default)")
	perTok := fs.Int("experts-per-tok", 0, "MoE: experts per token (0 = default)")
	moeInter := fs.Int("moe-intermediate", 0, "MoE: the experts' MLP size (0 = default)")
	tied := fs.Bool("tied", false, "gemma3: tied embeddings (no lm_head)")
	allSparse := fs.Bool("all-sparse", false, "qwen3moe: every layer sparse (llama.cpp's qwen3moe has no dense layers)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: gen [flags] DIR")
	}
	dir := fs.Arg(0)
	if *ref || *sliding {
		set, prompts := testmodel.ReferenceSet(), testmodel.ReferencePrompts()
		if *sliding {
			set, prompts = testmodel.SlidingSet(), testmodel.SlidingPrompts()
		}
		for _, r := range set {
			if err := testmodel.Write(filepath.Join(dir, r.Name), r.Spec); err != nil {
				return fmt.Errorf("%s: %w", r.Name, err)
			}
			fmt.Println(filepath.Join(dir, r.Name))
		}
		raw, err := json.Marshal(prompts)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "prompts.json"), append(raw, '\n'), 0o644)
	}
	dt := engine.F32
	if *dtype == "bf16" {
		dt = engine.BF16
	} else if *dtype != "f32" {
		return fmt.Errorf("unknown -dtype %q", *dtype)
	}
	s := testmodel.Spec{Arch: *arch, DType: dt, QuantBits: *bits, Seed: *seed, Layers: *layers,
		Hidden: *hidden, Heads: *heads, KVHeads: *kvHeads, Intermediate: *inter, Vocab: *vocab, AllSparse: *allSparse,
		SlidingWindow: *window, SlidingPattern: *pattern, HeadDim: *headDim, MaxPositions: *maxPos, MXFP4: *mxfp4, Tied: *tied,
		Experts: *experts, ExpertsPerToken: *perTok, MoEIntermediate: *moeInter}
	if *bits != 0 {
		s.GroupSize = *group
	}
	return testmodel.Write(dir, s)
}
