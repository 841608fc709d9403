package engine_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// memSource is an in-memory engine.Source for tiny random models, with a
// float64 copy of every weight (as the model will see it after dtype
// rounding or quantization) for the reference forward pass below.
type memSource struct {
	cfg     []byte
	tensors map[string]engine.Tensor
	quant   map[string]engine.QuantSpec
	ref     map[string][]float64
	vocab   []string
}

func (s *memSource) Tensor(name string) (engine.Tensor, error) {
	t, ok := s.tensors[name]
	if !ok {
		return engine.Tensor{}, fmt.Errorf("%s: %w", name, engine.ErrNotFound)
	}
	return t, nil
}
func (s *memSource) Names() []string {
	var n []string
	for k := range s.tensors {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}
func (s *memSource) Quant(p string) engine.QuantSpec { return s.quant[p] }
func (s *memSource) Config() []byte                  { return s.cfg }
func (s *memSource) Vocab() ([]string, error)        { return s.vocab, nil }
func (s *memSource) Close() error                    { return nil }

type tinySpec struct {
	arch     string // HF architecture name
	dt       engine.DType
	bits, gs int
	tied     bool
	rope     map[string]any
	window   int // sliding_window (MistralForCausalLM): every layer sees its last window positions
	// windowFrom: Qwen2 with use_sliding_window: layers ≥ windowFrom
	// (max_window_layers) slide, the others are full.
	windowFrom int
}

const (
	tD, tH, tKV, tDh, tF, tV, tLayers = 64, 4, 2, 16, 128, 96, 2
)

// bf16Round is f rounded to bfloat16 (nearest even), as a float32.
func bf16Round(f float32) float32 { return half.BF16ToF32(half.F32ToBF16(f)) }

func newTiny(t testing.TB, s tinySpec, seed uint64) *memSource {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	src := &memSource{tensors: map[string]engine.Tensor{}, quant: map[string]engine.QuantSpec{}, ref: map[string][]float64{}}
	for i := range tV {
		src.vocab = append(src.vocab, fmt.Sprintf("tok%d", i))
	}
	cfg := map[string]any{
		"architectures": []string{s.arch}, "hidden_size": tD, "intermediate_size": tF,
		"num_hidden_layers": tLayers, "num_attention_heads": tH, "num_key_value_heads": tKV,
		"head_dim": tDh, "vocab_size": tV, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
		"rope_theta": 10000.0, "tie_word_embeddings": s.tied, "torch_dtype": s.dt.String(),
	}
	if s.rope != nil {
		cfg["rope_scaling"] = s.rope
	}
	if s.window > 0 {
		cfg["sliding_window"] = s.window
		if s.arch == "Qwen2ForCausalLM" {
			cfg["use_sliding_window"], cfg["max_window_layers"] = true, s.windowFrom
		}
	}
	if s.bits > 0 {
		cfg["quantization"] = map[string]int{"bits": s.bits, "group_size": s.gs}
	}
	src.cfg, _ = json.Marshal(cfg)

	dense := func(name string, shape []int, std float64, offset float64) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		ref := make([]float64, n)
		var data []byte
		switch s.dt {
		case engine.F32:
			data = make([]byte, 4*n)
			for i := range n {
				v := float32(offset + std*r.NormFloat64())
				binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
				ref[i] = float64(v)
			}
		case engine.BF16:
			data = make([]byte, 2*n)
			for i := range n {
				v := bf16Round(float32(offset + std*r.NormFloat64()))
				binary.LittleEndian.PutUint16(data[2*i:], uint16(math.Float32bits(v)>>16))
				ref[i] = float64(v)
			}
		}
		src.tensors[name] = engine.Tensor{Name: name, DType: s.dt, Shape: shape, Data: data}
		src.ref[name] = ref
	}
	linear := func(prefix string, out, in int, bias bool) {
		if s.bits == 0 {
			dense(prefix+".weight", []int{out, in}, 0.3/math.Sqrt(float64(in))*3, 0)
		} else {
			per := 32 / s.bits
			ng := in / s.gs
			words := make([]byte, 4*out*in/per)
			sc := make([]byte, 2*out*ng)
			bi := make([]byte, 2*out*ng)
			ref := make([]float64, out*in)
			levels := 1<<s.bits - 1
			for o := range out {
				for g := range ng {
					sh := half.F32ToF16(float32(0.9 / math.Sqrt(float64(in)) * 2 / float64(levels) * (0.5 + r.Float64())))
					bh := half.F32ToF16(float32(-0.9 / math.Sqrt(float64(in)) * (0.5 + r.Float64())))
					binary.LittleEndian.PutUint16(sc[2*(o*ng+g):], sh)
					binary.LittleEndian.PutUint16(bi[2*(o*ng+g):], bh)
					for k := range s.gs {
						idx := o*in + g*s.gs + k
						q := uint32(r.IntN(levels + 1))
						w := binary.LittleEndian.Uint32(words[4*(idx/per):])
						w |= q << (uint(idx%per) * uint(s.bits))
						binary.LittleEndian.PutUint32(words[4*(idx/per):], w)
						ref[idx] = float64(half.F16ToF32(sh)*float32(q) + half.F16ToF32(bh))
					}
				}
			}
			src.tensors[prefix+".weight"] = engine.Tensor{Name: prefix + ".weight", DType: engine.U32, Shape: []int{out, in / per}, Data: words}
			src.tensors[prefix+".scales"] = engine.Tensor{Name: prefix + ".scales", DType: engine.F16, Shape: []int{out, ng}, Data: sc}
			src.tensors[prefix+".biases"] = engine.Tensor{Name: prefix + ".biases", DType: engine.F16, Shape: []int{out, ng}, Data: bi}
			src.quant[prefix] = engine.QuantSpec{Bits: s.bits, GroupSize: s.gs}
			src.ref[prefix+".weight"] = ref
		}
		if bias {
			dense(prefix+".bias", []int{out}, 0.1, 0)
		}
	}
	qwen2 := s.arch == "Qwen2ForCausalLM"
	qwen3 := s.arch == "Qwen3ForCausalLM"
	linear("model.embed_tokens", tV, tD, false)
	if !s.tied {
		linear("lm_head", tV, tD, false)
	}
	dense("model.norm.weight", []int{tD}, 0.1, 1)
	for i := range tLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		dense(p+"input_layernorm.weight", []int{tD}, 0.1, 1)
		dense(p+"post_attention_layernorm.weight", []int{tD}, 0.1, 1)
		linear(p+"self_attn.q_proj", tH*tDh, tD, qwen2)
		linear(p+"self_attn.k_proj", tKV*tDh, tD, qwen2)
		linear(p+"self_attn.v_proj", tKV*tDh, tD, qwen2)
		linear(p+"self_attn.o_proj", tD, tH*tDh, false)
		linear(p+"mlp.gate_proj", tF, tD, false)
		linear(p+"mlp.up_proj", tF, tD, false)
		linear(p+"mlp.down_proj", tD, tF, false)
		if qwen3 {
			dense(p+"self_attn.q_norm.weight", []int{tDh}, 0.1, 1)
			dense(p+"self_attn.k_norm.weight", []int{tDh}, 0.1, 1)
		}
	}
	return src
}

