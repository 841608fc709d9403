package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

// ErrFormat is wrapped by every error about malformed file contents.
var ErrFormat = errors.New("weights: malformed file")

// GGMLType is a GGUF tensor element type.
type GGMLType uint32

// GGML tensor types (ggml.h numbering).
const (
	TypeF32  GGMLType = 0
	TypeF16  GGMLType = 1
	TypeQ4_0 GGMLType = 2
	TypeQ4_1 GGMLType = 3
	TypeQ5_0 GGMLType = 6
	TypeQ5_1 GGMLType = 7
	TypeQ8_0 GGMLType = 8
	TypeQ8_1 GGMLType = 9
	TypeQ2_K GGMLType = 10
	TypeQ3_K GGMLType = 11
	TypeQ4_K GGMLType = 12
	TypeQ5_K GGMLType = 13
	TypeQ6_K GGMLType = 14
	TypeQ8_K GGMLType = 15
	TypeI8   GGMLType = 24
	TypeI16  GGMLType = 25
	TypeI32  GGMLType = 26
	TypeI64  GGMLType = 27
	TypeF64  GGMLType = 28
	TypeBF16 GGMLType = 30
	// TypeMXFP4 blocks: 32 elements in 17 bytes, an E8M0 scale then 16
	// bytes of E2M1 codes (element j in the low nibble of byte j, element
	// j+16 in its high nibble).
	TypeMXFP4 GGMLType = 39
)

type ggmlTypeInfo struct {
	name                 string
	blockSize, typeBytes uint64 // elements per block, bytes per block
}

var ggmlTypes = map[GGMLType]ggmlTypeInfo{
	TypeF32:   {"F32", 1, 4},
	TypeF16:   {"F16", 1, 2},
	TypeQ4_0:  {"Q4_0", 32, 18},
	TypeQ4_1:  {"Q4_1", 32, 20},
	TypeQ5_0:  {"Q5_0", 32, 22},
	TypeQ5_1:  {"Q5_1", 32, 24},
	TypeQ8_0:  {"Q8_0", 32, 34},
	TypeQ8_1:  {"Q8_1", 32, 36},
	TypeQ2_K:  {"Q2_K", 256, 84},
	TypeQ3_K:  {"Q3_K", 256, 110},
	TypeQ4_K:  {"Q4_K", 256, 144},
	TypeQ5_K:  {"Q5_K", 256, 176},
	TypeQ6_K:  {"Q6_K", 256, 210},
	TypeQ8_K:  {"Q8_K", 256, 292},
	TypeI8:    {"I8", 1, 1},
	TypeI16:   {"I16", 1, 2},
	TypeI32:   {"I32", 1, 4},
	TypeI64:   {"I64", 1, 8},
	TypeF64:   {"F64", 1, 8},
	TypeBF16:  {"BF16", 1, 2},
	TypeMXFP4: {"MXFP4", 32, 17},
}

func (t GGMLType) String() string {
	if ti, ok := ggmlTypes[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// GGUF metadata value types.
const (
	gUint8   = 0
	gInt8    = 1
	gUint16  = 2
	gInt16   = 3
	gUint32  = 4
	gInt32   = 5
	gFloat32 = 6
	gBool    = 7
	gString  = 8
	gArray   = 9
	gUint64  = 10
	gInt64   = 11
	gFloat64 = 12
)

// TensorInfo is one entry of a GGUF tensor directory.
type TensorInfo struct {
	Name string
	// Dims in GGUF order: Dims[0] is the fastest-varying (ne0). The HF
	// row-major shape is Dims reversed.
	Dims []uint64
	Type GGMLType
	// Offset is relative to the start of the data section; Size is the
	// byte size (0 when the type is unknown to this package).
	Offset, Size uint64
}

// Elements returns the number of elements.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// GGUF is an opened GGUF file: typed metadata and the tensor directory,
// with tensor data read from the memory-mapped file.
type GGUF struct {
	Version    uint32
	Alignment  uint64
	DataOffset uint64 // absolute offset of the data section

	keys    []string
	meta    map[string]any
	tensors []TensorInfo
	byName  map[string]int
	data    []byte // whole file
	m       *mapping
}

// OpenGGUF memory-maps and parses a GGUF (v2 or v3) file.
func OpenGGUF(path string) (*GGUF, error) {
	m, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("open gguf: %w", err)
	}
	g, err := ParseGGUF(m.data)
	if err != nil {
		m.close()
		return nil, fmt.Errorf("gguf %s: %w", path, err)
	}
	g.m = m
	return g, nil
}

// Close releases the file mapping. Tensor data slices are invalid after.
func (g *GGUF) Close() error {
	if g.m == nil {
		return nil
	}
	m := g.m
	g.m, g.data = nil, nil
	return m.close()
}

// maxArrayDepth bounds nested metadata arrays.
const maxArrayDepth = 8

type ggufReader struct {
	b   []byte
	pos uint64
	err error
}

func (r *ggufReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: gguf: %s (at byte %d)", ErrFormat, fmt.Sprintf(format, args...), r.pos)
	}
}

