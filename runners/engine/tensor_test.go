package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// tpGroup is a model split over n in-process tensor-parallel ranks, one
// cpu backend (one thread) and one cache each, stepped in lockstep.
type tpGroup struct {
	g  *engine.LocalGroup
	ms []*engine.Model
	cs []engine.KVCache
}

// loadTP loads path on n ranks (n ≥ 1; one rank is the whole model through
// the same code).
func loadTP(t testing.TB, path string, n int, opts engine.LoadOptions) *tpGroup {
	t.Helper()
	tg := &tpGroup{g: engine.NewLocalGroup(n)}
	for r := range n {
		b, err := backend.Open("cpu", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		o := opts
		o.Tensor = tg.g.Rank(r)
		m, err := engine.Load(context.Background(), path, b, o)
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, n, err)
		}
		t.Cleanup(func() { m.Close() })
		tg.ms = append(tg.ms, m)
		tg.cs = append(tg.cs, m.NewCache())
	}
	return tg
}

// each runs f on every rank at once (f(rank)); a rank's error aborts the
// group so that the others do not wait for it. It returns rank 0's result
// and fails the test unless every rank returned the same logits.
func (tg *tpGroup) each(t testing.TB, f func(r int) ([][]float32, error)) [][]float32 {
	t.Helper()
	type res struct {
		r   int
		out [][]float32
		err error
	}
	ch := make(chan res, len(tg.ms))
	for r := range tg.ms {
		go func() {
			out, err := f(r)
			if err != nil {
				tg.g.Abort(err)
			}
			// Copy: the rows may be views of the model's scratch.
			cp := make([][]float32, len(out))
			for i, o := range out {
				cp[i] = slices.Clone(o)
			}
			ch <- res{r, cp, err}
		}()
	}
	outs := make([][][]float32, len(tg.ms))
	var errs []error
	for range tg.ms {
		x := <-ch
		outs[x.r] = x.out
		if x.err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", x.r, x.err))
		}
	}
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	for r := 1; r < len(outs); r++ {
		for i := range outs[0] {
			if !slices.Equal(outs[r][i], outs[0][i]) {
				t.Fatalf("rank %d's logits (row %d) differ from rank 0's", r, i)
			}
		}
	}
	return outs[0]
}

// forwardAll runs tokens through every rank's cache and returns the logits
// of every position.
func (tg *tpGroup) forwardAll(t testing.TB, tokens []int32) [][]float32 {
	return tg.each(t, func(r int) ([][]float32, error) {
		return tg.ms[r].ForwardAllInto(context.Background(), tg.cs[r], tokens, nil)
	})
}

// forward runs tokens and returns the last position's logits.
func (tg *tpGroup) forward(t testing.TB, tokens []int32) []float32 {
	return tg.each(t, func(r int) ([][]float32, error) {
		l, err := tg.ms[r].Forward(context.Background(), tg.cs[r], tokens)
		return [][]float32{l}, err
	})[0]
}

// prefill runs tokens in chunks of chunk on every rank (no logits).
func (tg *tpGroup) prefill(t testing.TB, tokens []int32, chunk int) {
	tg.each(t, func(r int) ([][]float32, error) {
		return nil, tg.ms[r].Prefill(context.Background(), tg.cs[r], tokens, chunk, nil)
	})
}

// reset gives every rank a new empty cache.
func (tg *tpGroup) reset() {
	for r, m := range tg.ms {
		tg.cs[r].Free()
		tg.cs[r] = m.NewCache()
	}
}

// tpPrompt is a prompt of n token ids below vocab.
func tpPrompt(n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*37 + 11) % (vocab - 8))
	}
	return p
}

// minCosine is the least cosine of matching rows.
func minCosine(t testing.TB, got, want [][]float32) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	worst := 1.0
	for i := range got {
		worst = min(worst, fixture.Cosine(got[i], want[i]))
	}
	return worst
}

const tpCosine = 0.99999