// refForward is an independent float64 implementation of the HF
// Llama/Qwen2/Qwen3 forward pass over the whole sequence, returning the last
// position's logits. cacheRound rounds K and V as the cache stores them.
func refForward(src *memSource, s tinySpec, tokens []int32, cacheRound func(float64) float64) []float64 {
	w := src.ref
	L := len(tokens)
	rms := func(x []float64, g []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+1e-5)
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = v * inv * g[i]
		}
		return out
	}
	lin := func(x []float64, name string, out int, bias string) []float64 {
		W := w[name]
		in := len(x)
		y := make([]float64, out)
		for j := range out {
			var acc float64
			for k := range in {
				acc += x[k] * W[j*in+k]
			}
			if bias != "" {
				acc += w[bias][j]
			}
			y[j] = acc
		}
		return y
	}
	var scaling engine.RoPEScaling
	if s.rope != nil {
		c, _ := engine.ParseConfig(src.cfg)
		scaling = c.RoPE.Scale
	}
	inv, attnF, _ := engine.RoPEFrequencies(&engine.RoPE{Dims: tDh, Base: 10000, Scale: scaling}, tDh)
	rope := func(x []float64, pos int) {
		for j := range tDh / 2 {
			th := float64(float32(pos) * inv[j])
			c, sn := math.Cos(th)*float64(attnF), math.Sin(th)*float64(attnF)
			a, b := x[j], x[j+tDh/2]
			x[j], x[j+tDh/2] = a*c-b*sn, b*c+a*sn
		}
	}
	emb := w["model.embed_tokens.weight"]
	xs := make([][]float64, L)
	for i, t := range tokens {
		xs[i] = slices.Clone(emb[int(t)*tD : (int(t)+1)*tD])
	}
	qwen2 := s.arch == "Qwen2ForCausalLM"
	qwen3 := s.arch == "Qwen3ForCausalLM"
	for l := range tLayers {
		p := fmt.Sprintf("model.layers.%d.", l)
		b := func(n string) string {
			if qwen2 {
				return p + n + ".bias"
			}
			return ""
		}
		qs, ks, vs := make([][]float64, L), make([][]float64, L), make([][]float64, L)
		for i := range L {
			h := rms(xs[i], w[p+"input_layernorm.weight"])
			qs[i] = lin(h, p+"self_attn.q_proj.weight", tH*tDh, b("self_attn.q_proj"))
			ks[i] = lin(h, p+"self_attn.k_proj.weight", tKV*tDh, b("self_attn.k_proj"))
			vs[i] = lin(h, p+"self_attn.v_proj.weight", tKV*tDh, b("self_attn.v_proj"))
			for hh := range tH {
				q := qs[i][hh*tDh : (hh+1)*tDh]
				if qwen3 {
					copy(q, rms(q, w[p+"self_attn.q_norm.weight"]))
				}
				rope(q, i)
			}
			for hh := range tKV {
				k := ks[i][hh*tDh : (hh+1)*tDh]
				if qwen3 {
					copy(k, rms(k, w[p+"self_attn.k_norm.weight"]))
				}
				rope(k, i)
			}
			for j := range ks[i] {
				ks[i][j] = cacheRound(ks[i][j])
				vs[i][j] = cacheRound(vs[i][j])
			}
		}
		for i := range L {
			att := make([]float64, tH*tDh)
			for hh := range tH {
				kh := hh / (tH / tKV)
				sc := make([]float64, i+1)
				m := math.Inf(-1)
				for t := 0; t <= i; t++ {
					if s.window > 0 && l >= s.windowFrom && t <= i-s.window {
						sc[t] = math.Inf(-1) // outside the sliding window
						continue
					}
					var d float64
					for e := range tDh {
						d += qs[i][hh*tDh+e] * ks[t][kh*tDh+e]
					}
					sc[t] = d / math.Sqrt(tDh)
					m = math.Max(m, sc[t])
				}
				var sum float64
				for t := range sc {
					sc[t] = math.Exp(sc[t] - m)
					sum += sc[t]
				}
				for t := range sc {
					for e := range tDh {
						att[hh*tDh+e] += sc[t] / sum * vs[t][kh*tDh+e]
					}
				}
			}
			o := lin(att, p+"self_attn.o_proj.weight", tD, "")
			for j := range o {
				xs[i][j] += o[j]
			}
			h := rms(xs[i], w[p+"post_attention_layernorm.weight"])
			g := lin(h, p+"mlp.gate_proj.weight", tF, "")
			u := lin(h, p+"mlp.up_proj.weight", tF, "")
			for j := range g {
				g[j] = g[j] / (1 + math.Exp(-g[j])) * u[j]
			}
			d := lin(g, p+"mlp.down_proj.weight", tD, "")
			for j := range d {
				xs[i][j] += d[j]
			}
		}
	}
	h := rms(xs[L-1], w["model.norm.weight"])
	head := "lm_head.weight"
	if s.tied {
		head = "model.embed_tokens.weight"
	}
	return lin(h, head, tV, "")
}

