// Package cpu implements engine.Backend in pure Go (no cgo): an eager
// backend that computes every op at once in float32, stores F16/BF16 data as
// 16-bit words (converted on use), multiplies matrices on all cores, and
// multiplies MLX-affine-quantized weights without dequantizing them in
// memory (integer dot products against int16 activations, iq.go; or each
// weight row expanded on the fly, matmul.go).
//
// It is the reference backend used by CI, by tests and wherever MLX is
// absent. It owns only runners/engine/cpu: it must not import the model code
// (package engine's Load/Model), the weights loaders, or anything above the
// engine.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// Array is the cpu backend's engine.Array. Exactly one of the storage
// slices is set, matching dt; a KV cache view (kv != nil) refers to cache
// storage instead.
type Array struct {
	shape []int
	dims  [4]int // shape's storage for temporaries of up to 4 axes
	dt    engine.DType
	f32   []float32 // F32
	u16   []uint16  // F16, BF16
	i32   []int32   // I32
	u32   []uint32  // U32
	u8    []byte    // U8
	kv    *kvView   // cache view [Hkv, n, Dh] inside storage of capacity cap
	memo  []float32 // float32 copy of a 16-bit array used as scales/biases
	mxfp4 *weight   // an MXFP4 weight in 8-bit affine form (mxfp4.go)
	stk   *stacked  // a stacked expert weight prepared for GatherLinear (gather.go)
	iq    *iqLayout // a quantized weight's scales regrouped for iq.go
	// Temporaries (arena.go): owner is the backend whose step arena holds
	// the array, gen the step it belongs to; kept when Keep pinned it.
	kvv   kvView // kv's storage for views made in the arena
	owner *Backend
	gen   uint32
	kept  bool
}

// kvView is a window onto one layer's K or V cache storage: head h's token
// t lives at offset (h*cap+t)*dh.
type kvView struct {
	f32          []float32
	u16          []uint16
	dt           engine.DType
	heads, n, dh int
	cap          int
}

// Shape returns a copy of the shape.
func (a *Array) Shape() []int { return append([]int(nil), a.shape...) }

// DType returns the element type.
func (a *Array) DType() engine.DType { return a.dt }

func (a *Array) String() string { return fmt.Sprintf("cpu.Array(%v %v)", a.dt, a.shape) }

// Backend is the pure-Go backend. It is not safe for concurrent use (the
// runners serialize work per model); its ops use up to threads goroutines.
type Backend struct {
	threads int
	simd    bool // use the AVX2+FMA kernels (amd64 with both features)
	iq      bool // quantized weights multiply integer activations (iq.go)
	vnni    bool // iq.go's kernels may use AVX-512 VNNI (simd too)
	zmm     bool // iq.go's gemm may use 512-bit VNNI registers (vnni too)
	vbmi    bool // and unpack its 4-bit weights with AVX-512 VBMI (zmm too)

	pool  *pool // workers, started on first use (pool.go)
	arena arena // the step's temporaries (arena.go)
	// Per-op scratch reused across steps (the backend is not safe for
	// concurrent use, so one of each suffices).
	mm  matmulTask
	att attnTask
	// srcIdx is the gather ops' scratch index list (gather.go).
	srcIdx []int
	rope   ropeCache
	// batchOuts holds BatchAttention's per-row results until they are
	// concatenated (batch.go).
	batchOuts []engine.Array
	dimBuf    [3]int // BatchAttention's shapes (Reshape copies them)
}

// New returns a cpu backend using threads goroutines for the heavy ops;
// 0 means runtime.NumCPU().
func New(threads int) engine.Backend { return newBackend(threads) }

func newBackend(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	return &Backend{threads: threads, simd: hasSIMD(), vnni: hasVNNI(), zmm: hasVNNI512(), vbmi: hasVBMI(), iq: true}
}

// Name is "cpu".
func (b *Backend) Name() string { return "cpu" }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cpu: negative dimension in shape %v", slices.Clone(shape)))
		}
		n *= d
	}
	return n
}

func arr(a engine.Array) *Array {
	x, ok := a.(*Array)
	if !ok || x == nil {
		panic(fmt.Sprintf("cpu: array %T was not made by the cpu backend", a))
	}
	x.checkLive()
	return x
}

// heapF32 wraps data (not from the arena) as an F32 array.
func heapF32(shape []int, data []float32) *Array {
	return &Array{shape: append([]int(nil), shape...), dt: engine.F32, f32: data}
}