// checkTensorParallel compares path split over n ranks with the whole
// model: the logits of every prompt position, a 16-token greedy decode
// step by step through the cache, and the prompt prefilled in chunks of 5
// then decoded again.
func checkTensorParallel(t *testing.T, path string, n int) {
	whole := loadTP(t, path, 1, engine.LoadOptions{})
	split := loadTP(t, path, n, engine.LoadOptions{})
	if s, e := split.ms[n-1].KVHeadRange(); e-s != whole.ms[0].Info().KVHeads/n || s != (n-1)*(e-s) {
		t.Fatalf("rank %d of %d holds KV heads [%d, %d) of %d", n-1, n, s, e, whole.ms[0].Info().KVHeads)
	}
	if g, w := split.cs[0].Geometry().KVHeads, whole.cs[0].Geometry().KVHeads; g*n != w {
		t.Fatalf("a rank's cache has %d KV heads, the whole model's %d", g, w)
	}
	V := whole.ms[0].Info().Vocab
	prompt := tpPrompt(23, V)

	want := whole.forwardAll(t, prompt)
	got := split.forwardAll(t, prompt)
	if c := minCosine(t, got, want); c < tpCosine {
		t.Fatalf("prompt logits: least cosine %.7f over %d positions (want ≥ %v)", c, len(prompt), tpCosine)
	}

	const steps = 16
	decode := func(tg *tpGroup, first []float32) ([]int32, [][]float32) {
		var toks []int32
		var rows [][]float32
		l := first
		for range steps {
			tok := int32(argmax(l))
			toks = append(toks, tok)
			l = tg.forward(t, []int32{tok})
			rows = append(rows, l)
		}
		return toks, rows
	}
	wantToks, wantRows := decode(whole, want[len(want)-1])
	gotToks, gotRows := decode(split, got[len(got)-1])
	if !slices.Equal(gotToks, wantToks) {
		t.Fatalf("greedy continuation over %d ranks %v, whole model %v", n, gotToks, wantToks)
	}
	if c := minCosine(t, gotRows, wantRows); c < tpCosine {
		t.Fatalf("decode logits: least cosine %.7f over %d steps", c, steps)
	}

	// Prefill in chunks, then the last prompt token and the same decode.
	split.reset()
	split.prefill(t, prompt[:len(prompt)-1], 5)
	last := split.forward(t, prompt[len(prompt)-1:])
	if c := fixture.Cosine(last, want[len(want)-1]); c < tpCosine {
		t.Fatalf("after a chunked prefill: cosine %.7f", c)
	}
	chunkToks, _ := decode(split, last)
	if !slices.Equal(chunkToks, wantToks) {
		t.Fatalf("greedy continuation after a chunked prefill %v, whole model %v", chunkToks, wantToks)
	}
	t.Logf("%d ranks: least cosine %.8f (prompt), %.8f (decode); continuation %v", n, minCosine(t, got, want), minCosine(t, gotRows, wantRows), gotToks)
}

