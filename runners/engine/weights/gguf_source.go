package weights

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// ggufLayerNames maps the per-block GGUF tensor stems to HF module paths
// (under model.layers.N.).
var ggufLayerNames = map[string]string{
	"attn_q":      "self_attn.q_proj",
	"attn_k":      "self_attn.k_proj",
	"attn_v":      "self_attn.v_proj",
	"attn_output": "self_attn.o_proj",
	"attn_q_norm": "self_attn.q_norm",
	"attn_k_norm": "self_attn.k_norm",
	"ffn_gate":    "mlp.gate_proj",
	"ffn_up":      "mlp.up_proj",
	"ffn_down":    "mlp.down_proj",
	"attn_norm":   "input_layernorm",
	"ffn_norm":    "post_attention_layernorm",
	// Mixture of experts: the router, and the experts stacked [E, out, in]
	// as mlx-lm's switch_mlp holds them.
	"ffn_gate_inp":  "mlp.gate",
	"ffn_gate_exps": "mlp.switch_mlp.gate_proj",
	"ffn_up_exps":   "mlp.switch_mlp.up_proj",
	"ffn_down_exps": "mlp.switch_mlp.down_proj",
}

// hfNameArch is hfName with the architecture's own block stems.
func hfNameArch(lay *engine.GGUFLayout, gguf string) string {
	if names := lay.LayerNames; names != nil {
		if rest, ok := strings.CutPrefix(gguf, "blk."); ok {
			if num, rest, ok := strings.Cut(rest, "."); ok {
				if stem, suffix, ok := strings.Cut(rest, "."); ok && (suffix == "weight" || suffix == "bias") {
					if mod, ok := names[stem]; ok {
						if _, err := strconv.Atoi(num); err != nil {
							return ""
						}
						if lay.TensorStems[stem] {
							if suffix != "weight" {
								return ""
							}
							return "model.layers." + num + "." + mod
						}
						return "model.layers." + num + "." + mod + "." + suffix
					}
				}
			}
		}
	}
	return hfName(gguf)
}

// hfName returns the HF name of a GGUF tensor ("" when it has none).
func hfName(gguf string) string {
	switch gguf {
	case "token_embd.weight":
		return "model.embed_tokens.weight"
	case "output_norm.weight":
		return "model.norm.weight"
	case "output.weight":
		return "lm_head.weight"
	}
	rest, ok := strings.CutPrefix(gguf, "blk.")
	if !ok {
		return ""
	}
	num, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	if _, err := strconv.Atoi(num); err != nil {
		return ""
	}
	stem, suffix, ok := strings.Cut(rest, ".")
	if !ok || (suffix != "weight" && suffix != "bias") {
		return ""
	}
	mod, ok := ggufLayerNames[stem]
	if !ok {
		return ""
	}
	return "model.layers." + num + "." + mod + "." + suffix
}

// ggufEntry says where an HF-named tensor comes from.
type ggufEntry struct {
	src   string // GGUF tensor name
	part  int    // partDense, partW, partScales, partBiases
	heads int    // > 0: undo llama.cpp's Q/K row permutation with this many heads
	// minusOne: a Gemma norm weight stored as 1 + w; read back as w (the
	// engine adds the 1 as for HF weights; exact for |1 + w| < 2^24).
	minusOne bool
	// negLog: stored as -exp(x) (Qwen3-Next's ssm_a); read back as x =
	// log(-v) (F32 only).
	negLog bool
	// rows, when set, picks these rows (of the HF [out, in] matrix), in
	// this order: one GGUF tensor split into several HF ones.
	rows []int
	// shape, when set, is the HF shape of a dense tensor whose GGUF
	// dims are another view of the same data.
	shape []int
	// colBlocks, when set, reorders the columns in len(colBlocks) equal
	// blocks: block i of the result is block colBlocks[i] of the file.
	colBlocks []int
	// f32Scales: the scales and biases of a quantized tensor given as F32
	// (exact): the embedding table, which backends dequantize to its
	// scales' type (MLX), and llama.cpp's models compute in float32.
	f32Scales bool
	// dequant: a quantized tensor given as F32 (its column blocks are
	// narrower than the 32-element groups; exact for the 4- and 8-bit
	// forms, whose scale·q + bias is exact in float32).
	dequant bool
}

const (
	partDense = iota
	partW
	partScales
	partBiases
)

// ggufSource presents a GGUF file as an engine.Source in HF naming.
type ggufSource struct {
	g       *GGUF
	config  []byte
	names   []string
	entries map[string]ggufEntry
	quant   map[string]engine.QuantSpec // by HF module prefix

	mu        sync.Mutex
	lastSrc   string
	lastParts [3][]byte // W, scales, biases of lastSrc

	q3n *qwen3nextLayout // qwen3next's layer kinds
}