func maxMinusMin(v []float32) float32 {
	return slices.Max(v) - slices.Min(v)
}

func cosine(a []float32, b []float64) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * b[i]
		aa += float64(a[i]) * float64(a[i])
		bb += b[i] * b[i]
	}
	return ab / math.Sqrt(aa*bb)
}

func load(t testing.TB, src engine.Source, opts engine.LoadOptions) *engine.Model {
	t.Helper()
	m, err := engine.LoadSource(context.Background(), src, cpu.New(2), opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var prompt = []int32{1, 17, 42, 5, 88, 23, 9, 60, 3, 71, 12}

func TestTinyModelsMatchReference(t *testing.T) {
	identity := func(v float64) float64 { return v }
	bf16 := func(v float64) float64 { return float64(bf16Round(float32(v))) }
	for _, arch := range []string{"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"} {
		for _, c := range []struct {
			name     string
			dt       engine.DType
			bits, gs int
			minCos   float64
		}{
			{"f32", engine.F32, 0, 0, 0.999999},
			{"bf16", engine.BF16, 0, 0, 0.9999},
			{"q4g32", engine.BF16, 4, 32, 0.9999},
			{"q4g64", engine.F32, 4, 64, 0.999999},
			{"q8g32", engine.F32, 8, 32, 0.999999},
		} {
			t.Run(arch+"/"+c.name, func(t *testing.T) {
				spec := tinySpec{arch: arch, dt: c.dt, bits: c.bits, gs: c.gs, tied: arch == "LlamaForCausalLM"}
				src := newTiny(t, spec, 7)
				m := load(t, src, engine.LoadOptions{})
				round := identity
				if m.Info().CacheDType == engine.BF16 {
					round = bf16
				}
				logits, err := m.Forward(context.Background(), m.NewCache(), prompt)
				if err != nil {
					t.Fatal(err)
				}
				want := refForward(src, spec, prompt, round)
				if spread := maxMinusMin(logits); spread < 0.5 {
					t.Fatalf("degenerate logits (spread %v): the comparison would prove nothing", spread)
				}
				if cs := cosine(logits, want); cs < c.minCos {
					t.Fatalf("cosine to reference %.7f < %v", cs, c.minCos)
				}
			})
		}
	}
}

func TestRoPEScalingVariantsMatchReference(t *testing.T) {
	for _, rope := range []map[string]any{
		{"type": "linear", "factor": 2.0},
		{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
		{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
	} {
		spec := tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, rope: rope}
		src := newTiny(t, spec, 11)
		m := load(t, src, engine.LoadOptions{})
		logits, err := m.Forward(context.Background(), m.NewCache(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		if cs := cosine(logits, refForward(src, spec, prompt, func(v float64) float64 { return v })); cs < 0.999999 {
			t.Fatalf("%v: cosine %v", rope, cs)
		}
	}
}

func greedy(t testing.TB, m *engine.Model, c engine.KVCache, last int32, n int) []int32 {
	t.Helper()
	var out []int32
	tok := last
	for range n {
		logits, err := m.Forward(context.Background(), c, []int32{tok})
		if err != nil {
			t.Fatal(err)
		}
		tok = int32(argmax(logits))
		out = append(out, tok)
	}
	return out
}

func argmax(v []float32) int {
	b := 0
	for i, x := range v {
		if x > v[b] {
			b = i
		}
	}
	return b
}

// TestKVExportImport: decoding after importing exported KV (into a fresh
// cache, and on top of a locally computed prefix) gives exactly the tokens
// of decoding after local prefill, for every cache dtype.
func TestKVExportImport(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []engine.DType{engine.F32, engine.F16, engine.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			spec := tinySpec{arch: "Qwen3ForCausalLM", dt: engine.F32}
			m := load(t, newTiny(t, spec, 3), engine.LoadOptions{CacheDType: dt})
			body, last := prompt[:len(prompt)-1], prompt[len(prompt)-1]

			local := m.NewCache()
			if err := m.Prefill(ctx, local, body, 4, nil); err != nil {
				t.Fatal(err)
			}
			want := greedy(t, m, local, last, 8)

			for _, startPos := range []int{0, 3} {
				src := m.NewCache()
				if err := m.Prefill(ctx, src, body, 0, nil); err != nil {
					t.Fatal(err)
				}
				dst := m.NewCache()
				if startPos > 0 {
					if err := m.Prefill(ctx, dst, body[:startPos], 0, nil); err != nil {
						t.Fatal(err)
					}
				}
				// Ship in two chunks per layer, as the wire does.
				n := len(body) - startPos
				for _, part := range [][2]int{{startPos, n / 2}, {startPos + n/2, n - n/2}} {
					for l := range m.Info().Layers {
						k, v, err := src.Export(l, part[0], part[1])
						if err != nil {
							t.Fatal(err)
						}
						if err := dst.Import(l, part[0], part[1], k, v); err != nil {
							t.Fatal(err)
						}
					}
				}
				if dst.Len() != startPos {
					t.Fatalf("Len moved to %d before Commit", dst.Len())
				}
				if err := dst.Commit(len(body)); err != nil {
					t.Fatal(err)
				}
				got := greedy(t, m, dst, last, 8)
				if !slices.Equal(got, want) {
					t.Fatalf("start_pos %d: imported KV decodes %v, local %v", startPos, got, want)
				}
			}
		})
	}
}

func TestKVImportErrors(t *testing.T) {
	m := load(t, newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 3), engine.LoadOptions{})
	c := m.NewCache()
	if err := c.Import(0, 2, 1, nil, nil); err == nil {
		t.Fatal("import leaving a gap succeeded")
	}
	if err := c.Import(0, 0, 1, []byte{1}, []byte{1}); err == nil {
		t.Fatal("import of short bytes succeeded")
	}
	if err := c.Commit(1); err == nil {
		t.Fatal("commit past the imported extent succeeded")
	}
	if _, _, err := c.Export(0, 0, 1); err == nil {
		t.Fatal("export past Len succeeded")
	}
}

// TestChunkedPrefillEqualsOneShot: the KV of a prompt is the same bytes
// whatever the chunk size (including chunks of 1 and 2 tokens, which take
// the fused quantized decode kernel), and onChunk sees every chunk.
func TestChunkedPrefillEqualsOneShot(t *testing.T) {
	ctx := context.Background()
	for _, spec := range []tinySpec{
		{arch: "LlamaForCausalLM", dt: engine.F32, tied: true},
		{arch: "Qwen2ForCausalLM", dt: engine.BF16, bits: 4, gs: 32},
		{arch: "Qwen3ForCausalLM", dt: engine.F32, bits: 8, gs: 64},
	} {
		m := load(t, newTiny(t, spec, 5), engine.LoadOptions{})
		one := m.NewCache()
		if err := m.Prefill(ctx, one, prompt, 0, nil); err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []int{1, 2, 4} {
			chunked := m.NewCache()
			var calls [][2]int
			if err := m.Prefill(ctx, chunked, prompt, chunk, func(s, n int) error {
				calls = append(calls, [2]int{s, n})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var want [][2]int
			for s := 0; s < len(prompt); s += chunk {
				want = append(want, [2]int{s, min(chunk, len(prompt)-s)})
			}
			if !slices.Equal(calls, want) {
				t.Fatalf("onChunk calls %v, want %v", calls, want)
			}
			for l := range m.Info().Layers {
				k1, v1, _ := one.Export(l, 0, len(prompt))
				k2, v2, _ := chunked.Export(l, 0, len(prompt))
				if string(k1) != string(k2) || string(v1) != string(v2) {
					t.Fatalf("%s q%d: layer %d KV differs between chunks of %d and one-shot prefill", spec.arch, spec.bits, l, chunk)
				}
			}
		}
	}
}

func TestPrefillStopsOnCallbackError(t *testing.T) {
	m := load(t, newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 3), engine.LoadOptions{})
	c := m.NewCache()
	stop := errors.New("stop")
	err := m.Prefill(context.Background(), c, prompt, 4, func(s, n int) error { return stop })
	if !errors.Is(err, stop) || c.Len() != 4 {
		t.Fatalf("err %v, Len %d", err, c.Len())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Prefill(ctx, m.NewCache(), prompt, 4, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled prefill: %v", err)
	}
}

func TestForwardErrorsAreReturned(t *testing.T) {
	m := load(t, newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 3), engine.LoadOptions{})
	c := m.NewCache()
	if _, err := m.Forward(context.Background(), c, []int32{tV + 5}); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Fatalf("out-of-vocabulary token: %v", err)
	}
	other := cpu.New(1).NewKVCache(engine.CacheGeometry{Layers: 1, KVHeads: 1, HeadDim: 2}, engine.F32)
	if _, err := m.Forward(context.Background(), other, []int32{1}); err == nil {
		t.Fatal("forward with a foreign cache geometry succeeded")
	}
	if c.Len() != 0 {
		t.Fatalf("failed forward left %d tokens", c.Len())
	}
}

func TestLoadErrorsNameTheLayer(t *testing.T) {
	src := newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 3)
	delete(src.tensors, "model.layers.1.mlp.up_proj.weight")
	_, err := engine.LoadSource(context.Background(), src, cpu.New(1), engine.LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "layer 1") || !strings.Contains(err.Error(), "up_proj") || !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("error %v", err)
	}
	src = newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 3)
	bad := src.tensors["model.layers.0.self_attn.k_proj.weight"]
	bad.Shape = []int{bad.Shape[1], bad.Shape[0]}
	src.tensors["model.layers.0.self_attn.k_proj.weight"] = bad
	if _, err := engine.LoadSource(context.Background(), src, cpu.New(1), engine.LoadOptions{}); err == nil || !strings.Contains(err.Error(), "layer 0") {
		t.Fatalf("error %v", err)
	}
}

