package weights

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

func writeGGUF(t *testing.T, b *ggufBuilder) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func f32s(t *testing.T, x engine.Tensor) []float32 {
	t.Helper()
	if x.DType != engine.F32 {
		t.Fatalf("%s: dtype %v", x.Name, x.DType)
	}
	out := make([]float32, len(x.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(x.Data[4*i:]))
	}
	return out
}

func llamaMeta(b *ggufBuilder, arch string, heads, kvHeads uint32) {
	b.Str("general.architecture", arch)
	b.U32(arch+".block_count", 1)
	b.U32(arch+".embedding_length", 8)
	b.U32(arch+".feed_forward_length", 32)
	b.U32(arch+".attention.head_count", heads)
	b.U32(arch+".attention.head_count_kv", kvHeads)
	b.U32(arch+".context_length", 128)
	b.F32(arch+".rope.freq_base", 1e6)
	b.F32(arch+".attention.layer_norm_rms_epsilon", 1e-6)
	b.Strs("tokenizer.ggml.tokens", []string{"a", "b", "c", "d"})
}

// TestGGUFSourceUnpermutesLlamaQK builds a llama GGUF whose F32 attn_q and
// attn_k rows hold their own HF row index after llama.cpp's permutation,
// and checks that the Source gives them back in HF order.
func TestGGUFSourceUnpermutesLlamaQK(t *testing.T) {
	const hidden, heads, kvHeads, hd = 8, 2, 1, 4
	permuted := func(rows, nHeads int) []byte {
		// convert_hf_to_gguf: rows (heads, 2, hd/2) → (heads, hd/2, 2).
		v := make([]float32, rows*hidden)
		half := rows / nHeads / 2
		for h := 0; h < nHeads; h++ {
			for i := 0; i < half; i++ {
				for j := 0; j < 2; j++ {
					hfRow := h*2*half + j*half + i
					ggufRow := h*2*half + 2*i + j
					for c := 0; c < hidden; c++ {
						v[ggufRow*hidden+c] = float32(hfRow*100 + c)
					}
				}
			}
		}
		return f32Bytes(v...)
	}
	var b ggufBuilder
	llamaMeta(&b, "llama", heads, kvHeads)
	b.Tensor("blk.0.attn_q.weight", TypeF32, permuted(heads*hd, heads), hidden, heads*hd)
	b.Tensor("blk.0.attn_k.weight", TypeF32, permuted(kvHeads*hd, kvHeads), hidden, kvHeads*hd)
	b.Tensor("blk.0.attn_v.weight", TypeF32, permuted(kvHeads*hd, 1), hidden, kvHeads*hd)
	b.Tensor("token_embd.weight", TypeF32, make([]byte, 4*4*hidden), hidden, 4)
	src, err := Open(writeGGUF(t, &b))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, name := range []string{"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"} {
		x, err := src.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		v := f32s(t, x)
		rows := x.Shape[0]
		if x.Shape[1] != hidden {
			t.Fatalf("%s shape %v", name, x.Shape)
		}
		for r := 0; r < rows; r++ {
			if v[r*hidden+1] != float32(r*100+1) {
				t.Fatalf("%s row %d holds HF row %v", name, r, (v[r*hidden+1]-1)/100)
			}
		}
	}
	// v_proj is never permuted: its rows stay as stored.
	x, _ := src.Tensor("model.layers.0.self_attn.v_proj.weight")
	if v := f32s(t, x); v[1*hidden] != 200 {
		t.Errorf("v_proj was permuted: row 1 = %v", v[1*hidden])
	}
	var cfg map[string]any
	json.Unmarshal(src.Config(), &cfg)
	if cfg["tie_word_embeddings"] != true || cfg["head_dim"] != 4.0 || cfg["num_key_value_heads"] != 1.0 || cfg["quantization"] != nil {
		t.Errorf("config %s", src.Config())
	}
}