// OpenGGUFSource opens a GGUF file as an engine.Source: tensors renamed to
// HF names with HF shapes, llama Q/K rows un-permuted, quantized types
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) converted to MLX affine
// packing (group 32, F16 scales and biases), and a config.json synthesized
// from the metadata.
func OpenGGUFSource(path string) (engine.Source, error) {
	g, err := OpenGGUF(path)
	if err != nil {
		return nil, err
	}
	s, err := newGGUFSource(g)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("gguf %s: %w", path, err)
	}
	return s, nil
}

func newGGUFSource(g *GGUF) (*ggufSource, error) {
	arch, _ := g.String("general.architecture")
	hfArch, lay, ok := engine.GGUFArchitecture(arch)
	if !ok {
		return nil, fmt.Errorf("unsupported general.architecture %q (supported: %s)", arch, strings.Join(engine.GGUFArchitectures(), ", "))
	}
	var q3n *qwen3nextLayout
	if lay.DeltaNetTensors {
		var err error
		if q3n, err = newQwen3nextLayout(g, lay); err != nil {
			return nil, err
		}
	}
	heads, _ := g.Uint(arch + ".attention.head_count")
	kvHeads, ok := g.Uint(arch + ".attention.head_count_kv")
	if !ok {
		kvHeads = heads
	}
	s := &ggufSource{g: g, entries: map[string]ggufEntry{}, quant: map[string]engine.QuantSpec{}, q3n: q3n}
	for _, t := range g.tensors {
		targets := []ggufTarget{{hfNameArch(lay, t.Name), ggufEntry{src: t.Name}}}
		if q3n != nil {
			var err error
			if targets, err = q3n.targets(t); err != nil {
				return nil, err
			}
		}
		for _, tg := range targets {
			if err := s.addTarget(lay, t, tg.name, tg.e, heads, kvHeads); err != nil {
				return nil, err
			}
		}
	}
	sort.Strings(s.names)
	cfg, err := synthesizeConfig(g, hfArch, lay, s)
	if err != nil {
		return nil, err
	}
	s.config = cfg
	return s, nil
}

// ggufTarget is one HF-named tensor made from a GGUF tensor.
type ggufTarget struct {
	name string
	e    ggufEntry
}