// FromBytes copies little-endian host bytes into a new array.
func (b *Backend) FromBytes(data []byte, shape []int, dt engine.DType) engine.Array {
	n := numel(shape)
	if len(data) != n*dt.Size() {
		panic(fmt.Sprintf("cpu: FromBytes: %d bytes for shape %v of %v (want %d)", len(data), shape, dt, n*dt.Size()))
	}
	a := &Array{shape: append([]int(nil), shape...), dt: dt}
	if nativeLittle {
		switch dt {
		case engine.F32:
			a.f32 = make([]float32, n)
			copy(asBytes(a.f32), data)
			return a
		case engine.F16, engine.BF16:
			a.u16 = make([]uint16, n)
			copy(asBytes(a.u16), data)
			return a
		case engine.I32:
			a.i32 = make([]int32, n)
			copy(asBytes(a.i32), data)
			return a
		case engine.U32:
			a.u32 = make([]uint32, n)
			copy(asBytes(a.u32), data)
			return a
		}
	}
	switch dt {
	case engine.F32:
		a.f32 = make([]float32, n)
		for i := range a.f32 {
			a.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case engine.F16, engine.BF16:
		a.u16 = make([]uint16, n)
		for i := range a.u16 {
			a.u16[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
	case engine.I32:
		a.i32 = make([]int32, n)
		for i := range a.i32 {
			a.i32[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case engine.U32:
		a.u32 = make([]uint32, n)
		for i := range a.u32 {
			a.u32[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
	case engine.U8:
		a.u8 = append([]byte(nil), data...)
	default:
		panic(fmt.Sprintf("cpu: FromBytes: unsupported dtype %v", dt))
	}
	return a
}

// FromFloat32 copies data into a new F32 array.
func (b *Backend) FromFloat32(data []float32, shape ...int) engine.Array {
	if len(data) != numel(shape) {
		panic(fmt.Sprintf("cpu: FromFloat32: %d values for shape %v", len(data), shape))
	}
	out := b.newF32(shape...)
	copy(out.f32, data)
	return out
}

// FromInt32 copies data into a new I32 array.
func (b *Backend) FromInt32(data []int32, shape ...int) engine.Array {
	if len(data) != numel(shape) {
		panic(fmt.Sprintf("cpu: FromInt32: %d values for shape %v", len(data), shape))
	}
	out := b.header(shape)
	out.dt = engine.I32
	out.i32 = b.int32s(len(data))
	copy(out.i32, data)
	return out
}

// Bytes returns a's contents as little-endian bytes in its dtype.
func (b *Backend) Bytes(x engine.Array) ([]byte, error) {
	a := materialize(arr(x))
	n := numel(a.shape)
	out := make([]byte, n*a.dt.Size())
	if nativeLittle {
		switch a.dt {
		case engine.F32:
			copy(out, asBytes(a.f32))
			return out, nil
		case engine.F16, engine.BF16:
			copy(out, asBytes(a.u16))
			return out, nil
		case engine.I32:
			copy(out, asBytes(a.i32))
			return out, nil
		case engine.U32:
			copy(out, asBytes(a.u32))
			return out, nil
		}
	}
	switch a.dt {
	case engine.F32:
		for i, v := range a.f32 {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case engine.F16, engine.BF16:
		for i, v := range a.u16 {
			binary.LittleEndian.PutUint16(out[2*i:], v)
		}
	case engine.I32:
		for i, v := range a.i32 {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(v))
		}
	case engine.U32:
		for i, v := range a.u32 {
			binary.LittleEndian.PutUint32(out[4*i:], v)
		}
	case engine.U8:
		copy(out, a.u8)
	default:
		return nil, fmt.Errorf("cpu: Bytes: unsupported dtype %v", a.dt)
	}
	return out, nil
}

// Float32 returns a's contents converted to float32 (a copy).
func (b *Backend) Float32(x engine.Array) ([]float32, error) {
	a := arr(x)
	switch a.dt {
	case engine.F32, engine.F16, engine.BF16, engine.I32, engine.U32, engine.U8:
	default:
		return nil, fmt.Errorf("cpu: Float32: unsupported dtype %v", a.dt)
	}
	f := floats(a)
	if a.dt == engine.F32 && a.kv == nil {
		f = append([]float32(nil), f...)
	}
	return f, nil
}

// Eval is a no-op: every op has already run.
func (b *Backend) Eval(arrays ...engine.Array) error { return nil }

// Keep pins arrays: a temporary's data moves off the step arena, so later
// sweeps leave it alone. Arrays from FromBytes need nothing.
func (b *Backend) Keep(arrays ...engine.Array) {
	for _, x := range arrays {
		b.keep(arr(x))
	}
}

// Free with no arguments ends the step: every temporary made since the last
// sweep and not kept is released, and its storage serves the next step.
// Free of given arrays is a no-op (the Go GC owns what is not in the
// arena, and arena storage is reclaimed only by the sweep).
func (b *Backend) Free(arrays ...engine.Array) {
	if len(arrays) == 0 {
		b.sweep()
	}
}

// Float32Into is Float32 into dst's storage when it has the capacity
// (growing it otherwise): the engine reads a step's logits with it so
// that a decode step allocates nothing.
func (b *Backend) Float32Into(dst []float32, x engine.Array) ([]float32, error) {
	a := arr(x)
	if a.dt != engine.F32 || a.kv != nil {
		f, err := b.Float32(x)
		return append(dst[:0], f...), err
	}
	return append(dst[:0], a.f32...), nil
}

// materialize returns a contiguous array (copying a cache view).
func materialize(a *Array) *Array {
	if a.kv == nil {
		return a
	}
	v := a.kv
	out := &Array{shape: []int{v.heads, v.n, v.dh}, dt: v.dt}
	n := v.heads * v.n * v.dh
	if v.dt == engine.F32 {
		out.f32 = make([]float32, n)
	} else {
		out.u16 = make([]uint16, n)
	}
	for h := 0; h < v.heads; h++ {
		src := h * v.cap * v.dh
		dst := h * v.n * v.dh
		if v.dt == engine.F32 {
			copy(out.f32[dst:dst+v.n*v.dh], v.f32[src:])
		} else {
			copy(out.u16[dst:dst+v.n*v.dh], v.u16[src:])
		}
	}
	return out
}

// floats returns a's values as contiguous float32, without copying when a
// is a contiguous F32 array (callers must not write to the result then).
// vals is floats for an op's input within a step: a 16-bit array is
// widened into the step arena instead of a fresh slice (the result dies
// with the step; use halfFloats for weights).
func (b *Backend) vals(a *Array) []float32 {
	a = materialize(a)
	switch a.dt {
	case engine.F16:
		out := b.floats(len(a.u16))
		f16ToF32(out, a.u16)
		return out
	case engine.BF16:
		out := b.floats(len(a.u16))
		bf16ToF32(out, a.u16)
		return out
	}
	return floats(a)
}

func floats(a *Array) []float32 {
	a = materialize(a)
	switch a.dt {
	case engine.F32:
		return a.f32
	case engine.F16:
		out := make([]float32, len(a.u16))
		f16ToF32(out, a.u16)
		return out
	case engine.BF16:
		out := make([]float32, len(a.u16))
		bf16ToF32(out, a.u16)
		return out
	case engine.I32:
		out := make([]float32, len(a.i32))
		for i, v := range a.i32 {
			out[i] = float32(v)
		}
		return out
	case engine.U32:
		out := make([]float32, len(a.u32))
		for i, v := range a.u32 {
			out[i] = float32(v)
		}
		return out
	case engine.U8:
		out := make([]float32, len(a.u8))
		for i, v := range a.u8 {
			out[i] = float32(v)
		}
		return out
	}
	panic(fmt.Sprintf("cpu: cannot read %v as float32", a.dt))
}

// Half-precision conversions. The scalar rounding lives in
// runners/internal/half; the bulk widening here only adds the AVX2/F16C
// fast path (the assembly) in front of the shared scalar tail.

func bf16ToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := 0
	if halfSIMD && len(src) >= 8 {
		i = len(src) &^ 7
		bf16WidenAVX(&src[0], &dst[0], i)
	}
	for ; i < len(src); i++ {
		dst[i] = half.BF16ToF32(src[i])
	}
}

func f16ToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := 0
	if halfSIMD && len(src) >= 8 {
		i = len(src) &^ 7
		f16WidenAVX(&src[0], &dst[0], i)
	}
	for ; i < len(src); i++ {
		dst[i] = half.F16ToF32(src[i])
	}
}

// toHalf converts float32 values to 16-bit words of dtype dt.
func toHalf(dst []uint16, src []float32, dt engine.DType) {
	if dt == engine.BF16 {
		half.NarrowBF16(dst, src)
		return
	}
	half.NarrowF16(dst, src)
}

// halfToF32 converts 16-bit words of dtype dt to float32.
func halfToF32(dst []float32, src []uint16, dt engine.DType) {
	if dt == engine.BF16 {
		bf16ToF32(dst, src)
		return
	}
	f16ToF32(dst, src)
}