func TestGGUFSourceQwen3AndQ4_0(t *testing.T) {
	var b ggufBuilder
	llamaMeta(&b, "qwen3", 2, 2)
	b.U32("qwen3.attention.key_length", 8)
	norm := f32Bytes(1, 2, 3, 4, 5, 6, 7, 8)
	b.Tensor("blk.0.attn_q_norm.weight", TypeF32, norm, 8)
	b.Tensor("blk.0.attn_k_norm.weight", TypeF32, norm, 8)
	// One Q4_0 row of 32: d = 1.0 (f16 0x3c00), nibbles 0..15 low, 15..0 high.
	blk := []byte{0x00, 0x3c}
	for i := 0; i < 16; i++ {
		blk = append(blk, byte(i)|byte(15-i)<<4)
	}
	b.Tensor("blk.0.attn_q.weight", TypeQ4_0, blk, 32, 1)
	b.Tensor("output.weight", TypeF16, make([]byte, 2*8*4), 8, 4)
	b.Tensor("blk.0.attn_q.bias", TypeF32, f32Bytes(1), 1)
	src, err := Open(writeGGUF(t, &b))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	want := []string{
		"lm_head.weight",
		"model.layers.0.self_attn.k_norm.weight",
		"model.layers.0.self_attn.q_norm.weight",
		"model.layers.0.self_attn.q_proj.bias",
		"model.layers.0.self_attn.q_proj.biases",
		"model.layers.0.self_attn.q_proj.scales",
		"model.layers.0.self_attn.q_proj.weight",
	}
	if got := src.Names(); !reflect.DeepEqual(got, want) {
		t.Errorf("names %q", got)
	}
	x, err := src.Tensor("model.layers.0.self_attn.q_norm.weight")
	if err != nil || !reflect.DeepEqual(f32s(t, x), []float32{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("q_norm %v %v", x, err)
	}
	lm, _ := src.Tensor("lm_head.weight")
	if lm.DType != engine.F16 || !reflect.DeepEqual(lm.Shape, []int{4, 8}) {
		t.Errorf("lm_head %v %v", lm.DType, lm.Shape)
	}
	if q := src.Quant("model.layers.0.self_attn.q_proj"); q != (engine.QuantSpec{Bits: 4, GroupSize: 32}) {
		t.Errorf("quant %v", q)
	}
	w, _ := src.Tensor("model.layers.0.self_attn.q_proj.weight")
	s, _ := src.Tensor("model.layers.0.self_attn.q_proj.scales")
	bi, _ := src.Tensor("model.layers.0.self_attn.q_proj.biases")
	if !reflect.DeepEqual(w.Shape, []int{1, 4}) || !reflect.DeepEqual(s.Shape, []int{1, 1}) {
		t.Fatalf("shapes %v %v", w.Shape, s.Shape)
	}
	if binary.LittleEndian.Uint32(w.Data) != 0x76543210 || binary.LittleEndian.Uint32(w.Data[8:]) != 0x89abcdef {
		t.Errorf("packed words %x", w.Data)
	}
	if F16ToF32(binary.LittleEndian.Uint16(s.Data)) != 1 || F16ToF32(binary.LittleEndian.Uint16(bi.Data)) != -8 {
		t.Errorf("scale/bias %x %x", s.Data, bi.Data)
	}
	var cfg map[string]any
	json.Unmarshal(src.Config(), &cfg)
	if cfg["architectures"].([]any)[0] != "Qwen3ForCausalLM" || cfg["head_dim"] != 8.0 || cfg["tie_word_embeddings"] != false || cfg["attention_bias"] != true {
		t.Errorf("config %s", src.Config())
	}
	if _, err := src.Tensor("token_embd.weight"); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("GGUF name resolved: %v", err)
	}
}

func TestGGUFSourceRejects(t *testing.T) {
	var b ggufBuilder
	llamaMeta(&b, "gpt2", 2, 2)
	if _, err := Open(writeGGUF(t, &b)); err == nil {
		t.Error("unsupported architecture accepted")
	}
	var c ggufBuilder
	llamaMeta(&c, "llama", 2, 2)
	c.Tensor("blk.0.ffn_up.weight", TypeQ2_K, make([]byte, 84), 256, 1)
	if _, err := Open(writeGGUF(t, &c)); err == nil || !strings.Contains(err.Error(), "Q2_K not supported") {
		t.Errorf("Q2_K: %v, want it refused by name", err)
	}
}