// addTarget adds the HF tensor name (with its quantized parts) made from
// the GGUF tensor t.
func (s *ggufSource) addTarget(lay *engine.GGUFLayout, t TensorInfo, name string, e ggufEntry, heads, kvHeads uint64) error {
	if name == "" {
		name = t.Name // kept under its GGUF name (e.g. rope_freqs.weight)
	}
	if (e.negLog || e.shape != nil) && t.Type != TypeF32 && t.Type != TypeF16 && t.Type != TypeBF16 {
		return fmt.Errorf("tensor %s: type %s (want F32, F16 or BF16)", t.Name, t.Type)
	}
	if e.negLog && t.Type != TypeF32 {
		return fmt.Errorf("tensor %s: type %s (want F32)", t.Name, t.Type)
	}
	if e.shape != nil {
		n := uint64(1)
		for _, d := range e.shape {
			n *= uint64(d)
		}
		if n != t.Elements() {
			return fmt.Errorf("tensor %s: %d elements, not a %v view", t.Name, t.Elements(), e.shape)
		}
	}
	for _, r := range e.rows {
		n := t.Dims[len(t.Dims)-1]
		if len(t.Dims) > 2 || r < 0 || uint64(r) >= n {
			return fmt.Errorf("tensor %s: row %d out of range", t.Name, r)
		}
	}
	if e.colBlocks != nil {
		nb := uint64(len(e.colBlocks))
		if len(t.Dims) != 2 || t.Dims[0]%nb != 0 || (t.Type == TypeMXFP4 && (t.Dims[0]/nb)%32 != 0) {
			return fmt.Errorf("tensor %s: %d columns cannot be reordered in %d blocks", t.Name, t.Dims[0], nb)
		}
		if _, quantized := ggmlTypes[t.Type]; quantized && !isFloatType(t.Type) && (t.Dims[0]/nb)%32 != 0 {
			e.dequant = true
		}
		for _, b := range e.colBlocks {
			if b < 0 || uint64(b) >= nb {
				return fmt.Errorf("tensor %s: column block %d out of range", t.Name, b)
			}
		}
	}
	if lay.NormsPlusOne && strings.HasSuffix(name, "norm.weight") {
		if t.Type != TypeF32 {
			return fmt.Errorf("tensor %s: %s norm weight of type %s (want F32)", t.Name, lay.Name, t.Type)
		}
		e.minusOne = true
	}
	if lay.PermutedQK {
		switch {
		case strings.HasSuffix(name, ".self_attn.q_proj.weight"), strings.HasSuffix(name, ".self_attn.q_proj.bias"):
			e.heads = int(heads)
		case strings.HasSuffix(name, ".self_attn.k_proj.weight"), strings.HasSuffix(name, ".self_attn.k_proj.bias"):
			e.heads = int(kvHeads)
		}
		if e.heads > 0 {
			rows := t.Dims[len(t.Dims)-1]
			if len(t.Dims) == 1 {
				rows = t.Dims[0]
			}
			if rows%uint64(2*e.heads) != 0 {
				return fmt.Errorf("tensor %s: %d rows not divisible into %d heads of even size", t.Name, rows, e.heads)
			}
		}
	}
	switch {
	case e.dequant:
		s.add(name, e)
		return nil
	}
	switch t.Type {
	case TypeF32, TypeF16, TypeBF16:
		s.add(name, e)
	case TypeQ4_0, TypeQ4_1, TypeQ5_0, TypeQ5_1, TypeQ8_0, TypeQ4_K, TypeQ5_K, TypeQ6_K:
		prefix, ok := strings.CutSuffix(name, ".weight")
		if !ok || (len(t.Dims) != 2 && !(len(t.Dims) == 3 && stackedExperts(prefix))) {
			return fmt.Errorf("tensor %s: quantized %s tensor is not a 2-D weight (or 3-D stacked experts)", t.Name, t.Type)
		}
		s.quant[prefix] = engine.QuantSpec{Bits: mlxBits(t.Type), GroupSize: 32}
		e.f32Scales = prefix == "model.embed_tokens"
		for part, suffix := range map[int]string{partW: ".weight", partScales: ".scales", partBiases: ".biases"} {
			pe := e
			pe.part = part
			s.add(prefix+suffix, pe)
		}
	case TypeMXFP4:
		// MLX's mxfp4 form: packed E2M1 codes and E8M0 scales, no
		// biases.
		prefix, ok := strings.CutSuffix(name, ".weight")
		if !ok || (len(t.Dims) != 2 && !(len(t.Dims) == 3 && stackedExperts(prefix))) {
			return fmt.Errorf("tensor %s: MXFP4 tensor is not a 2-D weight (or 3-D stacked experts)", t.Name)
		}
		s.quant[prefix] = engine.QuantSpec{Bits: 4, GroupSize: 32, Mode: "mxfp4"}
		for part, suffix := range map[int]string{partW: ".weight", partScales: ".scales"} {
			pe := e
			pe.part = part
			s.add(prefix+suffix, pe)
		}
	default:
		return fmt.Errorf("tensor %s: GGUF type %s not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)", t.Name, t.Type)
	}
	return nil
}

func (s *ggufSource) add(name string, e ggufEntry) {
	s.entries[name] = e
	s.names = append(s.names, name)
}

func (s *ggufSource) Names() []string { return append([]string(nil), s.names...) }
func (s *ggufSource) Config() []byte  { return s.config }
func (s *ggufSource) Close() error    { return s.g.Close() }

func (s *ggufSource) Quant(prefix string) engine.QuantSpec { return s.quant[prefix] }

func (s *ggufSource) Vocab() ([]string, error) {
	toks, ok := s.g.Strings("tokenizer.ggml.tokens")
	if !ok {
		return nil, fmt.Errorf("gguf: no tokenizer.ggml.tokens")
	}
	return append([]string(nil), toks...), nil
}

