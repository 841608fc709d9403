package testmodel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// Dense presents src (a quantized checkpoint: an MLX-quantized directory or
// a GGUF file through weights) as a dense one of dtype dt (engine.F32 or
// engine.BF16): every MLX affine-quantized linear reads as its
// dequantized weight (scale·q + bias per group, computed in float32, then
// rounded to dt), every other floating tensor is converted to dt, and the
// config names dt as torch_dtype and has no quantization block. The
// weights are the same numbers the quantized model computes with (exactly
// in float32), so a benchmark can run a real model on a backend's dense
// matrix products (MLX's BLAS sgemv/sgemm on its CPU device) instead of
// its quantized kernels. Test and benchmark use only: production loads
// quantized files as they are. It refuses mxfp4 linears (not affine).
// Tensors are converted when read; Close closes src.
func Dense(src engine.Source, dt engine.DType) (engine.Source, error) {
	if dt != engine.F32 && dt != engine.BF16 {
		return nil, fmt.Errorf("testmodel: dense dtype %v (want float32 or bfloat16)", dt)
	}
	var cfg map[string]any
	d := json.NewDecoder(bytes.NewReader(src.Config()))
	d.UseNumber()
	if err := d.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("testmodel: config: %w", err)
	}
	delete(cfg, "quantization")
	delete(cfg, "quantization_config")
	cfg["torch_dtype"] = map[engine.DType]string{engine.F32: "float32", engine.BF16: "bfloat16"}[dt]
	delete(cfg, "dtype")
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("testmodel: config: %w", err)
	}
	s := &denseSource{src: src, dt: dt, config: raw}
	for _, n := range src.Names() {
		if p, ok := cutAny(n, ".scales", ".biases"); ok && src.Quant(p).Bits > 0 {
			continue
		}
		if p, ok := strings.CutSuffix(n, ".weight"); ok {
			if q := src.Quant(p); q.Mode != "" {
				return nil, fmt.Errorf("testmodel: %s: %s quantization cannot be made dense here (affine only)", p, q.Mode)
			}
		}
		s.names = append(s.names, n)
	}
	return s, nil
}

func cutAny(s string, suffixes ...string) (string, bool) {
	for _, x := range suffixes {
		if p, ok := strings.CutSuffix(s, x); ok {
			return p, true
		}
	}
	return s, false
}

type denseSource struct {
	src    engine.Source
	dt     engine.DType
	config []byte
	names  []string
}

func (s *denseSource) Names() []string               { return slices.Clone(s.names) }
func (s *denseSource) Quant(string) engine.QuantSpec { return engine.QuantSpec{} }
func (s *denseSource) Config() []byte                { return s.config }
func (s *denseSource) Vocab() ([]string, error)      { return s.src.Vocab() }
func (s *denseSource) Close() error                  { return s.src.Close() }

func (s *denseSource) Tensor(name string) (engine.Tensor, error) {
	if p, ok := cutAny(name, ".scales", ".biases"); ok && s.src.Quant(p).Bits > 0 {
		return engine.Tensor{}, fmt.Errorf("tensor %q (dense): %w", name, engine.ErrNotFound)
	}
	if p, ok := strings.CutSuffix(name, ".weight"); ok {
		if q := s.src.Quant(p); q.Bits > 0 {
			v, shape, err := s.dequantize(p, q)
			if err != nil {
				return engine.Tensor{}, err
			}
			return engine.Tensor{Name: name, DType: s.dt, Shape: shape, Data: encode(v, s.dt)}, nil
		}
	}
	t, err := s.src.Tensor(name)
	if err != nil {
		return t, err
	}
	switch t.DType {
	case engine.F32, engine.F16, engine.BF16:
		if t.DType != s.dt {
			v, err := floats(t)
			if err != nil {
				return engine.Tensor{}, err
			}
			t.DType, t.Data = s.dt, encode(v, s.dt)
		}
	}
	return t, nil
}