func TestFingerprint(t *testing.T) {
	a := load(t, newTiny(t, tinySpec{arch: "Qwen3ForCausalLM", dt: engine.F32}, 1), engine.LoadOptions{})
	b := load(t, newTiny(t, tinySpec{arch: "Qwen3ForCausalLM", dt: engine.BF16, bits: 4, gs: 32}, 2), engine.LoadOptions{})
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatal("same geometry and vocabulary in another dtype/quantization: fingerprints differ")
	}
	c := newTiny(t, tinySpec{arch: "Qwen3ForCausalLM", dt: engine.F32}, 1)
	c.vocab[5] = "changed"
	if load(t, c, engine.LoadOptions{}).Fingerprint() == a.Fingerprint() {
		t.Fatal("a different vocabulary gives the same fingerprint")
	}
	d := load(t, newTiny(t, tinySpec{arch: "Qwen2ForCausalLM", dt: engine.F32}, 1), engine.LoadOptions{})
	if d.Fingerprint() == a.Fingerprint() {
		t.Fatal("another architecture family gives the same fingerprint")
	}
}

func TestConfigValidation(t *testing.T) {
	base := `"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":10`
	for _, c := range []struct{ json, field string }{
		{`{` + base + `}`, ""},
		{`{"hidden_size":64}`, "architectures"},
		{`{` + strings.Replace(base, `"hidden_size":64,`, ``, 1) + `}`, "hidden_size: missing"},
		{`{` + base + `,"num_key_value_heads":3}`, "num_key_value_heads"},
		{`{` + base + `,"rope_scaling":{"rope_type":"llama3","factor":8}}`, "original_max_position_embeddings"},
		{`{` + base + `,"rope_scaling":{"rope_type":"dynamic","factor":2}}`, "rope_type"},
		{`{` + base + `,"rope_scaling":{"rope_type":"linear","factor":2,"truncate":false}}`, "rope_scaling.truncate"},
		{`{` + base + `,"quantization":{"bits":3,"group_size":64}}`, "quantization.bits"},
		{`{` + base + `,"torch_dtype":"int8"}`, "torch_dtype"},
		{`{` + strings.Replace(base, `"num_attention_heads":4`, `"num_attention_heads":0`, 1) + `}`, "num_attention_heads"},
	} {
		cfg, err := engine.ParseConfig([]byte(c.json))
		if c.field == "" {
			if err != nil || cfg.KVHeads != 4 || cfg.HeadDim != 16 || cfg.RoPE.Base != 10000 || cfg.RMSNormEps != 1e-6 {
				t.Fatalf("defaults: %+v %v", cfg, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, engine.ErrConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v, want one naming %q", c.json, err, c.field)
		}
	}
	for _, c := range []struct {
		extra string
		no    bool
	}{{``, false}, {`,"truncate":true`, false}, {`,"truncate":false`, true}} {
		cfg, err := engine.ParseConfig([]byte(`{` + base + `,"rope_scaling":{"rope_type":"yarn","factor":32,"original_max_position_embeddings":4096` + c.extra + `}}`))
		if err != nil || cfg.RoPE.Scale.NoTruncate != c.no {
			t.Errorf("yarn%s: NoTruncate %v (%v), want %v", c.extra, cfg != nil && cfg.RoPE.Scale.NoTruncate, err, c.no)
		}
	}
	if _, err := engine.ParseConfig([]byte(`{` + strings.Replace(base, "Llama", "Gpt2", 1) + `}`)); err != nil {
		t.Fatal(err) // parsing accepts any name; Load rejects unknown ones
	}
	src := newTiny(t, tinySpec{arch: "LlamaForCausalLM", dt: engine.F32, tied: true}, 1)
	src.cfg = []byte(strings.Replace(string(src.cfg), "LlamaForCausalLM", "GPT2LMHeadModel", 1))
	if _, err := engine.LoadSource(context.Background(), src, cpu.New(1), engine.LoadOptions{}); err == nil || !strings.Contains(err.Error(), "Qwen3ForCausalLM") {
		t.Fatalf("unknown architecture: %v", err)
	}
}

// TestConcurrentRequests: goroutines using one Model with their own caches
// (as a runner serving several requests) get the results they would get
// alone (run with -race to check the locking).
func TestConcurrentRequests(t *testing.T) {
	m := load(t, newTiny(t, tinySpec{arch: "Qwen2ForCausalLM", dt: engine.BF16, bits: 4, gs: 32}, 9), engine.LoadOptions{})
	want := greedy(t, m, prefilled(t, m), prompt[len(prompt)-1], 6)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			c := m.NewCache()
			if err := m.Prefill(context.Background(), c, prompt[:len(prompt)-1], 3, nil); err != nil {
				errs <- err
				return
			}
			tok := prompt[len(prompt)-1]
			for i := range 6 {
				logits, err := m.Forward(context.Background(), c, []int32{tok})
				if err != nil {
					errs <- err
					return
				}
				tok = int32(argmax(logits))
				if tok != want[i] {
					errs <- fmt.Errorf("step %d: %d, want %d", i, tok, want[i])
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func prefilled(t *testing.T, m *engine.Model) engine.KVCache {
	c := m.NewCache()
	if err := m.Prefill(context.Background(), c, prompt[:len(prompt)-1], 0, nil); err != nil {
		t.Fatal(err)
	}
	return c
}