func (s *ggufSource) Tensor(name string) (engine.Tensor, error) {
	e, ok := s.entries[name]
	if !ok {
		return engine.Tensor{}, fmt.Errorf("tensor %q: %w", name, engine.ErrNotFound)
	}
	ti, raw, err := s.g.TensorData(e.src)
	if err != nil {
		return engine.Tensor{}, err
	}
	shape := make([]int, len(ti.Dims))
	for i, d := range ti.Dims {
		shape[len(shape)-1-i] = int(d)
	}
	if e.shape != nil {
		shape = slices.Clone(e.shape)
	}
	out := engine.Tensor{Name: name, Shape: shape}
	rows, cols := 1, shape[len(shape)-1]
	lead := shape[:len(shape)-1] // [out] or, for stacked experts, [E, out]
	for _, d := range lead {
		rows *= d
	}
	switch ti.Type {
	case TypeF32, TypeF16, TypeBF16:
		out.DType = map[GGMLType]engine.DType{TypeF32: engine.F32, TypeF16: engine.F16, TypeBF16: engine.BF16}[ti.Type]
		out.Data = raw
		if e.minusOne {
			out.Data = make([]byte, len(raw))
			for i := 0; i+4 <= len(raw); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
				binary.LittleEndian.PutUint32(out.Data[i:], math.Float32bits(v-1))
			}
		}
		if e.negLog {
			out.Data = make([]byte, len(raw))
			for i := 0; i+4 <= len(raw); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
				binary.LittleEndian.PutUint32(out.Data[i:], math.Float32bits(float32(math.Log(-float64(v)))))
			}
		}
		if e.heads > 0 {
			if len(shape) == 1 { // a bias: one element per row
				rows, cols = shape[0], 1
			}
			out.Data = unpermuteRows(raw, rows, len(raw)/rows, e.heads)
		}
		if e.rows != nil {
			n := int(ti.Dims[len(ti.Dims)-1]) // the file's rows (elements of a vector)
			out.Data = pickRows(out.Data, n, e.rows)
			if e.shape == nil {
				out.Shape[0] = len(e.rows)
			} else if len(e.rows) != n {
				return engine.Tensor{}, fmt.Errorf("tensor %s: %d of %d rows picked from a reshaped tensor", ti.Name, len(e.rows), n)
			}
		}
		if e.colBlocks != nil {
			out.Data = permuteColBlocks(out.Data, rows, e.colBlocks)
		}
		return out, nil
	}
	parts, err := s.converted(e, ti, raw, rows, cols)
	if err != nil {
		return engine.Tensor{}, err
	}
	if e.rows != nil {
		for i, p := range parts {
			parts[i] = pickRows(p, rows, e.rows)
		}
		lead = []int{len(e.rows)}
	}
	if e.dequant {
		out.DType = engine.F32
		out.Shape = append(slices.Clone(lead), cols)
		out.Data = dequantMLXParts(parts, rows, cols, mlxBits(ti.Type))
		if e.colBlocks != nil {
			out.Data = permuteColBlocks(out.Data, rows, e.colBlocks)
		}
		return out, nil
	}
	if e.colBlocks != nil {
		for i, p := range parts {
			parts[i] = permuteColBlocks(p, lead[0], e.colBlocks)
		}
	}
	bits := mlxBits(ti.Type)
	switch e.part {
	case partW:
		out.DType, out.Shape, out.Data = engine.U32, append(slices.Clone(lead), cols*bits/32), parts[0]
	case partScales:
		out.DType, out.Shape, out.Data = engine.F16, append(slices.Clone(lead), cols/32), parts[1]
		if ti.Type == TypeMXFP4 {
			out.DType = engine.U8
		}
	case partBiases:
		out.DType, out.Shape, out.Data = engine.F16, append(slices.Clone(lead), cols/32), parts[2]
	}
	if e.f32Scales && e.part != partW && out.DType == engine.F16 {
		f := make([]byte, 2*len(out.Data))
		for i := 0; i+2 <= len(out.Data); i += 2 {
			binary.LittleEndian.PutUint32(f[2*i:], math.Float32bits(F16ToF32(binary.LittleEndian.Uint16(out.Data[i:]))))
		}
		out.DType, out.Data = engine.F32, f
	}
	return out, nil
}