// dequantize expands the linear p's MLX affine parts (U32 words holding
// element j at bits [j·bits, (j+1)·bits) of the row, as MLX packs them;
// scales and biases per group of q.GroupSize) to float32, with the dense
// weight's shape.
func (s *denseSource) dequantize(p string, q engine.QuantSpec) ([]float32, []int, error) {
	w, err := s.src.Tensor(p + ".weight")
	if err != nil {
		return nil, nil, err
	}
	// A source may reuse its buffers between tensors (GGUF converts one
	// tensor's three parts at a time): the words are read before the
	// scales are asked for.
	words := slices.Clone(w.Data)
	wshape := slices.Clone(w.Shape)
	sc, err := s.src.Tensor(p + ".scales")
	if err != nil {
		return nil, nil, err
	}
	scales, err := floats(sc)
	if err != nil {
		return nil, nil, err
	}
	bi, err := s.src.Tensor(p + ".biases")
	if err != nil {
		return nil, nil, err
	}
	biases, err := floats(bi)
	if err != nil {
		return nil, nil, err
	}
	if w.DType != engine.U32 || len(wshape) < 2 || q.GroupSize <= 0 || q.Bits <= 0 || 32%q.Bits != 0 {
		return nil, nil, fmt.Errorf("testmodel: %s: %v weight %v, %d bits in groups of %d: not MLX affine", p, w.DType, wshape, q.Bits, q.GroupSize)
	}
	perRow := wshape[len(wshape)-1] * 32 / q.Bits
	rows := 1
	for _, d := range wshape[:len(wshape)-1] {
		rows *= d
	}
	groups := perRow / q.GroupSize
	if perRow%q.GroupSize != 0 || len(words) != 4*rows*wshape[len(wshape)-1] || len(scales) != rows*groups || len(biases) != rows*groups {
		return nil, nil, fmt.Errorf("testmodel: %s: %d words, %d scales, %d biases do not fit %d rows of %d %d-bit elements in groups of %d",
			p, len(words)/4, len(scales), len(biases), rows, perRow, q.Bits, q.GroupSize)
	}
	out := make([]float32, rows*perRow)
	rowWords := wshape[len(wshape)-1]
	mask := uint32(1)<<q.Bits - 1
	for r := range rows {
		row := words[4*r*rowWords : 4*(r+1)*rowWords]
		for j := range perRow {
			bit := j * q.Bits // 2, 4 or 8 bits: no element straddles two words
			v := float32(binary.LittleEndian.Uint32(row[4*(bit/32):]) >> (bit % 32) & mask)
			g := r*groups + j/q.GroupSize
			out[r*perRow+j] = scales[g]*v + biases[g]
		}
	}
	shape := append(slices.Clone(wshape[:len(wshape)-1]), perRow)
	return out, shape, nil
}

// floats reads a floating tensor as float32.
func floats(t engine.Tensor) ([]float32, error) {
	le := binary.LittleEndian
	switch t.DType {
	case engine.F32:
		v := make([]float32, len(t.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(le.Uint32(t.Data[4*i:]))
		}
		return v, nil
	case engine.F16, engine.BF16:
		conv := weights.F16ToF32
		if t.DType == engine.BF16 {
			conv = weights.BF16ToF32
		}
		v := make([]float32, len(t.Data)/2)
		for i := range v {
			v[i] = conv(le.Uint16(t.Data[2*i:]))
		}
		return v, nil
	}
	return nil, fmt.Errorf("testmodel: tensor %s: %v is not a floating type", t.Name, t.DType)
}

// encode writes v as little-endian dt (F32 or BF16, rounded to nearest).
func encode(v []float32, dt engine.DType) []byte {
	le := binary.LittleEndian
	if dt == engine.BF16 {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			le.PutUint16(b[2*i:], weights.F32ToBF16(x))
		}
		return b
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		le.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