// TestTensorParallelMatchesWhole: 2 and 4 in-process ranks on the cpu
// backend give the whole model's logits (cosine ≥ 0.99999 at every prompt
// position and decode step) and the same greedy continuation, for dense,
// MoE, sliding-window and attention-sink models in f32, bf16 and MLX
// 4/8-bit, and gpt-oss with MXFP4 experts.
func TestTensorParallelMatchesWhole(t *testing.T) {
	base := testmodel.Spec{Layers: 3, Hidden: 128, Heads: 8, KVHeads: 4, HeadDim: 16, Intermediate: 256, Seed: 7}
	spec := func(f func(*testmodel.Spec)) testmodel.Spec { s := base; f(&s); return s }
	cases := []struct {
		name string
		spec testmodel.Spec
	}{
		{"llama", spec(func(s *testmodel.Spec) { s.Arch = "llama" })},
		{"llama_q4", spec(func(s *testmodel.Spec) { s.Arch, s.QuantBits, s.GroupSize = "llama", 4, 32 })},
		{"qwen3", spec(func(s *testmodel.Spec) { s.Arch, s.HeadDim = "qwen3", 32 })},
		{"qwen3_q8", spec(func(s *testmodel.Spec) { s.Arch, s.HeadDim, s.QuantBits, s.GroupSize = "qwen3", 32, 8, 64 })},
		{"qwen3moe", spec(func(s *testmodel.Spec) { s.Arch, s.MoEIntermediate = "qwen3moe", 128 })},
		{"qwen3moe_q4", spec(func(s *testmodel.Spec) {
			s.Arch, s.MoEIntermediate, s.QuantBits, s.GroupSize = "qwen3moe", 128, 4, 32
		})},
		{"qwen2moe", spec(func(s *testmodel.Spec) { s.Arch, s.MoEIntermediate, s.SharedExpertIntermediate = "qwen2moe", 64, 96 })},
		{"gemma3", spec(func(s *testmodel.Spec) { s.Arch, s.Layers, s.SlidingWindow = "gemma3", 4, 6 })},
		{"gemma3_bf16", spec(func(s *testmodel.Spec) { s.Arch, s.Layers, s.SlidingWindow, s.DType = "gemma3", 4, 6, engine.BF16 })},
		{"gptoss", spec(func(s *testmodel.Spec) { s.Arch, s.MoEIntermediate = "gptoss", 128 })},
		{"gptoss_mxfp4", spec(func(s *testmodel.Spec) { s.Arch, s.MoEIntermediate, s.MXFP4 = "gptoss", 128, true })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			var err error
			if c.spec.Arch == "gptoss" {
				err = testmodel.WriteHarmony(dir, c.spec, nil)
			} else {
				err = testmodel.Write(dir, c.spec)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{2, 4} {
				t.Run(fmt.Sprint(n), func(t *testing.T) { checkTensorParallel(t, dir, n) })
			}
		})
	}
}

// TestTensorParallelHybrid: the Qwen3-Next and Qwen3.5 fixtures (Gated
// DeltaNet with 2 key heads, 4 value heads, 2 KV heads; Qwen3-Next's
// projections grouped per key head, Qwen3.5's split per part) split over
// 2 ranks match the whole model; 4 ranks are refused by name, and so are
// 2 for the 4-bit Qwen3-Next, whose out_proj (64 inputs, groups of 64)
// cannot split on whole groups.
func TestTensorParallelHybrid(t *testing.T) {
	refused := func(t *testing.T, path string, n int, want string) {
		t.Helper()
		b, err := backend.Open("cpu", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = engine.Load(context.Background(), path, b, engine.LoadOptions{Tensor: engine.NewLocalGroup(n).Rank(0)})
		if !errors.Is(err, engine.ErrTensorSplit) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%d ranks: %v\nwant %q", n, err, want)
		}
	}
	for _, name := range []string{"qwen3_next", "qwen3_5", "qwen3_5_bf16", "qwen3_5_moe"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "reference", name)
			checkTensorParallel(t, path, 2)
			refused(t, path, 4, "linear_num_key_heads 2 is not divisible by 4")
		})
	}
	refused(t, filepath.Join("testdata", "reference", "qwen3_next_q4"), 2,
		"engine: tensor split: 2 ranks: linear_num_value_heads 4 over 2 ranks leaves out_proj 32 inputs per rank, not a multiple of the quantization group 64 (rank counts that divide: 1)")
}

// TestTensorParallelSmolLM2: SmolLM2-135M's GGUF (9 heads, 3 KV heads,
// intermediate 1536) splits over 3 ranks with the whole model's logits and
// greedy text; 2 and 4 ranks are refused, naming the counts and the rank
// counts that divide.
func TestTensorParallelSmolLM2(t *testing.T) {
	path := testenv.SmolLM2(t)
	if testing.Short() {
		t.Skip("loads SmolLM2 four times")
	}
	for _, n := range []int{2, 4} {
		b, err := backend.Open("cpu", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = engine.Load(context.Background(), path, b, engine.LoadOptions{Tensor: engine.NewLocalGroup(n).Rank(0)})
		want := fmt.Sprintf("engine: tensor split: %d ranks: num_attention_heads 9 is not divisible by %d; num_key_value_heads 3 is not divisible by %d (rank counts that divide: 1, 3)", n, n, n)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%d ranks: %v\nwant %q", n, err, want)
		}
	}
	checkTensorParallel(t, path, 3)
}