func (r *ggufReader) remaining() uint64 { return uint64(len(r.b)) - r.pos }

func (r *ggufReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > r.remaining() {
		r.fail("need %d bytes, %d left", n, r.remaining())
		return nil
	}
	s := r.b[r.pos : r.pos+n]
	r.pos += n
	return s
}

func (r *ggufReader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *ggufReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *ggufReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *ggufReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *ggufReader) str() string {
	n := r.u64()
	if r.err == nil && n > r.remaining() {
		r.fail("string length %d exceeds file", n)
		return ""
	}
	return string(r.take(n))
}

// count reads an element count and checks that count elements of at least
// minSize bytes each fit in the rest of the file.
func (r *ggufReader) count(what string, minSize uint64) uint64 {
	n := r.u64()
	if r.err == nil && minSize > 0 && n > r.remaining()/minSize {
		r.fail("%s count %d exceeds file", what, n)
		return 0
	}
	return n
}

func scalarSize(t uint32) uint64 {
	switch t {
	case gUint8, gInt8, gBool:
		return 1
	case gUint16, gInt16:
		return 2
	case gUint32, gInt32, gFloat32:
		return 4
	case gUint64, gInt64, gFloat64:
		return 8
	case gString, gArray:
		return 8 // at least the length/type prefix
	}
	return 0
}

func (r *ggufReader) value(t uint32, depth int) any {
	switch t {
	case gUint8:
		return r.u8()
	case gInt8:
		return int8(r.u8())
	case gUint16:
		return r.u16()
	case gInt16:
		return int16(r.u16())
	case gUint32:
		return r.u32()
	case gInt32:
		return int32(r.u32())
	case gFloat32:
		return math.Float32frombits(r.u32())
	case gBool:
		v := r.u8()
		if v > 1 {
			r.fail("bool value %d", v)
		}
		return v == 1
	case gString:
		return r.str()
	case gUint64:
		return r.u64()
	case gInt64:
		return int64(r.u64())
	case gFloat64:
		return math.Float64frombits(r.u64())
	case gArray:
		return r.array(depth + 1)
	}
	r.fail("unknown metadata value type %d", t)
	return nil
}

func (r *ggufReader) array(depth int) any {
	if depth > maxArrayDepth {
		r.fail("metadata arrays nested deeper than %d", maxArrayDepth)
		return nil
	}
	et := r.u32()
	size := scalarSize(et)
	if r.err == nil && size == 0 {
		r.fail("unknown array element type %d", et)
		return nil
	}
	n := r.count("array", size)
	if r.err != nil {
		return nil
	}
	switch et {
	case gUint8:
		return append([]uint8(nil), r.take(n)...)
	case gInt8:
		out := make([]int8, n)
		for i, b := range r.take(n) {
			out[i] = int8(b)
		}
		return out
	case gBool:
		out := make([]bool, n)
		for i := range out {
			out[i] = r.value(gBool, depth).(bool)
		}
		return out
	case gUint16:
		out := make([]uint16, n)
		for i := range out {
			out[i] = r.u16()
		}
		return out
	case gInt16:
		out := make([]int16, n)
		for i := range out {
			out[i] = int16(r.u16())
		}
		return out
	case gUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = r.u32()
		}
		return out
	case gInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(r.u32())
		}
		return out
	case gFloat32:
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(r.u32())
		}
		return out
	case gUint64:
		out := make([]uint64, n)
		for i := range out {
			out[i] = r.u64()
		}
		return out
	case gInt64:
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(r.u64())
		}
		return out
	case gFloat64:
		out := make([]float64, n)
		for i := range out {
			out[i] = math.Float64frombits(r.u64())
		}
		return out
	case gString:
		out := make([]string, n)
		for i := range out {
			out[i] = r.str()
			if r.err != nil {
				return nil
			}
		}
		return out
	case gArray:
		out := make([]any, n)
		for i := range out {
			out[i] = r.array(depth)
			if r.err != nil {
				return nil
			}
		}
		return out
	}
	return nil
}