// converted returns the MLX form of a quantized GGUF tensor, converting it
// once for its three parts (only the most recent tensor is kept).
func (s *ggufSource) converted(e ggufEntry, ti TensorInfo, raw []byte, rows, cols int) ([3][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastSrc == e.src {
		return s.lastParts, nil
	}
	w, sc, bi, err := ggufToMLX(ti.Type, raw, rows, cols)
	if err != nil {
		return [3][]byte{}, fmt.Errorf("tensor %s: %w", ti.Name, err)
	}
	parts := [3][]byte{w, sc, bi}
	if e.heads > 0 {
		for i, p := range parts {
			parts[i] = unpermuteRows(p, rows, len(p)/rows, e.heads)
		}
	}
	s.lastSrc, s.lastParts = e.src, parts
	return parts, nil
}

func isFloatType(t GGMLType) bool { return t == TypeF32 || t == TypeF16 || t == TypeBF16 }

// permuteColBlocks returns b (n rows of equal size) with each row's
// len(blocks) equal column blocks reordered: block i of a row is its block
// blocks[i] of b.
func permuteColBlocks(b []byte, n int, blocks []int) []byte {
	if len(b) == 0 || n == 0 {
		return b
	}
	rowBytes := len(b) / n
	bb := rowBytes / len(blocks)
	out := make([]byte, 0, len(b))
	for r := range n {
		row := b[r*rowBytes : (r+1)*rowBytes]
		for _, k := range blocks {
			out = append(out, row[k*bb:(k+1)*bb]...)
		}
	}
	return out
}

// dequantMLXParts expands the MLX affine form (words with element j at
// bits [j·bits, (j+1)·bits), bits 4 or 8; F16 scales and biases per 32
// elements) of rows×cols elements to little-endian float32.
func dequantMLXParts(parts [3][]byte, rows, cols, bits int) []byte {
	out := make([]byte, 4*rows*cols)
	le := binary.LittleEndian
	mask := uint32(1)<<bits - 1
	words := cols * bits / 32
	for r := range rows {
		for c := range cols {
			word := le.Uint32(parts[0][4*(r*words+c*bits/32):])
			q := word >> (uint(c*bits) % 32) & mask
			g := r*(cols/32) + c/32
			v := F16ToF32(le.Uint16(parts[1][2*g:]))*float32(q) + F16ToF32(le.Uint16(parts[2][2*g:]))
			le.PutUint32(out[4*(r*cols+c):], math.Float32bits(v))
		}
	}
	return out
}

// pickRows returns rows sel (in that order) of b, which holds n rows of
// equal size.
func pickRows(b []byte, n int, sel []int) []byte {
	if len(b) == 0 || n == 0 {
		return nil
	}
	rowBytes := len(b) / n
	out := make([]byte, 0, len(sel)*rowBytes)
	for _, r := range sel {
		out = append(out, b[r*rowBytes:(r+1)*rowBytes]...)
	}
	return out
}

// unpermuteRows undoes llama.cpp's Q/K permutation (convert_hf_to_gguf.py
// reshapes rows as (heads, 2, hd/2), swaps the last two axes): GGUF row
// h*hd + 2i + j holds HF row h*hd + j*hd/2 + i. rowBytes is the byte size
// of one row. Returns a new slice.
func unpermuteRows(b []byte, rows, rowBytes, heads int) []byte {
	out := make([]byte, len(b))
	hd := rows / heads
	half := hd / 2
	for h := 0; h < heads; h++ {
		for i := 0; i < half; i++ {
			for j := 0; j < 2; j++ {
				src := h*hd + 2*i + j
				dst := h*hd + j*half + i
				copy(out[dst*rowBytes:(dst+1)*rowBytes], b[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return out
}

// ggufToMLX converts rows×cols elements of a quantized tensor (Q4_0, Q4_1,
// Q8_0 here; Q5_0, Q5_1 and the K-quants in gguf_kquant.go) to
// MLX affine form with group size 32: packed U32 words (element j of a word
// at bits [j*bits, (j+1)*bits)), and F16 scales and biases [rows, cols/32]
// such that w = scale*q + bias.
//
//	Q4_0: w = d*(q-8)        → scale d, bias -8d
//	Q4_1: w = d*q + m        → scale d, bias m
//	Q8_0: w = d*q (q int8)   → q+128 unsigned, scale d, bias -128d
//
// Q4 blocks keep element i in the low nibble of qs[i] and element i+16 in
// the high nibble. The f16 biases -8d and -128d are exact (power-of-two
// multiples of an f16).
func ggufToMLX(t GGMLType, raw []byte, rows, cols int) (w, scales, biases []byte, err error) {
	if gw, ok := groupwiseTypes[t]; ok {
		return groupwiseToMLX(gw, raw, rows, cols)
	}
	if t == TypeMXFP4 {
		w, scales, err = mxfp4ToMLX(raw, rows, cols)
		return w, scales, nil, err
	}
	if cols%32 != 0 {
		return nil, nil, nil, fmt.Errorf("%d columns not a multiple of 32", cols)
	}
	blocks := rows * cols / 32
	var blockBytes, bits int
	switch t {
	case TypeQ4_0:
		blockBytes, bits = 18, 4
	case TypeQ4_1:
		blockBytes, bits = 20, 4
	case TypeQ8_0:
		blockBytes, bits = 34, 8
	default:
		return nil, nil, nil, fmt.Errorf("cannot convert %s", t)
	}
	if len(raw) != blocks*blockBytes {
		return nil, nil, nil, fmt.Errorf("%d bytes for %d %s blocks", len(raw), blocks, t)
	}
	wordsPerBlock := bits // 32 elements of `bits` bits = `bits` words
	w = make([]byte, blocks*wordsPerBlock*4)
	scales = make([]byte, blocks*2)
	biases = make([]byte, blocks*2)
	le := binary.LittleEndian
	for b := 0; b < blocks; b++ {
		blk := raw[b*blockBytes : (b+1)*blockBytes]
		d := le.Uint16(blk)
		out := w[b*wordsPerBlock*4 : (b+1)*wordsPerBlock*4]
		var bias uint16
		switch t {
		case TypeQ4_0, TypeQ4_1:
			qs := blk[2:]
			if t == TypeQ4_1 {
				bias = le.Uint16(blk[2:])
				qs = blk[4:]
			} else {
				bias = f16Mul(d, -8)
			}
			// Elements 0..15 are the low nibbles of qs[0..15], 16..31
			// the high nibbles: each run of 8 nibbles packs into a word.
			lo0, lo1 := le.Uint64(qs), le.Uint64(qs[8:])
			le.PutUint32(out[0:], packNibbles(lo0))
			le.PutUint32(out[4:], packNibbles(lo1))
			le.PutUint32(out[8:], packNibbles(lo0>>4))
			le.PutUint32(out[12:], packNibbles(lo1>>4))
		case TypeQ8_0:
			bias = f16Mul(d, -128)
			// int8 q → q+128: flip the sign bit of every byte; byte j of
			// a little-endian word is element j.
			for k := 0; k < 32; k += 8 {
				le.PutUint64(out[k:], le.Uint64(blk[2+k:])^0x8080808080808080)
			}
		}
		le.PutUint16(scales[2*b:], d)
		le.PutUint16(biases[2*b:], bias)
	}
	return w, scales, biases, nil
}

// mxfp4ToMLX converts rows×cols elements of ggml MXFP4 blocks to MLX's
// mxfp4 form: the same E2M1 codes packed 8 to a U32 word (element j of a
// word at bits [4j, 4j+4)) and the same E8M0 scale bytes [rows, cols/32].
// ggml's value table is E2M1 doubled and its scale halved, so the values
// are equal.
func mxfp4ToMLX(raw []byte, rows, cols int) (w, scales []byte, err error) {
	if cols%32 != 0 {
		return nil, nil, fmt.Errorf("%d columns not a multiple of 32", cols)
	}
	blocks := rows * cols / 32
	if len(raw) != blocks*17 {
		return nil, nil, fmt.Errorf("%d bytes for %d MXFP4 blocks", len(raw), blocks)
	}
	w = make([]byte, blocks*16)
	scales = make([]byte, blocks)
	le := binary.LittleEndian
	for b := 0; b < blocks; b++ {
		blk := raw[b*17 : (b+1)*17]
		scales[b] = blk[0]
		lo0, lo1 := le.Uint64(blk[1:]), le.Uint64(blk[9:])
		out := w[b*16 : (b+1)*16]
		le.PutUint32(out[0:], packNibbles(lo0))
		le.PutUint32(out[4:], packNibbles(lo1))
		le.PutUint32(out[8:], packNibbles(lo0>>4))
		le.PutUint32(out[12:], packNibbles(lo1>>4))
	}
	return w, scales, nil
}

// stackedExperts reports whether an HF module prefix holds experts stacked
// [E, out, in] (mlx-lm's switch_mlp, or under mlp.experts.).
func stackedExperts(prefix string) bool {
	return strings.Contains(prefix, ".switch_mlp.") || strings.Contains(prefix, ".mlp.experts.")
}

// mlxBits is the bit width of the MLX form of a quantized GGUF type.
func mlxBits(t GGMLType) int {
	if gw, ok := groupwiseTypes[t]; ok {
		return gw.bits
	}
	if t == TypeQ8_0 {
		return 8
	}
	return 4
}

// packNibbles packs the low nibble of each of the 8 bytes of x into a
// uint32, byte j's nibble at bits [4j, 4j+4).
func packNibbles(x uint64) uint32 {
	x &= 0x0f0f0f0f0f0f0f0f
	x = (x | x>>4) & 0x00ff00ff00ff00ff
	x = (x | x>>8) & 0x0000ffff0000ffff
	x = (x | x>>16) & 0x00000000ffffffff
	return uint32(x)
}

// f16Mul multiplies an IEEE half by m = -2^k (-8 or -128) exactly: for a
// normal value whose exponent stays in range it adds k to the exponent
// and flips the sign; other values go through float32.
func f16Mul(h uint16, m float32) uint16 {
	k := uint16(3)
	if m == -128 {
		k = 7
	}
	if exp := h >> 10 & 0x1f; (m == -8 || m == -128) && exp != 0 && exp+k < 0x1f {
		return (h ^ 0x8000) + k<<10
	}
	return F32ToF16(F16ToF32(h) * m)
}

// Llama 3's RoPE scaling constants (Llama 3.1 and 3.2 use these with a
// factor of 8 or 32).
const (
	llama3LowFreqFactor  = 1
	llama3HighFreqFactor = 4
	llama3OriginalCtx    = 8192
)

// ropeFreqsScaling recognizes a rope_freqs.weight tensor, which
// llama.cpp's converter writes for Llama 3.1/3.2 instead of scaling
// metadata: per rotated pair, the factor its frequency is divided by. It
// returns the equivalent HF rope_scaling block, after checking that
// Llama 3's scaling with the tensor's largest factor gives every one of
// the tensor's factors; nil when there is no such tensor or all factors
// are 1; an error for factors it cannot express.
func ropeFreqsScaling(g *GGUF, theta float64, headDim int) (map[string]any, error) {
	if _, ok := g.TensorInfo("rope_freqs.weight"); !ok {
		return nil, nil
	}
	ti, raw, err := g.TensorData("rope_freqs.weight")
	if err != nil {
		return nil, err
	}
	if ti.Type != TypeF32 || len(raw) != 4*(headDim/2) {
		return nil, fmt.Errorf("rope_freqs.weight: %s with %d bytes, want %d float32 factors (head dim %d)", ti.Type, len(raw), headDim/2, headDim)
	}
	got := make([]float64, headDim/2)
	factor := 0.0
	for i := range got {
		got[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		factor = max(factor, got[i])
	}
	if factor == 1 && slices.Min(got) == 1 {
		return nil, nil
	}
	plain, _, err := engine.RoPEFrequencies(&engine.RoPE{Dims: headDim, Base: theta}, headDim)
	if err != nil {
		return nil, fmt.Errorf("rope_freqs.weight: %w", err)
	}
	scaling := engine.RoPEScaling{Type: "llama3", Factor: factor, LowFreqFactor: llama3LowFreqFactor,
		HighFreqFactor: llama3HighFreqFactor, OriginalMaxPositions: llama3OriginalCtx}
	scaled, _, err := engine.RoPEFrequencies(&engine.RoPE{Dims: headDim, Base: theta, Scale: scaling}, headDim)
	if err != nil {
		return nil, fmt.Errorf("rope_freqs.weight: %w", err)
	}
	for i, f := range got {
		if want := float64(plain[i]) / float64(scaled[i]); math.Abs(want-f) > 1e-3*f {
			return nil, fmt.Errorf("rope_freqs.weight: factor %d is %g where Llama 3 scaling (factor %g, low %d, high %d, original context %d) gives %g; these frequency factors are not supported",
				i, f, factor, llama3LowFreqFactor, llama3HighFreqFactor, llama3OriginalCtx, want)
		}
	}
	return map[string]any{"type": "llama3", "rope_type": "llama3", "factor": factor,
		"low_freq_factor": llama3LowFreqFactor, "high_freq_factor": llama3HighFreqFactor,
		"original_max_position_embeddings": llama3OriginalCtx}, nil
}

// synthesizeConfig writes an HF config.json equivalent to the GGUF
// metadata: the keys every llama.cpp architecture shares here, the
// architecture's own through its layout's Config.
func synthesizeConfig(g *GGUF, hfArch string, lay *engine.GGUFLayout, s *ggufSource) ([]byte, error) {
	arch := lay.Name
	key := func(k string) string { return arch + "." + k }
	need := func(k string) (uint64, error) {
		v, ok := g.Uint(key(k))
		if !ok {
			return 0, fmt.Errorf("metadata %s missing", key(k))
		}
		return v, nil
	}
	layers, err := need("block_count")
	if err != nil {
		return nil, err
	}
	hidden, err := need("embedding_length")
	if err != nil {
		return nil, err
	}
	ffn, err := need("feed_forward_length")
	if err != nil {
		if f, ok := g.Uint(key("expert_feed_forward_length")); ok && lay.ExpertFFN {
			ffn, err = f, nil // no dense layer uses it
		} else {
			return nil, err
		}
	}
	heads, err := need("attention.head_count")
	if err != nil {
		return nil, err
	}
	if heads == 0 {
		return nil, fmt.Errorf("metadata %s is 0", key("attention.head_count"))
	}
	kvHeads, ok := g.Uint(key("attention.head_count_kv"))
	if !ok {
		kvHeads = heads
	}
	headDim, ok := g.Uint(key("attention.key_length"))
	if !ok {
		headDim = hidden / heads
	}
	ctx, ok := g.Uint(key("context_length"))
	if !ok {
		ctx = 2048
	}
	eps, ok := g.Float(key("attention.layer_norm_rms_epsilon"))
	if !ok {
		eps = 1e-6
	}
	theta, ok := g.Float(key("rope.freq_base"))
	if !ok {
		theta = 10000
	}
	vocab, ok := g.Uint(key("vocab_size"))
	if !ok {
		if toks, ok := g.Strings("tokenizer.ggml.tokens"); ok {
			vocab = uint64(len(toks))
		} else if ti, ok := g.TensorInfo("token_embd.weight"); ok && len(ti.Dims) == 2 {
			vocab = ti.Dims[1]
		}
	}
	_, hasOutput := g.TensorInfo("output.weight")
	_, hasQBias := g.TensorInfo("blk.0.attn_q.bias")
	cfg := map[string]any{
		"architectures":           []string{hfArch},
		"model_type":              lay.ModelType,
		"hidden_size":             hidden,
		"intermediate_size":       ffn,
		"num_hidden_layers":       layers,
		"num_attention_heads":     heads,
		"num_key_value_heads":     kvHeads,
		"head_dim":                headDim,
		"max_position_embeddings": ctx,
		"rms_norm_eps":            eps,
		"rope_theta":              theta,
		"vocab_size":              vocab,
		"tie_word_embeddings":     !hasOutput,
		"hidden_act":              "silu",
		"attention_bias":          hasQBias,
		"torch_dtype":             "float32",
	}
	if lay.Config != nil {
		if err := lay.Config(ggufMetadata{g, s.q3n}, key, cfg); err != nil {
			return nil, err
		}
	}
	// Scaling settings the engine does not implement are refused by name.
	if f, ok := g.Float(key("rope.scaling.attn_factor")); ok && f != 1 {
		return nil, fmt.Errorf("metadata %s = %g is not supported", key("rope.scaling.attn_factor"), f)
	}
	if f, ok := g.Float(key("rope.scaling.yarn_log_multiplier")); ok && f != 0 {
		return nil, fmt.Errorf("metadata %s = %g is not supported", key("rope.scaling.yarn_log_multiplier"), f)
	}
	if id, ok := g.Uint("tokenizer.ggml.bos_token_id"); ok {
		cfg["bos_token_id"] = id
	}
	if id, ok := g.Uint("tokenizer.ggml.eos_token_id"); ok {
		cfg["eos_token_id"] = id
	}
	if typ, ok := g.String(key("rope.scaling.type")); ok && typ != "none" {
		rs := map[string]any{"type": typ, "rope_type": typ}
		if f, ok := g.Float(key("rope.scaling.factor")); ok {
			rs["factor"] = f
		}
		if n, ok := g.Uint(key("rope.scaling.original_context_length")); ok {
			rs["original_max_position_embeddings"] = n
		}
		cfg["rope_scaling"] = rs
	} else {
		rs, err := ropeFreqsScaling(g, theta, int(headDim))
		if err != nil {
			return nil, err
		}
		if rs != nil {
			cfg["rope_scaling"] = rs
		}
	}
	if len(s.quant) > 0 {
		cfg["quantization"] = s.quantizationConfig()
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// ggufMetadata presents a GGUF file to an architecture's GGUF mapping.
type ggufMetadata struct {
	*GGUF
	q3n *qwen3nextLayout
}

func (m ggufMetadata) HasTensor(name string) bool {
	_, ok := m.GGUF.TensorInfo(name)
	return ok
}

func (m ggufMetadata) RecurrentLayers() []bool {
	if m.q3n == nil {
		return nil
	}
	return m.q3n.recurrent
}

func isLinear(prefix string) bool {
	for _, l := range []string{"_proj", "lm_head", "embed_tokens"} {
		if strings.HasSuffix(prefix, l) {
			return true
		}
	}
	return false
}

// quantizationConfig is config.json's quantization block for the source's
// quantized linears: the most common spec is the default; the rest are
// per-module overrides in mlx-lm's form, dense linears marked false.
func (s *ggufSource) quantizationConfig() map[string]any {
	count := map[engine.QuantSpec]int{}
	for _, q := range s.quant {
		count[q]++
	}
	var def engine.QuantSpec
	for q, n := range count {
		if n > count[def] || (n == count[def] && q.Bits > def.Bits) {
			def = q
		}
	}
	spec := func(q engine.QuantSpec) map[string]any {
		m := map[string]any{"group_size": q.GroupSize, "bits": q.Bits}
		if q.Mode != "" {
			m["mode"] = q.Mode
		}
		return m
	}
	qb := spec(def)
	for p, q := range s.quant {
		if q != def {
			qb[p] = spec(q)
		}
	}
	for _, n := range s.names {
		p, ok := strings.CutSuffix(n, ".weight")
		if _, quantized := s.quant[p]; ok && !quantized && isLinear(p) {
			qb[p] = false
		}
	}
	return qb
}