// TestCheckTensorSplit: the pure check names every count that does not
// divide and the rank counts that would.
func TestCheckTensorSplit(t *testing.T) {
	cfg := func(js string) *engine.Config {
		c, err := engine.ParseConfig([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	llama8b := cfg(`{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
		"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":131072,"rms_norm_eps":1e-5}`)
	qwen235 := cfg(`{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":94,
		"num_attention_heads":64,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"max_position_embeddings":40960,
		"rms_norm_eps":1e-6,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":1536,"norm_topk_prob":true,
		"decoder_sparse_step":1,"mlp_only_layers":[]}`)
	q4 := cfg(`{"architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":384,"num_hidden_layers":2,
		"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":512,"quantization":{"bits":4,"group_size":64}}`)
	gptoss120b := cfg(`{"architectures":["GptOssForCausalLM"],"hidden_size":2880,"intermediate_size":2880,"num_hidden_layers":36,
		"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"vocab_size":201088,"num_local_experts":128,
		"num_experts_per_tok":4,"sliding_window":128,"rope_theta":150000,"rms_norm_eps":1e-5,"max_position_embeddings":131072,
		"quantization_config":{"quant_method":"mxfp4"}}`)
	olmo := cfg(`{"architectures":["Olmo2ForCausalLM"],"hidden_size":256,"intermediate_size":384,"num_hidden_layers":2,
		"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":512}`)
	for _, c := range []struct {
		cfg  *engine.Config
		n    int
		want string // "" = accepted
	}{
		{llama8b, 1, ""}, {llama8b, 2, ""}, {llama8b, 4, ""}, {llama8b, 8, ""},
		{llama8b, 3, "engine: tensor split: 3 ranks: num_attention_heads 32 is not divisible by 3; num_key_value_heads 8 is not divisible by 3; intermediate_size 14336 is not divisible by 3 (rank counts that divide: 1, 2, 4, 8)"},
		{qwen235, 2, ""}, {qwen235, 4, ""},
		{qwen235, 8, "engine: tensor split: 8 ranks: num_key_value_heads 4 is not divisible by 8 (rank counts that divide: 1, 2, 4)"},
		{q4, 2, ""},
		{q4, 4, "engine: tensor split: 4 ranks: intermediate_size 384 over 4 ranks leaves down_proj 96 inputs per rank, not a multiple of the quantization group 64 (rank counts that divide: 1, 2)"},
		{olmo, 2, "engine: tensor split: 2 ranks: Olmo2ForCausalLM: its q/k norms"},
		{olmo, 1, ""},
		{gptoss120b, 2, ""},
		{gptoss120b, 4, "engine: tensor split: 4 ranks: moe_intermediate_size 2880 over 4 ranks leaves the experts' down_proj 720 inputs per rank, not a multiple of the quantization group 32 (rank counts that divide: 1, 2)"},
		{llama8b, 0, "engine: tensor split: 0 ranks"},
	} {
		err := engine.CheckTensorSplit(c.cfg, c.n)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s over %d: %v", c.cfg.Arch, c.n, err)
		case c.want != "" && (err == nil || !errors.Is(err, engine.ErrTensorSplit) || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%s over %d: %v\nwant %q", c.cfg.Arch, c.n, err, c.want)
		}
	}
}

// TestLocalGroupAbort: a rank that fails aborts the group, and the ranks
// waiting in an all_sum return the failure instead of hanging.
func TestLocalGroupAbort(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Heads: 4, KVHeads: 2}); err != nil {
		t.Fatal(err)
	}
	tg := loadTP(t, dir, 2, engine.LoadOptions{})
	errc := make(chan error, 1)
	go func() {
		_, err := tg.ms[0].Forward(context.Background(), tg.cs[0], []int32{1, 2, 3})
		errc <- err
	}()
	// Rank 1 fails before its step (a token outside the vocabulary) and
	// aborts the group, as tpGroup.each does.
	_, err := tg.ms[1].Forward(context.Background(), tg.cs[1], []int32{1, 1 << 20})
	if err == nil {
		t.Fatal("rank 1: no error for a token outside the vocabulary")
	}
	tg.g.Abort(err)
	if err := <-errc; !errors.Is(err, engine.ErrCollectiveAborted) {
		t.Fatalf("rank 0: %v, want ErrCollectiveAborted", err)
	}
	if tg.cs[0].Len() != 0 {
		t.Fatalf("rank 0's cache holds %d positions after the aborted step", tg.cs[0].Len())
	}
}

// TestTensorParallelBatchAndStages: a batched decode step (two sequences
// at once) over 2 ranks gives each sequence the whole model's logits, and
// tensor ranks compose with pipeline stages: two stages of two ranks each
// (LoadOptions.Layers with Tensor) hand hidden states from one group to the
// other and end with the whole model's logits.
func TestTensorParallelBatchAndStages(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen3moe", Layers: 4, Heads: 8, KVHeads: 4, HeadDim: 16, MoEIntermediate: 64, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	whole := loadTP(t, dir, 1, engine.LoadOptions{})
	split := loadTP(t, dir, 2, engine.LoadOptions{})
	V := whole.ms[0].Info().Vocab
	p1, p2 := tpPrompt(7, V), tpPrompt(12, V)[3:]

	// Batched decode: sequence 1 in cache 0, sequence 2 in a second cache.
	batch := func(tg *tpGroup) [][]float32 {
		second := make([]engine.KVCache, len(tg.ms))
		for r, m := range tg.ms {
			second[r] = m.NewCache()
			t.Cleanup(second[r].Free)
		}
		tg.each(t, func(r int) ([][]float32, error) {
			if _, err := tg.ms[r].Forward(ctx, tg.cs[r], p1); err != nil {
				return nil, err
			}
			_, err := tg.ms[r].Forward(ctx, second[r], p2)
			return nil, err
		})
		return tg.each(t, func(r int) ([][]float32, error) {
			return tg.ms[r].ForwardBatch(ctx, []engine.KVCache{tg.cs[r], second[r]}, []int32{5, 9})
		})
	}
	if c := minCosine(t, batch(split), batch(whole)); c < tpCosine {
		t.Fatalf("batched decode over 2 ranks: least cosine %.7f", c)
	}

	// Two stages of two ranks.
	whole.reset()
	want := whole.forward(t, p1)
	s0 := loadTP(t, dir, 2, engine.LoadOptions{Layers: engine.LayerRange{Start: 0, End: 2}})
	s1 := loadTP(t, dir, 2, engine.LoadOptions{Layers: engine.LayerRange{Start: 2, End: 4}})
	hidden := s0.each(t, func(r int) ([][]float32, error) {
		h, err := s0.ms[r].StageForward(ctx, s0.cs[r], p1, nil)
		return [][]float32{h}, err
	})[0]
	got := s1.each(t, func(r int) ([][]float32, error) {
		l, err := s1.ms[r].StageForward(ctx, s1.cs[r], p1, hidden)
		return [][]float32{l}, err
	})[0]
	if c := fixture.Cosine(got, want); c < tpCosine {
		t.Fatalf("2 stages × 2 ranks: cosine %.7f against the whole model", c)
	}
}

// TestTensorShardKindsMatchWeights: what each rank's blocks hold agrees
// with the shard kinds their Weights declare (the descriptions the
// benchmarks and the MLX runner read): Replicated whole, SplitOutput a
// share of the rows (axis −2, or a vector's only axis), SplitInput a share
// of the input columns (axis −1, packed when quantized), SplitHeads a share
// of the heads; and every weight a block lists was loaded.
func TestTensorShardKindsMatchWeights(t *testing.T) {
	dirs := map[string]string{}
	for name, spec := range map[string]testmodel.Spec{
		"llama_q4": {Arch: "llama", Heads: 8, KVHeads: 4, QuantBits: 4, GroupSize: 32},
		"qwen3moe": {Arch: "qwen3moe", Heads: 8, KVHeads: 4, MoEIntermediate: 64},
		"qwen2moe": {Arch: "qwen2moe", Heads: 8, KVHeads: 4, MoEIntermediate: 64, SharedExpertIntermediate: 64},
		"gemma3":   {Arch: "gemma3", Layers: 3, Heads: 8, KVHeads: 4},
	} {
		dirs[name] = t.TempDir()
		if err := testmodel.Write(dirs[name], spec); err != nil {
			t.Fatal(err)
		}
	}
	dirs["gptoss_mxfp4"] = t.TempDir()
	if err := testmodel.WriteHarmony(dirs["gptoss_mxfp4"], testmodel.Spec{Arch: "gptoss", Heads: 8, KVHeads: 4, MoEIntermediate: 64, MXFP4: true}, nil); err != nil {
		t.Fatal(err)
	}
	dirs["qwen3_next"] = filepath.Join("testdata", "reference", "qwen3_next")
	dirs["qwen3_5"] = filepath.Join("testdata", "reference", "qwen3_5")
	const n = 2
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			whole := loadTP(t, dir, 1, engine.LoadOptions{})
			split := loadTP(t, dir, n, engine.LoadOptions{})
			for i, blk := range whole.ms[0].Blocks() {
				ws := engine.WeightShapes(blk)
				rs := engine.WeightShapes(split.ms[1].Blocks()[i])
				for _, w := range blk.Weights() {
					full, ok := ws[w.Name]
					if !ok {
						t.Fatalf("layer %d lists %s, which it did not load", i, w.Name)
					}
					part := rs[w.Name]
					want := slices.Clone(full)
					switch axis := len(full) - 1; w.Shard {
					case engine.SplitOutput:
						if len(full) > 1 {
							axis--
						}
						want[axis] /= n
					case engine.SplitInput, engine.SplitHeads:
						want[axis] /= n
					}
					if !slices.Equal(part, want) {
						t.Errorf("layer %d %s (%v): rank 1 holds %v of %v, want %v", i, w.Name, w.Shard, part, full, want)
					}
				}
			}
		})
	}
}