// FuzzGGUFSource feeds mutated GGUF files through the whole Source path
// (renaming, config synthesis, un-permutation, conversion): errors are
// fine, panics are not.
func FuzzGGUFSource(f *testing.F) {
	var b ggufBuilder
	llamaMeta(&b, "llama", 2, 1)
	b.Tensor("blk.0.attn_q.weight", TypeF32, make([]byte, 4*8*8), 8, 8)
	b.Tensor("blk.0.attn_k.weight", TypeQ8_0, make([]byte, 34*4), 32, 4)
	b.Tensor("blk.0.ffn_up.weight", TypeQ4_1, make([]byte, 20*2), 32, 2)
	b.Tensor("output_norm.weight", TypeF16, make([]byte, 16), 8)
	f.Add(b.Bytes())
	var k ggufBuilder
	llamaMeta(&k, "llama", 2, 1)
	k.Tensor("blk.0.attn_q.weight", TypeQ4_K, make([]byte, 144*2), 256, 2)
	k.Tensor("blk.0.attn_k.weight", TypeQ5_K, make([]byte, 176), 256, 1)
	k.Tensor("blk.0.ffn_down.weight", TypeQ6_K, make([]byte, 210), 256, 1)
	k.Tensor("blk.0.ffn_up.weight", TypeQ5_0, make([]byte, 22*8), 32, 8)
	k.Tensor("blk.0.ffn_gate.weight", TypeQ5_1, make([]byte, 24*8), 32, 8)
	f.Add(k.Bytes())
	var moe ggufBuilder
	llamaMeta(&moe, "qwen3moe", 2, 1)
	moe.U32("qwen3moe.expert_count", 2)
	moe.U32("qwen3moe.expert_used_count", 1)
	moe.U32("qwen3moe.expert_feed_forward_length", 32)
	moe.Tensor("blk.0.ffn_gate_inp.weight", TypeF32, make([]byte, 4*8*2), 8, 2)
	moe.Tensor("blk.0.ffn_gate_exps.weight", TypeQ8_0, make([]byte, 34*2*32/32*2), 32, 2, 2)
	moe.Tensor("blk.0.ffn_down_exps.weight", TypeQ4_K, make([]byte, 144*2*2), 256, 2, 2)
	f.Add(moe.Bytes())
	var gem ggufBuilder
	llamaMeta(&gem, "gemma3", 2, 1)
	gem.U32("gemma3.attention.sliding_window", 4)
	gem.Bools("gemma3.attention.sliding_window_pattern", []bool{true})
	gem.F32("gemma3.rope.freq_base_swa", 1e4)
	gem.Tensor("blk.0.post_ffw_norm.weight", TypeF32, make([]byte, 4*8), 8)
	gem.Tensor("blk.0.ffn_gate.weight", TypeQ8_0, make([]byte, 34*2), 32, 2)
	f.Add(gem.Bytes())
	var oss ggufBuilder
	llamaMeta(&oss, "gpt-oss", 2, 1)
	oss.U32("gpt-oss.expert_count", 2)
	oss.U32("gpt-oss.expert_used_count", 1)
	oss.U32("gpt-oss.expert_feed_forward_length", 32)
	oss.U32("gpt-oss.attention.sliding_window", 4)
	oss.Tensor("blk.0.attn_sinks.weight", TypeF32, make([]byte, 4*2), 2)
	oss.Tensor("blk.0.ffn_up_exps.weight", TypeMXFP4, make([]byte, 17*2*2), 32, 2, 2)
	oss.Tensor("blk.0.ffn_up_exps.bias", TypeF32, make([]byte, 4*2*2), 2, 2)
	f.Add(oss.Bytes())
	var q3n ggufBuilder
	llamaMeta(&q3n, "qwen3next", 2, 1)
	for k, v := range map[string]uint32{"expert_count": 2, "expert_used_count": 1, "expert_feed_forward_length": 32,
		"ssm.conv_kernel": 2, "ssm.state_size": 4, "ssm.group_count": 1, "ssm.time_step_rank": 2, "ssm.inner_size": 8} {
		q3n.U32("qwen3next."+k, v)
	}
	q3n.Bools("qwen3next.attention.recurrent_layers", []bool{true})
	q3n.Tensor("blk.0.ssm_ba.weight", TypeQ8_0, make([]byte, 34*4), 32, 4)
	q3n.Tensor("blk.0.ssm_a", TypeF32, make([]byte, 4*2), 2)
	q3n.Tensor("blk.0.ssm_conv1d.weight", TypeF32, make([]byte, 4*2*16), 2, 16)
	q3n.Tensor("blk.0.ffn_gate_inp_shexp.weight", TypeF32, make([]byte, 4*8), 8)
	f.Add(q3n.Bytes())
	var q35 ggufBuilder
	llamaMeta(&q35, "qwen35moe", 2, 1)
	for k, v := range map[string]uint32{"expert_count": 2, "expert_used_count": 1, "expert_feed_forward_length": 32,
		"ssm.conv_kernel": 2, "ssm.state_size": 4, "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 16,
		"full_attention_interval": 2} {
		q35.U32("qwen35moe."+k, v)
	}
	q35.Tensor("blk.0.ssm_out.weight", TypeQ8_0, make([]byte, 34*8), 32, 8)
	q35.Tensor("blk.0.ssm_alpha.weight", TypeF32, make([]byte, 4*4*8), 8, 4)
	q35.Tensor("blk.0.ssm_a", TypeF32, make([]byte, 4*4), 4)
	q35.Tensor("blk.0.ssm_conv1d.weight", TypeF32, make([]byte, 4*2*32), 2, 32)
	f.Add(q35.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := ParseGGUF(data)
		if err != nil {
			return
		}
		s, err := newGGUFSource(g)
		if err != nil {
			return
		}
		for _, n := range s.Names() {
			s.Tensor(n)
		}
		s.Vocab()
	})
}