// ggufMagic is "GGUF" read as a little-endian uint32.
const ggufMagic = 0x46554747

// maxDims is GGML_MAX_DIMS.
const maxDims = 4

// ParseGGUF parses a GGUF file held in b (the tensor data stays in b).
func ParseGGUF(b []byte) (*GGUF, error) {
	r := &ggufReader{b: b}
	if magic := r.u32(); r.err == nil && magic != ggufMagic {
		return nil, fmt.Errorf("%w: not a GGUF file (magic %#x)", ErrFormat, magic)
	}
	g := &GGUF{Version: r.u32(), meta: map[string]any{}, byName: map[string]int{}, data: b, Alignment: 32}
	if r.err == nil && g.Version != 2 && g.Version != 3 {
		return nil, fmt.Errorf("%w: unsupported GGUF version %d (want 2 or 3)", ErrFormat, g.Version)
	}
	// Minimum sizes: tensor info = name len + n_dims + type + offset;
	// kv = key len + value type + 1 byte of value.
	nTensors := r.count("tensor", 8+4+4+8)
	nKV := r.count("metadata", 8+4+1)
	for i := uint64(0); i < nKV && r.err == nil; i++ {
		key := r.str()
		t := r.u32()
		v := r.value(t, 0)
		if r.err != nil {
			break
		}
		if _, dup := g.meta[key]; dup {
			r.fail("duplicate metadata key %q", key)
			break
		}
		g.keys = append(g.keys, key)
		g.meta[key] = v
	}
	if r.err != nil {
		return nil, r.err
	}
	if v, ok := g.meta["general.alignment"]; ok {
		a, ok := toUint(v)
		if !ok || a == 0 || a&(a-1) != 0 || a > 1<<20 {
			return nil, fmt.Errorf("%w: gguf: bad general.alignment %v", ErrFormat, v)
		}
		g.Alignment = a
	}
	g.tensors = make([]TensorInfo, 0, nTensors)
	for i := uint64(0); i < nTensors && r.err == nil; i++ {
		var t TensorInfo
		t.Name = r.str()
		nd := r.u32()
		if r.err == nil && (nd == 0 || nd > maxDims) {
			r.fail("tensor %q has %d dims", t.Name, nd)
			break
		}
		t.Dims = make([]uint64, nd)
		for j := range t.Dims {
			t.Dims[j] = r.u64()
		}
		t.Type = GGMLType(r.u32())
		t.Offset = r.u64()
		if r.err != nil {
			break
		}
		if _, dup := g.byName[t.Name]; dup {
			r.fail("duplicate tensor %q", t.Name)
			break
		}
		if err := tensorSize(&t); err != nil {
			return nil, err
		}
		g.byName[t.Name] = len(g.tensors)
		g.tensors = append(g.tensors, t)
	}
	if r.err != nil {
		return nil, r.err
	}
	off := r.pos
	if rem := off % g.Alignment; rem != 0 {
		off += g.Alignment - rem
	}
	g.DataOffset = off
	if len(g.tensors) > 0 && off > uint64(len(b)) {
		return nil, fmt.Errorf("%w: gguf: data section at %d beyond end of file (%d bytes)", ErrFormat, off, len(b))
	}
	avail := uint64(0)
	if off <= uint64(len(b)) {
		avail = uint64(len(b)) - off
	}
	for _, t := range g.tensors {
		if t.Offset%g.Alignment != 0 {
			return nil, fmt.Errorf("%w: gguf: tensor %q offset %d not aligned to %d", ErrFormat, t.Name, t.Offset, g.Alignment)
		}
		if t.Offset > avail || t.Size > avail-t.Offset {
			return nil, fmt.Errorf("%w: gguf: tensor %q [%d, %d) beyond data section (%d bytes)", ErrFormat, t.Name, t.Offset, t.Offset+t.Size, avail)
		}
	}
	return g, nil
}