// TestTensorParallelCheckpointLayouts: the loaders that rebuild experts
// from other layouts split them too: gpt-oss's released MXFP4 blocks
// (gate and up rows interleaved) and HF's dense gpt-oss experts
// (input-major, gate and up columns interleaved) over 2 and 4 ranks;
// Qwen3-Next's HF layout (one tensor per expert, norms stored minus one)
// and Qwen3.5-MoE's fused gate_up_proj over 2.
func TestTensorParallelCheckpointLayouts(t *testing.T) {
	spec := testmodel.Spec{Arch: "gptoss", Seed: 4, Layers: 2, Heads: 8, KVHeads: 4, MoEIntermediate: 128}
	t.Run("gptoss_released_mxfp4", func(t *testing.T) {
		s := spec
		s.MXFP4 = true
		_, dir := gptossReleasedDirs(t, s)
		checkTensorParallel(t, dir, 2)
		checkTensorParallel(t, dir, 4)
	})
	t.Run("gptoss_hf_dense", func(t *testing.T) {
		_, dir := gptossHFDenseDirs(t, spec)
		checkTensorParallel(t, dir, 2)
		checkTensorParallel(t, dir, 4)
	})
	for _, name := range []string{"qwen3_next", "qwen3_5_moe"} {
		t.Run(name+"_hf", func(t *testing.T) { checkTensorParallel(t, hfLayoutDir(t, name), 2) })
	}
}