// llama3Factors is what llama.cpp's convert_hf_to_gguf.py writes as
// rope_freqs.weight for Llama 3.1 (written here from that script, not from
// the engine's RoPE code).
func llama3Factors(base float64, dim int, factor, low, high, old float64) []float32 {
	out := make([]float32, dim/2)
	lowWave, highWave := old/low, old/high
	for i := range out {
		freq := float64(float32(1 / math.Pow(base, float64(2*i)/float64(dim))))
		wave := 2 * math.Pi / freq
		switch {
		case wave < highWave:
			out[i] = 1
		case wave > lowWave:
			out[i] = float32(factor)
		default:
			smooth := (old/wave - low) / (high - low)
			out[i] = float32(1 / ((1-smooth)/factor + smooth))
		}
	}
	return out
}

func TestGGUFRopeFreqsBecomeLlama3Scaling(t *testing.T) {
	build := func(factors []float32) string {
		var b ggufBuilder
		b.Str("general.architecture", "llama")
		b.U32("llama.block_count", 1)
		b.U32("llama.embedding_length", 256) // head dim 128, as Llama 3.1
		b.U32("llama.feed_forward_length", 32)
		b.U32("llama.attention.head_count", 2)
		b.U32("llama.attention.head_count_kv", 1)
		b.F32("llama.rope.freq_base", 500000)
		b.Strs("tokenizer.ggml.tokens", []string{"a", "b", "c", "d"})
		raw := make([]byte, 4*len(factors))
		for i, f := range factors {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
		}
		b.Tensor("rope_freqs.weight", TypeF32, raw, uint64(len(factors)))
		return writeGGUF(t, &b)
	}
	for _, factor := range []float64{8, 32} {
		src, err := Open(build(llama3Factors(500000, 128, factor, 1, 4, 8192)))
		if err != nil {
			t.Fatalf("factor %v: %v", factor, err)
		}
		var cfg struct {
			RopeScaling map[string]any `json:"rope_scaling"`
		}
		if err := json.Unmarshal(src.Config(), &cfg); err != nil {
			t.Fatal(err)
		}
		rs := cfg.RopeScaling
		if rs["rope_type"] != "llama3" || rs["factor"] != factor || rs["low_freq_factor"] != 1.0 ||
			rs["high_freq_factor"] != 4.0 || rs["original_max_position_embeddings"] != 8192.0 {
			t.Errorf("factor %v: rope_scaling %v", factor, rs)
		}
		src.Close()
	}
	// All ones: no scaling block.
	ones := make([]float32, 64)
	for i := range ones {
		ones[i] = 1
	}
	src, err := Open(build(ones))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(src.Config()), "rope_scaling") {
		t.Errorf("factors of 1 gave %s", src.Config())
	}
	src.Close()
	// Factors that are not Llama 3's (another original context) are refused
	// by name, not silently misapplied; so is a tensor of the wrong size.
	if _, err := Open(build(llama3Factors(500000, 128, 8, 1, 4, 4096))); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("foreign factors: %v", err)
	}
	if _, err := Open(build(ones[:10])); err == nil || !strings.Contains(err.Error(), "rope_freqs.weight") {
		t.Errorf("wrong size: %v", err)
	}
}