// tensorSize validates dims and computes t.Size (left 0 for unknown types).
func tensorSize(t *TensorInfo) error {
	n := uint64(1)
	for _, d := range t.Dims {
		if d == 0 {
			return fmt.Errorf("%w: gguf: tensor %q has a zero dim %v", ErrFormat, t.Name, t.Dims)
		}
		if n > math.MaxInt64/d {
			return fmt.Errorf("%w: gguf: tensor %q dims %v overflow", ErrFormat, t.Name, t.Dims)
		}
		n *= d
	}
	ti, ok := ggmlTypes[t.Type]
	if !ok {
		return nil
	}
	if t.Dims[0]%ti.blockSize != 0 {
		return fmt.Errorf("%w: gguf: tensor %q: row of %d elements not a multiple of %s block %d", ErrFormat, t.Name, t.Dims[0], t.Type, ti.blockSize)
	}
	blocks := n / ti.blockSize
	if blocks > math.MaxInt64/ti.typeBytes {
		return fmt.Errorf("%w: gguf: tensor %q too large", ErrFormat, t.Name)
	}
	t.Size = blocks * ti.typeBytes
	return nil
}

// Keys lists the metadata keys in file order.
func (g *GGUF) Keys() []string { return append([]string(nil), g.keys...) }

// Meta returns a metadata value: uint8…int64, float32, float64, bool,
// string, or a typed slice of those ([]string, []int32, []float32, …);
// nested arrays are []any.
func (g *GGUF) Meta(key string) (any, bool) {
	v, ok := g.meta[key]
	return v, ok
}

// String returns a string metadata value.
func (g *GGUF) String(key string) (string, bool) {
	s, ok := g.meta[key].(string)
	return s, ok
}

// Uint returns an integer metadata value of any integer type that is not
// negative.
func (g *GGUF) Uint(key string) (uint64, bool) {
	return toUint(g.meta[key])
}

// Float returns a float or integer metadata value as float64.
func (g *GGUF) Float(key string) (float64, bool) {
	switch v := g.meta[key].(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	if u, ok := toUint(g.meta[key]); ok {
		return float64(u), true
	}
	return 0, false
}

// Bool returns a bool metadata value.
func (g *GGUF) Bool(key string) (bool, bool) {
	b, ok := g.meta[key].(bool)
	return b, ok
}

// Strings returns a string-array metadata value (not a copy: do not modify).
func (g *GGUF) Strings(key string) ([]string, bool) {
	s, ok := g.meta[key].([]string)
	return s, ok
}

// Int32s returns an integer-array metadata value converted to int32
// (false when any element does not fit).
func (g *GGUF) Int32s(key string) ([]int32, bool) {
	switch v := g.meta[key].(type) {
	case []int32:
		return v, true
	case []uint8:
		return convInts(v)
	case []int8:
		return convInts(v)
	case []uint16:
		return convInts(v)
	case []int16:
		return convInts(v)
	case []uint32:
		return convInts(v)
	case []uint64:
		return convInts(v)
	case []int64:
		return convInts(v)
	}
	return nil, false
}

// Float32s returns a float-array metadata value as []float32.
func (g *GGUF) Float32s(key string) ([]float32, bool) {
	switch v := g.meta[key].(type) {
	case []float32:
		return v, true
	case []float64:
		out := make([]float32, len(v))
		for i, f := range v {
			out[i] = float32(f)
		}
		return out, true
	}
	return nil, false
}

func convInts[T uint8 | int8 | uint16 | int16 | uint32 | uint64 | int64](v []T) ([]int32, bool) {
	out := make([]int32, len(v))
	for i, x := range v {
		if int64(x) < math.MinInt32 || int64(x) > math.MaxInt32 || (x > 0 && uint64(x) > math.MaxInt32) {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

func toUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Tensors returns the tensor directory in file order.
func (g *GGUF) Tensors() []TensorInfo { return append([]TensorInfo(nil), g.tensors...) }

// TensorInfo returns one directory entry.
func (g *GGUF) TensorInfo(name string) (TensorInfo, bool) {
	i, ok := g.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return g.tensors[i], true
}

// TensorData returns a tensor's raw bytes (a view of the mapped file).
func (g *GGUF) TensorData(name string) (TensorInfo, []byte, error) {
	t, ok := g.TensorInfo(name)
	if !ok {
		return t, nil, fmt.Errorf("gguf tensor %q: not found", name)
	}
	if _, known := ggmlTypes[t.Type]; !known {
		return t, nil, fmt.Errorf("gguf tensor %q: unsupported type %s", name, t.Type)
	}
	if g.data == nil {
		return t, nil, fmt.Errorf("gguf tensor %q: file closed", name)
	}
	start := g.DataOffset + t.Offset
	return t, g.data[start : start+t.Size : start+t.Size], nil
}

// sortedNames returns the tensor names sorted.
func (g *GGUF) sortedNames() []string {
	out := make([]string, 0, len(g.tensors))
	for _, t := range g.tensors {
		out = append(out, t.Name)
	}
	sort.Strings(out)
	return out
}