// TestGGUFGemma3SlidingMetadata: llama.cpp's gemma3 sliding-window keys
// become layer_types, sliding_window and rope_local_base_freq: no
// attention.sliding_window → every layer full; sliding_window_pattern as
// a period (default 6; 0: every layer slides) or as a bool per layer;
// rope.freq_base_swa; final_logit_softcapping passed on (for the engine to
// refuse by name).
func TestGGUFGemma3SlidingMetadata(t *testing.T) {
	const S, F = "sliding_attention", "full_attention"
	for _, tc := range []struct {
		name    string
		meta    func(b *ggufBuilder)
		types   []string
		window  any
		local   float64
		softcap any
		err     string
	}{
		{"no window", func(b *ggufBuilder) {}, []string{F, F, F, F, F, F, F}, nil, 10000, nil, ""},
		{"default period", func(b *ggufBuilder) { b.U32("gemma3.attention.sliding_window", 8) },
			[]string{S, S, S, S, S, F, S}, 8.0, 10000, nil, ""},
		{"period 3, swa base", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 16)
			b.U32("gemma3.attention.sliding_window_pattern", 3)
			b.F32("gemma3.rope.freq_base_swa", 5000)
		}, []string{S, S, F, S, S, F, S}, 16.0, 5000, nil, ""},
		{"period 0", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 8)
			b.U32("gemma3.attention.sliding_window_pattern", 0)
		}, []string{S, S, S, S, S, S, S}, 8.0, 10000, nil, ""},
		{"bools", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 8)
			b.Bools("gemma3.attention.sliding_window_pattern", []bool{true, false, true, false, false, true, true})
		}, []string{S, F, S, F, F, S, S}, 8.0, 10000, nil, ""},
		{"softcap", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 8)
			b.F32("gemma3.final_logit_softcapping", 30)
		}, []string{S, S, S, S, S, F, S}, 8.0, 10000, 30.0, ""},
		{"bools of the wrong length", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 8)
			b.Bools("gemma3.attention.sliding_window_pattern", []bool{true})
		}, nil, nil, 0, nil, "1 entries for 7 layers"},
		{"string pattern", func(b *ggufBuilder) {
			b.U32("gemma3.attention.sliding_window", 8)
			b.Str("gemma3.attention.sliding_window_pattern", "6")
		}, nil, nil, 0, nil, "neither a period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &ggufBuilder{}
			b.Str("general.architecture", "gemma3")
			for k, v := range map[string]uint32{"block_count": 7, "embedding_length": 8, "feed_forward_length": 32,
				"attention.head_count": 2, "attention.head_count_kv": 1} {
				b.U32("gemma3."+k, v)
			}
			tc.meta(b)
			g, err := ParseGGUF(b.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			s, err := newGGUFSource(g)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := json.Unmarshal(s.Config(), &cfg); err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, x := range cfg["layer_types"].([]any) {
				types = append(types, x.(string))
			}
			if !reflect.DeepEqual(types, tc.types) || cfg["sliding_window"] != tc.window ||
				cfg["rope_local_base_freq"] != tc.local || cfg["final_logit_softcapping"] != tc.softcap {
				t.Fatalf("layer_types %v sliding_window %v local base %v softcap %v", types, cfg["sliding_window"],
					cfg["rope_local_base_freq"], cfg["final_logit_softcapping"])
			}
		})
	}
}

// TestGGUFMXFP4ToMLX: a ggml MXFP4 block (E8M0 byte, then element j in the
// low nibble of byte j and element j+16 in its high nibble) becomes MLX's
// mxfp4 form: the same codes, element j of a U32 word at bits 4j..4j+3,
// and the same scale byte.
func TestGGUFMXFP4ToMLX(t *testing.T) {
	blk := make([]byte, 17)
	blk[0] = 130
	for j := 0; j < 16; j++ {
		blk[1+j] = byte(j) | byte(15-j)<<4 // element j = j, element j+16 = 15-j
	}
	w, sc, err := mxfp4ToMLX(blk, 1, 32)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc) != 1 || sc[0] != 130 || len(w) != 16 {
		t.Fatalf("scales %v, %d weight bytes", sc, len(w))
	}
	for e := 0; e < 32; e++ {
		word := binary.LittleEndian.Uint32(w[4*(e/8):])
		got := word >> (4 * (e % 8)) & 15
		want := uint32(e)
		if e >= 16 {
			want = uint32(15 - (e - 16))
		}
		if got != want {
			t.Fatalf("element %d: code %d, want %d", e, got, want)
		}
	}
	if _, _, err := mxfp4ToMLX(blk[:16], 1, 32); err == nil {
		t.Error("a short block was accepted")
	}
}

// TestGGUFGptOssNames: gpt-oss's GGUF tensors map onto mlx-lm's gpt_oss
// names (the sinks are a bare tensor).
func TestGGUFGptOssNames(t *testing.T) {
	_, gptoss, ok := engine.GGUFArchitecture("gpt-oss")
	if !ok {
		t.Fatal("gpt-oss has no GGUF layout")
	}
	for gguf, want := range map[string]string{
		"blk.3.attn_sinks.weight":          "model.layers.3.self_attn.sinks",
		"blk.3.attn_sinks.bias":            "",
		"blk.3.post_attention_norm.weight": "model.layers.3.post_attention_layernorm.weight",
		"blk.3.ffn_gate_inp.bias":          "model.layers.3.mlp.router.bias",
		"blk.3.ffn_down_exps.weight":       "model.layers.3.mlp.experts.down_proj.weight",
		"blk.3.ffn_up_exps.bias":           "model.layers.3.mlp.experts.up_proj.bias",
		"blk.3.attn_q.bias":                "model.layers.3.self_attn.q_proj.bias",
		"blk.x.attn_sinks.weight":          "",
	} {
		if got := hfNameArch(gptoss, gguf); got != want {
			t.Errorf("%s → %q, want %q", gguf, got, want)
		}
	}
}

// TestPermuteColBlocks: each row's column blocks are reordered, for any
// element size.
func TestPermuteColBlocks(t *testing.T) {
	b := []byte("abcdefgh" + "ABCDEFGH") // 2 rows, 4 blocks of 2 bytes
	if got := string(permuteColBlocks(b, 2, []int{2, 0, 3, 1})); got != "efabghcd"+"EFABGHCD" {
		t.Fatalf("got %q", got)
	}
}

// TestGGUFGptOssConfig: llama.cpp's gpt-oss metadata becomes gpt-oss's
// config (experts, SwiGLU limit 7, layers sliding by the period-2 default
// from the first, YaRN); a separate RoPE base for the sliding layers and
// scaling settings the engine lacks are refused by name.
func TestGGUFGptOssConfig(t *testing.T) {
	build := func(extra func(b *ggufBuilder)) *ggufBuilder {
		b := &ggufBuilder{}
		b.Str("general.architecture", "gpt-oss")
		for k, v := range map[string]uint32{"block_count": 4, "embedding_length": 8, "attention.head_count": 2,
			"attention.head_count_kv": 1, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
			"attention.sliding_window": 128, "rope.scaling.original_context_length": 4096} {
			b.U32("gpt-oss."+k, v)
		}
		b.Str("gpt-oss.rope.scaling.type", "yarn")
		b.F32("gpt-oss.rope.scaling.factor", 32)
		b.F32("gpt-oss.rope.freq_base", 150000)
		extra(b)
		return b
	}
	g, err := ParseGGUF(build(func(*ggufBuilder) {}).Bytes())
	if err != nil {
		t.Fatal(err)
	}
	s, err := newGGUFSource(g)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Arch     []string       `json:"architectures"`
		Experts  int            `json:"num_local_experts"`
		PerTok   int            `json:"num_experts_per_tok"`
		Inter    int            `json:"intermediate_size"`
		Limit    float64        `json:"swiglu_limit"`
		Types    []string       `json:"layer_types"`
		Window   int            `json:"sliding_window"`
		Scaling  map[string]any `json:"rope_scaling"`
		RopeBase float64        `json:"rope_theta"`
	}
	if err := json.Unmarshal(s.Config(), &cfg); err != nil {
		t.Fatal(err)
	}
	want := []string{"sliding_attention", "full_attention", "sliding_attention", "full_attention"}
	if cfg.Arch[0] != "GptOssForCausalLM" || cfg.Experts != 4 || cfg.PerTok != 2 || cfg.Inter != 32 || cfg.Limit != 7 ||
		!reflect.DeepEqual(cfg.Types, want) || cfg.Window != 128 || cfg.RopeBase != 150000 ||
		cfg.Scaling["rope_type"] != "yarn" || cfg.Scaling["factor"] != 32.0 || cfg.Scaling["original_max_position_embeddings"] != 4096.0 {
		t.Fatalf("config %+v", cfg)
	}
	for _, tc := range []struct {
		extra func(b *ggufBuilder)
		err   string
	}{
		{func(b *ggufBuilder) { b.F32("gpt-oss.rope.freq_base_swa", 10000) }, "rope.freq_base_swa"},
		{func(b *ggufBuilder) { b.F32("gpt-oss.rope.scaling.attn_factor", 2) }, "rope.scaling.attn_factor"},
		{func(b *ggufBuilder) { b.F32("gpt-oss.rope.scaling.yarn_log_multiplier", 0.1) }, "yarn_log_multiplier"},
	} {
		g, err := ParseGGUF(build(tc.extra).Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newGGUFSource(g); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("error %v, want one naming %s", err, tc.err)
		}
	}
}

// TestGGUFQwen3NextLayerKinds: attention.recurrent_layers (a bool per
// layer) or full_attention_interval (default 4) give the layer kinds; a
// pattern no interval gives is refused.
func TestGGUFQwen3NextLayerKinds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		extra    func(b *ggufBuilder)
		interval any
		err      string
	}{
		{"default", func(b *ggufBuilder) {}, 4.0, ""},
		{"interval", func(b *ggufBuilder) { b.U32("qwen3next.full_attention_interval", 2) }, 2.0, ""},
		{"bools", func(b *ggufBuilder) {
			b.Bools("qwen3next.attention.recurrent_layers", []bool{true, true, false, true, true, false, true, true})
		}, 3.0, ""},
		{"irregular", func(b *ggufBuilder) {
			b.Bools("qwen3next.attention.recurrent_layers", []bool{true, false, false, true, true, false, true, true})
		}, nil, "do not repeat"},
		{"short", func(b *ggufBuilder) { b.Bools("qwen3next.attention.recurrent_layers", []bool{true}) }, nil, "a bool per layer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &ggufBuilder{}
			b.Str("general.architecture", "qwen3next")
			for k, v := range map[string]uint32{"block_count": 8, "embedding_length": 8, "attention.head_count": 2,
				"attention.head_count_kv": 1, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
				"ssm.conv_kernel": 4, "ssm.state_size": 4, "ssm.group_count": 1, "ssm.time_step_rank": 2, "ssm.inner_size": 8} {
				b.U32("qwen3next."+k, v)
			}
			tc.extra(b)
			g, err := ParseGGUF(b.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			s, err := newGGUFSource(g)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := json.Unmarshal(s.Config(), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg["full_attention_interval"] != tc.interval || cfg["linear_value_head_dim"] != 4.0 || cfg["partial_rotary_factor"] != 1.0 {
				t.Fatalf("interval %v, value head dim %v, partial rotary %v", cfg["full_attention_interval"], cfg["linear_value_head_dim"], cfg["partial_rotary_factor"])
			}
		})
	}
}
