//go:build cgo && (linux || darwin)

package mlx

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// array is the backend's engine.Array: one mlx_array handle plus its shape
// and dtype, read once when the op made it (shapes are known before
// evaluation).
type array struct {
	h     C.xmx_array
	shape []int // shp[:ndim] when it fits there
	shp   [inlineDims]int
	owner *backend
	mdt   C.int
	dt    engine.DType
	kept  bool // pinned: Free() sweeps leave it alone
	freed bool // handle released; any further use panics
	// ready is set once the MLX thread has filled h, shape and dt: an op
	// returns its array at once and the thread makes it later, in order.
	ready atomic.Bool
	// The op that will make it, until the MLX thread runs it (written
	// before posting, read and cleared on the thread): run with its
	// inputs in args (the common ops: no closure to allocate), or
	// pending.
	run     opFunc
	args    opArgs
	pending func() *array
}

// inlineDims is how many dimensions an array's shape holds without an
// allocation of its own (a decode step's arrays have at most four).
const inlineDims = 4

// opFunc makes the array of a queued op from a.args, on the MLX thread.
// Only package-level functions are used: a func value that captures
// nothing costs no allocation.
type opFunc func(b *backend, a *array) *array

// opArgs are the inputs of a queued op.
type opArgs struct {
	x, y, z engine.Array
	lin     *engine.Linear
	rope    *engine.RoPE
	ints    [inlineDims]int
	long    []int // the ints instead, where they do not fit
	f       float32
	n       uint8 // ints used (a shape's or a permutation's length)
}

// setShape makes a's shape a copy of the n dimensions at dims.
func (a *array) setShape(dims []int) {
	if len(dims) <= inlineDims {
		a.shape = a.shp[:len(dims)]
	} else {
		a.shape = make([]int, len(dims))
	}
	copy(a.shape, dims)
}

// Shape returns the shape, waiting for the MLX thread to make the array.
func (a *array) Shape() []int { a.wait(); return slices.Clone(a.shape) }

// DType returns the element type, waiting as Shape does.
func (a *array) DType() engine.DType { a.wait(); return a.dt }

func (a *array) String() string {
	if !a.ready.Load() {
		return "mlx.array(pending)"
	}
	return fmt.Sprintf("mlx.array(%v %v)", a.dt, a.shape)
}

// wait returns once the thread has made a, re-raising the failure of the
// op that should have made it.
func (a *array) wait() {
	if a.ready.Load() {
		return
	}
	a.owner.do(func() {})
	if !a.ready.Load() {
		panic(fmt.Errorf("%w: mlx: array of an op that failed earlier", engine.ErrBackend))
	}
}

// backend implements engine.Backend on one MLX device. Every method runs its
// work on the backend's own goroutine, locked to one OS thread for its whole
// life (MLX streams belong to threads); callers are serialized by mu.
type backend struct {
	name   string
	dev    C.xmx_device
	stream C.xmx_stream
	log    *slog.Logger
	// lib and version: the libmlxc loaded and the MLX version it reports.
	lib, version string

	thread *osThread

	// Owned by the MLX thread.
	temps []*array // made since the last Free() sweep
	spare []*array // op results whose handles placeholders took (recycle)
	// res is where mk's mlx-c call writes its handle (an allocation of
	// its own, holding no Go pointers).
	res *C.xmx_array
	// ci is scratch for the int arguments of mlx-c calls (shapes, axes,
	// slice bounds), used between building them and the call.
	ci      [4][cIntsScratch]C.int
	freeBuf []C.xmx_array     // releaseTempsExcept's handles, reused
	pinned  map[*array]bool   // kept arrays, released by Close
	qmmErr  error             // why quantized_matmul cannot run here (nil: it can)
	fused   C.xmx_closure     // compiled SwiGLU; ctx nil when fuseErr != nil
	fuseErr error             // why SwiGLU runs unfused (nil: it is fused)
	deq     map[*array]*array // dequantized copies of quantized weights when qmmErr != nil, float32 copies of experts when gmmHalfErr != nil
	freqs   map[engine.RoPE]ropeFreqs
	consts  map[constKey]*array // kept constants (scalar, ropeRows)
	// On the CPU device (fallbackErr nil): rope's rotation compiled, one
	// compiled rms_norm per (width, eps), and the cosine/sine tables of
	// the positions lately rotated (a decode step's layers share one).
	// fallbackErr says why rope and rms_norm build MLX's fallback graphs
	// instead (not the CPU, no fusion, or the compile failed).
	ropeFused C.xmx_closure
	norms     map[normKey]C.xmx_closure
	ropeTabs  []ropeTab
	rowTab    rowTab // RoPERows' stacked tables of the step's positions
	// slabErr says why a batched decode's attention runs row by row
	// (nil: it runs over a slab, batch.go).
	slabErr     error
	fallbackErr error
	// wT holds the transposed view of each kept dense weight a product
	// used (kept, released with the weight): a decode step then builds
	// no transpose per product.
	wT map[*array]*array

	// Why gather_mm cannot take 16-bit floats here (MLX's CPU backend:
	// float32 only); nil: it can.
	gmmHalfErr error
	// readerLoad: FromBytes makes arrays of readerLoadMin bytes or more
	// through MLX's safetensors loader with huge-page advice (see
	// fromBytes); set by init on Linux's CPU device when libmlxc has the
	// functions. hugeMiB sums the MiB of buffers advised so far.
	readerLoad bool
	hugeMiB    int
	// mlx_eval calls so far (tests count synchronizations).
	evals int
	// made counts the arrays ops have made (benchmarks: the graph's size
	// per step, against mlx-lm's).
	made atomic.Int64
	// evalNanos is the time spent inside MLX's eval (the computation and
	// the wait for it, a read-back's included), summed: the benchmarks
	// subtract it from a step's time to get the host's share (building
	// and queueing the graph; async_eval's scheduling, which may wait for
	// the stream, counts as eval).
	evalNanos atomic.Int64
	// evalStart is when the evaluation now running began (UnixNano), 0
	// when none runs: a Collective's watchdog reads it (a collective
	// whose peer died never returns).
	evalStart atomic.Int64
}

// normKey picks a compiled rms_norm: its trace bakes in eps and 1/width.
type normKey struct {
	width int
	eps   float32
}

// ropeTabKey is what a rotation table depends on.
type ropeTabKey struct {
	offset, l, dims int
	mdt             C.int
	hasBase         bool
	base            float32
	periods         *array // scaled schemes' periods (kept), or nil
}

// ropeTab holds the cosines and sines ([1, L, dims/2], kept) of one key.
type ropeTab struct {
	key  ropeTabKey
	c, s *array
}

// maxRopeTabs bounds the tables kept (one per sequence of a decode batch),
// maxRopeTabValues their size (the newest is kept whatever its size).
const (
	maxRopeTabs      = 16
	maxRopeTabValues = 1 << 18
)

// ropeFreqs caches a scaled RoPE's periods (kept) and attention factor.
type ropeFreqs struct {
	periods *array
	attn    float32
}

// New loads mlx-c and returns a Backend on the requested device, or an error
// wrapping ErrUnavailable (no library) or ErrDevice (no such device).
func New(opts Options) (engine.Backend, error) {
	b, err := newBackend(opts)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func newBackend(opts Options) (*backend, error) {
	path, version, err := loadLibrary(opts)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &backend{
		lib:     path,
		version: version,
		log:     log,
		thread:  startThread(),
		res:     new(C.xmx_array),
		pinned:  map[*array]bool{},
		deq:     map[*array]*array{},
		wT:      map[*array]*array{},
		freqs:   map[engine.RoPE]ropeFreqs{},
		consts:  map[constKey]*array{},
		norms:   map[normKey]C.xmx_closure{},
	}
	var initErr error
	b.do(func() { initErr = b.init(opts.Device) })
	if initErr != nil {
		b.stop()
		return nil, initErr
	}
	attrs := []any{"lib", path, "version", version, "device", b.name}
	if b.qmmErr != nil {
		log.Warn("mlx: quantized matmul unavailable on this device; quantized weights are dequantized once at first use",
			append(attrs, "reason", b.qmmErr.Error())...)
	}
	if b.name == "mlx-gpu" && runtime.GOOS == "linux" {
		// MLX CUDA caches the PTX it compiles under the same directory.
		if err := jitDirProblem(jitDir(os.Getenv), os.Geteuid()); err != nil {
			log.Warn("mlx: unsafe JIT cache directory", append(attrs, "reason", err.Error())...)
		}
	}
	if b.fuseErr != nil {
		log.Info("mlx: kernel fusion unavailable; the MLP activation runs as separate ops",
			append(attrs, "reason", b.fuseErr.Error())...)
	}
	if b.fallbackErr != nil && b.name == "mlx-cpu" {
		log.Info("mlx: rope and rms_norm are not compiled; MLX's CPU backend builds their graphs at each call",
			append(attrs, "reason", b.fallbackErr.Error())...)
	}
	if b.gmmHalfErr != nil {
		log.Debug("mlx: gather_mm takes only float32 here; 16-bit dense experts get a float32 copy at first use",
			append(attrs, "reason", b.gmmHalfErr.Error())...)
	}
	log.Debug("mlx: backend ready", attrs...)
	return b, nil
}

// Describe says which library, MLX version and device a backend made by
// New runs on, and why quantized matmul or kernel fusion is unavailable
// there (nil: available); ok is false for any other backend.
func Describe(eb engine.Backend) (info Info, ok bool) {
	b, ok := eb.(*backend)
	if !ok {
		return Info{}, false
	}
	return Info{Lib: b.lib, Version: b.version, Device: b.name, QuantizedMatmul: b.qmmErr, Fusion: b.fuseErr}, true
}

// do runs f on the MLX thread after all posted work and re-raises in the
// caller its panic, or the first panic of posted work since the last do.
func (b *backend) do(f func()) {
	defer closedError()
	b.thread.do(f)
}

// post queues f for the MLX thread without waiting (see osThread).
func (b *backend) post(f func()) {
	defer closedError()
	b.thread.post(f)
}

func closedError() {
	if r := recover(); r != nil {
		if r == errThreadStopped {
			r = fmt.Errorf("%w: %w", engine.ErrBackend, errThreadStopped)
		}
		panic(r)
	}
}

// doErr runs f on the MLX thread and returns its error or its panic as an
// error.
func (b *backend) doErr(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
	}()
	b.do(func() { err = f() })
	return err
}

func panicError(r any) error {
	if e, ok := r.(error); ok {
		return e
	}
	if s, ok := r.(string); ok && strings.HasPrefix(s, "mlx: ") {
		return errors.New(s)
	}
	return fmt.Errorf("mlx: %v", r)
}

func (b *backend) stop() { b.thread.stop() }

// init picks the device and its default stream, and checks whether
// quantized matmul runs on it.
func (b *backend) init(device string) error {
	var gpu C.xmx_device
	if C.xmx_device_new(&gpu, 1) != 0 {
		return fmt.Errorf("%w: mlx: make gpu device: %s", ErrDevice, lastError())
	}
	var avail C.bool
	if C.xmx_device_available(&avail, gpu) != 0 {
		avail = false
	}
	useGPU := false
	switch device {
	case "", "auto":
		useGPU = bool(avail)
	case "gpu":
		if !avail {
			C.xmx_device_free(gpu)
			return fmt.Errorf("%w: MLX reports no GPU on this machine (this libmlx has neither Metal nor CUDA, or no device is present); use --device cpu", ErrDevice)
		}
		useGPU = true
	case "cpu":
	default:
		C.xmx_device_free(gpu)
		return fmt.Errorf("%w: unknown device %q (want gpu or cpu)", ErrDevice, device)
	}
	if useGPU {
		b.dev = gpu
		b.name = "mlx-gpu"
	} else {
		C.xmx_device_free(gpu)
		if C.xmx_device_new(&b.dev, 0) != 0 {
			return fmt.Errorf("%w: mlx: make cpu device: %s", ErrDevice, lastError())
		}
		b.name = "mlx-cpu"
	}
	if C.xmx_default_stream(&b.stream, b.dev) != 0 {
		return fmt.Errorf("%w: mlx: default stream of %s: %s", ErrDevice, b.name, lastError())
	}
	b.qmmErr = b.probeQuantizedMatmul()
	b.fuseErr = b.probeFusion()
	b.fallbackErr = b.compileFallbacks()
	if !C.xmx_has_put_along_axis() {
		b.slabErr = errors.New("mlx-c has no mlx_put_along_axis")
	}
	b.gmmHalfErr = b.probeGatherMMHalf()
	b.readerLoad = !useGPU && runtime.GOOS == "linux" && C.xmx_has_reader_load() != 0
	return nil
}

// probeFusion compiles SwiGLU with mlx_compile and checks, on a small
// input, that it runs and matches the unfused ops. MLX fuses on Metal and
// CUDA by itself; on its CPU backend it generates C++ and runs g++ at the
// first use of each kernel, so a machine without a compiler ends here and
// SwiGLU stays three ops.
func (b *backend) probeFusion() (err error) {
	if C.xmx_has_compile() == 0 {
		return errors.New("libmlxc has no mlx_compile")
	}
	if b.name == "mlx-cpu" {
		if err := jitDirProblem(jitDir(os.Getenv), os.Geteuid()); err != nil {
			return err
		}
	}
	var f C.xmx_closure
	if C.xmx_swiglu_compile(&f, b.stream) != 0 {
		return mlxErr("compile")
	}
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
		if err != nil {
			C.xmx_closure_free(f)
		}
		b.sweep()
	}()
	const n = 64
	gv, uv := make([]float32, n), make([]float32, n)
	for i := range gv {
		gv[i], uv[i] = float32(i-n/2)/8, float32(i%5)-2
	}
	g := b.fromBytes(unsafe.Slice((*byte)(unsafe.Pointer(&gv[0])), 4*n), []int{2, n / 2}, engine.F32)
	u := b.fromBytes(unsafe.Slice((*byte)(unsafe.Pointer(&uv[0])), 4*n), []int{2, n / 2}, engine.F32)
	fused := b.mk("compiled swiglu", func(r *C.xmx_array) C.int { return C.xmx_apply2(r, f, g.h, u.h) })
	plain := b.swigluOps(g, u)
	if err := b.eval(fused, plain); err != nil {
		return err
	}
	fb, err := b.hostBytes(fused)
	if err != nil {
		return err
	}
	pb, err := b.hostBytes(plain)
	if err != nil {
		return err
	}
	for i := range n {
		x := math.Float32frombits(binary.LittleEndian.Uint32(fb[4*i:]))
		y := math.Float32frombits(binary.LittleEndian.Uint32(pb[4*i:]))
		if math.Abs(float64(x-y)) > 1e-6*(1+math.Abs(float64(y))) {
			return fmt.Errorf("compiled swiglu gives %v at %d, the ops give %v", x, i, y)
		}
	}
	b.fused = f
	return nil
}

// probeQuantizedMatmul runs a tiny 4-bit quantized matmul and reports why
// it failed, if it did (exo found it missing on MLX CUDA).
func (b *backend) probeQuantizedMatmul() (err error) {
	if C.xmx_has_qmm() == 0 {
		return errors.New("libmlxc has no mlx_quantized_matmul")
	}
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
		b.sweep()
	}()
	const in, out, group, bits = 64, 8, 32, 4
	x := b.fromBytes(make([]byte, in*4), []int{1, in}, engine.F32)
	w := b.fromBytes(make([]byte, out*in*bits/8), []int{out, in * bits / 32}, engine.U32)
	s := b.fromBytes(make([]byte, out*in/group*4), []int{out, in / group}, engine.F32)
	y := b.mk("quantized_matmul", func(r *C.xmx_array) C.int {
		return C.xmx_qmm(r, x.h, w.h, s.h, s.h, group, bits, b.stream)
	})
	return b.eval(y)
}

func lastError() string { return C.GoString(C.xmx_last_error()) }

// mlxErr is the error for a failed mlx-c call.
func mlxErr(op string) error {
	return fmt.Errorf("%w: mlx %s: %s", engine.ErrBackend, op, lastError())
}

// mk runs one mlx-c op writing a new handle and tracks the result as a
// temporary. On failure it panics with an error wrapping engine.ErrBackend.
// The handle is written to b.res (a Go local whose address went to C would
// be a heap allocation per op; cgo's pointer check rejects the address of
// a field of an object holding Go pointers, such as an array).
func (b *backend) mk(op string, f func(res *C.xmx_array) C.int) *array {
	*b.res = C.xmx_array{}
	rc := f(b.res)
	h := *b.res
	*b.res = C.xmx_array{}
	if rc != 0 {
		if h.ctx != nil {
			C.xmx_array_free(h)
		}
		panic(mlxErr(op))
	}
	return b.track(h)
}

// newArray returns an empty array of b, reusing one an op's result left
// (adopt) when there is one.
func (b *backend) newArray() *array {
	if n := len(b.spare); n > 0 {
		a := b.spare[n-1]
		b.spare[n-1] = nil
		b.spare = b.spare[:n-1]
		return a
	}
	return &array{owner: b}
}

// maxSpare bounds the arrays kept for reuse.
const maxSpare = 64

// recycle keeps r, an op's result whose handle another array took over,
// for newArray. Nothing else refers to it: the op made it (adoptSince
// checks) and handed out only the placeholder.
func (b *backend) recycle(r *array) {
	if r.kept || len(b.spare) >= maxSpare {
		return
	}
	*r = array{owner: b}
	b.spare = append(b.spare, r)
}

// track tracks a new handle as a temporary.
func (b *backend) track(h C.xmx_array) *array {
	a := b.newArray()
	a.h = h
	return b.trackIn(a)
}

// trackIn reads the shape and dtype of a.h and tracks a as a temporary.
func (b *backend) trackIn(a *array) *array {
	info := C.xmx_info(a.h)
	n := int(info.ndim)
	if n <= inlineDims {
		a.shape = a.shp[:n]
	} else {
		a.shape = make([]int, n)
	}
	if n > 0 {
		for i, d := range unsafe.Slice(info.shape, n) {
			a.shape[i] = int(d)
		}
	}
	a.mdt = info.dtype
	a.dt = fromMLX(a.mdt)
	a.ready.Store(true)
	b.temps = append(b.temps, a)
	b.made.Add(1)
	return a
}

// adopt makes the placeholder a (returned to the caller before the thread
// ran the op) stand for r, the new array the op made.
func (b *backend) adopt(a, r *array) { b.adoptSince(a, r, -1) }

// adoptSince is adopt for a result the op made after the temporaries'
// count was since (-1: unknown): such a result was never handed out, so
// it is recycled.
func (b *backend) adoptSince(a, r *array, since int) {
	for i := len(b.temps) - 1; i >= 0; i-- {
		if b.temps[i] == r {
			b.temps[i] = a
			a.h, a.dt, a.mdt = r.h, r.dt, r.mdt
			a.setShape(r.shape)
			r.freed = true // the handle is a's now
			a.ready.Store(true)
			if since >= 0 && i >= since {
				b.recycle(r)
			}
			return
		}
	}
	panic("mlx: internal error: an op returned an array it did not make")
}

// release frees one array's handle now (MLX keeps the buffer while lazy
// graphs still refer to it).
func (b *backend) release(a *array) {
	if a == nil || a.freed {
		return
	}
	a.freed = true
	C.xmx_array_free(a.h)
	if !a.kept {
		return // pinned, deq and wT hold kept arrays only
	}
	delete(b.pinned, a)
	if d, ok := b.deq[a]; ok {
		delete(b.deq, a)
		b.release(d)
	}
	if t, ok := b.wT[a]; ok {
		delete(b.wT, a)
		b.release(t)
	}
}

// weightT returns w transposed ([out, in] → [in, out]): for a kept weight
// the one view made at its first use.
func (b *backend) weightT(w *array) *array {
	if !w.kept {
		return b.transpose(w, 1, 0)
	}
	if t, ok := b.wT[w]; ok && !t.freed {
		return t
	}
	t := b.transpose(w, 1, 0)
	b.keep(t)
	b.wT[w] = t
	return t
}

// keep pins a (on the MLX thread).
func (b *backend) keep(a *array) {
	a.kept = true
	b.pinned[a] = true
}

// sweep frees every temporary that is not kept.
func (b *backend) sweep() {
	for i, a := range b.temps {
		if !a.kept {
			b.release(a)
		}
		b.temps[i] = nil
	}
	b.temps = b.temps[:0]
}

// arr checks that x is a live array of this backend.
func (b *backend) arr(x engine.Array) *array {
	a, ok := x.(*array)
	switch {
	case !ok || a == nil:
		panic(fmt.Sprintf("mlx: array %T from another backend", x))
	case a.owner != b:
		panic("mlx: array belongs to another mlx backend")
	case a.freed:
		panic(fmt.Sprintf("mlx: use of freed array %v %v", a.dt, a.shape))
	case !a.ready.Load():
		panic(fmt.Errorf("%w: mlx: use of an array whose op failed", engine.ErrBackend))
	}
	return a
}

// dtypes pairs our element types with MLX's (read-only).
var dtypes = [...]struct {
	e engine.DType
	m C.int
}{
	{engine.F32, C.XMX_FLOAT32}, {engine.F16, C.XMX_FLOAT16}, {engine.BF16, C.XMX_BFLOAT16},
	{engine.I32, C.XMX_INT32}, {engine.U32, C.XMX_UINT32}, {engine.U8, C.XMX_UINT8},
}

func toMLX(dt engine.DType) C.int {
	for _, p := range dtypes {
		if p.e == dt {
			return p.m
		}
	}
	panic(fmt.Sprintf("mlx: unsupported dtype %v", dt))
}

// fromMLX maps an MLX dtype to ours; 0 for dtypes only used internally.
func fromMLX(d C.int) engine.DType {
	for _, p := range dtypes {
		if p.m == d {
			return p.e
		}
	}
	return 0
}

func cInts(v []int) []C.int {
	out := make([]C.int, len(v))
	for i, x := range v {
		out[i] = C.int(x)
	}
	return out
}

// cIntsScratch is how many ints one scratch slot holds.
const cIntsScratch = 8

// cints returns v as C ints in scratch slot i (on the MLX thread; valid
// until the slot's next use), or in a new slice when v does not fit.
func (b *backend) cints(i int, v []int) []C.int {
	if len(v) > cIntsScratch {
		return cInts(v)
	}
	out := b.ci[i][:len(v)]
	for j, x := range v {
		out[j] = C.int(x)
	}
	return out
}

// cfill returns n copies of x in scratch slot i, as cints does.
func (b *backend) cfill(i, n int, x C.int) []C.int {
	var out []C.int
	if n > cIntsScratch {
		out = make([]C.int, n)
	} else {
		out = b.ci[i][:n]
	}
	for j := range out {
		out[j] = x
	}
	return out
}

func intsPtr(v []C.int) *C.int {
	if len(v) == 0 {
		return nil
	}
	return &v[0]
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// ---- engine.Backend ----

func (b *backend) Name() string { return b.name }

// Close stops the MLX thread after releasing every array this backend still
// tracks. Arrays and caches must not be used afterwards.
func (b *backend) Close() error {
	_ = b.doErr(func() error { return nil }) // a failure of posted work, already reported or moot
	err := b.doErr(func() error {
		b.sweep()
		for a := range b.pinned {
			b.release(a) // weights and caches still held
		}
		clear(b.freqs)
		clear(b.consts)
		b.ropeTabs = nil
		for k, f := range b.norms {
			if f.ctx != nil {
				C.xmx_closure_free(f)
			}
			delete(b.norms, k)
		}
		if b.ropeFused.ctx != nil {
			C.xmx_closure_free(b.ropeFused)
			b.ropeFused.ctx = nil
		}
		if b.fused.ctx != nil {
			C.xmx_closure_free(b.fused)
			b.fused.ctx = nil
		}
		C.xmx_stream_free(b.stream)
		C.xmx_device_free(b.dev)
		return nil
	})
	b.stop()
	return err
}

func (b *backend) fromBytes(data []byte, shape []int, dt engine.DType) *array {
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("mlx: FromBytes: negative dimension in %v", shape))
		}
	}
	n := numel(shape)
	if len(data) != n*dt.Size() {
		panic(fmt.Sprintf("mlx: FromBytes: %d bytes for %v %v (want %d)", len(data), dt, shape, n*dt.Size()))
	}
	cs := b.cints(0, shape)
	if n == 0 {
		return b.mk("zeros", func(r *C.xmx_array) C.int {
			return C.xmx_zeros(r, intsPtr(cs), C.size_t(len(cs)), toMLX(dt), b.stream)
		})
	}
	if b.readerLoad && len(data) >= readerLoadMin {
		return b.loadViaReader(data, shape, dt)
	}
	return b.mk("array_new_data", func(r *C.xmx_array) C.int {
		return C.xmx_array_from(r, unsafe.Pointer(&data[0]), intsPtr(cs), C.int(len(cs)), toMLX(dt))
	})
}

// readerLoadMin is the size from which fromBytes loads through MLX's
// safetensors reader: a buffer of 4 MiB holds at least one aligned 2 MiB
// page wherever it starts.
const readerLoadMin = 4 << 20

// loadViaReader makes the array as mlx.core.load would from a safetensors
// file (xmx_array_load: a one-tensor stream over data), which lets the
// stream's read see MLX's freshly allocated buffer before anything is
// written to it and advise it as transparent huge pages.
//
// Why: on MLX's CPU device the decode step of a model in f32 runs the BLAS
// sgemm over every weight once per token, and how fast that reads the
// weights depends on the pages behind them. Copied into plain 4 KiB pages
// (mlx_array_new_data) the same weight ran 5-12 % slower or faster from one
// allocation to the next in one process, whichever loader made it; huge
// pages gave every weight the fast end (docs/BENCHMARKS.md, "Weight pages:
// the 8B-shaped f32 gap"). Weights are read whole on every step, so the
// 2 MiB granularity costs nothing.
func (b *backend) loadViaReader(data []byte, shape []int, dt engine.DType) *array {
	hdr := safetensorsHeader(shape, dt, len(data))
	var advised C.int
	a := b.mk("load_safetensors_reader", func(r *C.xmx_array) C.int {
		return C.xmx_array_load(r, (*C.char)(unsafe.Pointer(unsafe.SliceData(hdr))), C.size_t(len(hdr)),
			unsafe.Pointer(&data[0]), C.size_t(len(data)), 1, &advised, b.stream)
	})
	b.hugeMiB += int(advised)
	return a
}

// dataAddr is the address of a's buffer, evaluating it first (tests: where
// its pages lie). On the MLX thread.
func (b *backend) dataAddr(a *array) (uintptr, error) {
	if err := b.eval(a); err != nil {
		return 0, err
	}
	return uintptr(C.xmx_data(a.h, a.mdt)), nil
}

// safetensorsHeader is the JSON header of a safetensors stream holding one
// tensor, "w", of n bytes.
func safetensorsHeader(shape []int, dt engine.DType, n int) []byte {
	name := map[engine.DType]string{engine.F32: "F32", engine.F16: "F16", engine.BF16: "BF16",
		engine.I32: "I32", engine.U32: "U32", engine.U8: "U8"}[dt]
	if name == "" {
		panic(fmt.Sprintf("mlx: no safetensors name for dtype %v", dt))
	}
	h := append([]byte(`{"w":{"dtype":"`), name...)
	h = append(h, `","shape":[`...)
	for i, d := range shape {
		if i > 0 {
			h = append(h, ',')
		}
		h = strconv.AppendInt(h, int64(d), 10)
	}
	h = append(h, `],"data_offsets":[0,`...)
	h = strconv.AppendInt(h, int64(n), 10)
	return append(h, "]}}"...)
}

// syncFromBytes is the size above which FromBytes copies on the MLX thread
// while the caller waits (weights) instead of copying the bytes first and
// posting the work (token ids, small inputs).
const syncFromBytes = 64 << 10

func (b *backend) FromBytes(data []byte, shape []int, dt engine.DType) engine.Array {
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("mlx: FromBytes: negative dimension in %v", shape))
		}
	}
	if len(data) != numel(shape)*dt.Size() {
		panic(fmt.Sprintf("mlx: FromBytes: %d bytes for %v %v (want %d)", len(data), dt, shape, numel(shape)*dt.Size()))
	}
	toMLX(dt) // panics now for a dtype MLX cannot hold
	if len(data) > syncFromBytes {
		var r *array
		b.do(func() { r = b.fromBytes(data, shape, dt) })
		return r
	}
	own, sh := bytes.Clone(data), slices.Clone(shape)
	return b.op(func() *array { return b.fromBytes(own, sh, dt) })
}

func (b *backend) FromFloat32(data []float32, shape ...int) engine.Array {
	return b.FromBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), 4*len(data)), shape, engine.F32)
}

func (b *backend) FromInt32(data []int32, shape ...int) engine.Array {
	return b.FromBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), 4*len(data)), shape, engine.I32)
}

// hostBytes evaluates a as a row-major array and copies its bytes out.
// F16/BF16 are read through a uint16 view: mlx-c has no half-precision
// accessors on x86, and the raw 16-bit words are what we want anyway.
func (b *backend) hostBytes(a *array) ([]byte, error) {
	if a.dt == 0 {
		return nil, fmt.Errorf("mlx: Bytes of an array with internal dtype %d", int(a.mdt))
	}
	size := numel(a.shape) * a.dt.Size()
	if size == 0 {
		return []byte{}, nil
	}
	c := b.mk("contiguous", func(r *C.xmx_array) C.int { return C.xmx_contiguous(r, a.h, b.stream) })
	defer b.release(c)
	if a.dt == engine.F16 || a.dt == engine.BF16 {
		v := b.mk("view", func(r *C.xmx_array) C.int { return C.xmx_view(r, c.h, C.XMX_UINT16, b.stream) })
		defer b.release(v)
		c = v
	}
	if err := b.eval(c); err != nil {
		return nil, err
	}
	p := C.xmx_data(c.h, c.mdt)
	if p == nil {
		return nil, mlxErr("array data")
	}
	return C.GoBytes(p, C.int(size)), nil
}

func (b *backend) Bytes(x engine.Array) ([]byte, error) {
	var out []byte
	err := b.doErr(func() error {
		var err error
		out, err = b.hostBytes(b.arr(x))
		return err
	})
	return out, err
}

func (b *backend) Float32(x engine.Array) ([]float32, error) {
	var out []float32
	err := b.doErr(func() error {
		a := b.arr(x)
		if a.dt != engine.F32 {
			a = b.mk("astype", func(r *C.xmx_array) C.int { return C.xmx_astype(r, b.arr(x).h, C.XMX_FLOAT32, b.stream) })
			defer b.release(a)
		}
		raw, err := b.hostBytes(a)
		if err != nil {
			return err
		}
		out = make([]float32, len(raw)/4)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(raw)), raw)
		return nil
	})
	return out, err
}

func (b *backend) eval(arrays ...*array) error {
	if len(arrays) == 0 {
		return nil
	}
	hs := make([]C.xmx_array, len(arrays))
	for i, a := range arrays {
		hs[i] = a.h
	}
	b.evals++
	t0 := time.Now()
	b.evalStart.Store(t0.UnixNano())
	defer func() {
		b.evalStart.Store(0)
		b.evalNanos.Add(int64(time.Since(t0)))
	}()
	if C.xmx_eval(&hs[0], C.size_t(len(hs))) != 0 {
		err := mlxErr("eval")
		// An op that throws while its graph is being scheduled (GatherMM
		// in bfloat16 on MLX's CPU: probeGatherMMHalf) leaves the ops
		// already queued running on the stream's thread, writing buffers
		// whose last handles the caller is about to free: wait for them
		// (valgrind showed those writes after free, and heap corruption
		// crashed later tests).
		C.xmx_synchronize(b.stream)
		return err
	}
	return nil
}

// Eval computes arrays. As the engine's contract allows, it first releases
// the step's other temporaries: MLX's graph still holds what the outputs
// need, and without our handles it frees each intermediate buffer as soon
// as its consumers have run, so a forward pass peaks at a few layers'
// activations instead of all of them (and, on the CPU, does not page-fault
// a fresh heap for every step).
func (b *backend) Eval(arrays ...engine.Array) error {
	return b.doErr(func() error {
		as := make([]*array, len(arrays))
		for i, x := range arrays {
			as[i] = b.arr(x)
		}
		b.releaseTempsExcept(as)
		return b.eval(as...)
	})
}

// AsyncEval is Eval without the wait (MLX's async_eval, as mlx-lm's
// generate_step queues step n+1): it ends the other temporaries as Eval
// does and returns once the graph is scheduled. Reading an array (Bytes)
// then waits for it alone. The overlapped decode step uses it.
func (b *backend) AsyncEval(arrays ...engine.Array) error {
	return b.doErr(func() error {
		as := make([]*array, len(arrays))
		hs := make([]C.xmx_array, len(arrays))
		for i, x := range arrays {
			as[i] = b.arr(x)
			hs[i] = as[i].h
		}
		if len(hs) == 0 {
			return nil
		}
		b.releaseTempsExcept(as)
		b.evals++
		// Scheduling may wait for the stream (MLX throttles the tasks in
		// flight): counted as eval time, as the wait is not the host's.
		t0 := time.Now()
		defer func() { b.evalNanos.Add(int64(time.Since(t0))) }()
		if C.xmx_async_eval(&hs[0], C.size_t(len(hs))) != 0 {
			err := mlxErr("async_eval")
			C.xmx_synchronize(b.stream)
			return err
		}
		return nil
	})
}

// releaseTempsExcept releases every unkept temporary but those in keep,
// which stay tracked until the next Free() sweep.
func (b *backend) releaseTempsExcept(keep []*array) {
	n := 0
	hs := b.freeBuf[:0]
	for _, a := range b.temps {
		if !a.kept && !a.freed && !slices.Contains(keep, a) {
			a.freed = true // release, for many at once: one crossing
			hs = append(hs, a.h)
			continue
		}
		if !a.freed {
			b.temps[n] = a
			n++
		}
	}
	clear(b.temps[n:])
	b.temps = b.temps[:n]
	if len(hs) > 0 {
		C.xmx_array_free_n(&hs[0], C.size_t(len(hs)))
	}
	b.freeBuf = hs[:0]
}

func (b *backend) Keep(arrays ...engine.Array) {
	arrays = slices.Clone(arrays)
	b.post(func() {
		for _, x := range arrays {
			b.keep(b.arr(x))
		}
	})
}

func (b *backend) Free(arrays ...engine.Array) {
	arrays = slices.Clone(arrays)
	b.post(func() {
		if len(arrays) == 0 {
			b.sweep()
			return
		}
		for _, x := range arrays {
			if a, ok := x.(*array); ok && a != nil && a.owner == b {
				b.release(a)
			} else {
				panic(fmt.Sprintf("mlx: Free of %T, not an array of this backend", x))
			}
		}
	})
}

// op queues f for the MLX thread and returns at once the array f will
// make.
func (b *backend) op(f func() *array) engine.Array {
	return b.queue(&array{owner: b, pending: f})
}

// opOf is op without a closure: run makes the array from a.args. The
// caller fills the rest of a.args.
func (b *backend) opOf(run opFunc, x, y, z engine.Array) *array {
	a := &array{owner: b, run: run}
	a.args.x, a.args.y, a.args.z = x, y, z
	return a
}

// queue posts the op of a (made by op or opOf) and returns a.
func (b *backend) queue(a *array) engine.Array {
	defer closedError()
	b.thread.postOp(a)
	return a
}

// runOp runs a's op on the MLX thread and makes a its result.
func (a *array) runOp() {
	b := a.owner
	since := len(b.temps)
	var r *array
	if run := a.run; run != nil {
		a.run = nil
		r = run(b, a)
		a.args = opArgs{} // the inputs may go
	} else {
		f := a.pending
		a.pending = nil
		r = f()
	}
	b.adoptSince(a, r, since)
}

// appendOp is a KV cache's Append queued without a closure: the two
// views' placeholders and the inputs in one allocation.
type appendOp struct {
	k, v     array
	kIn, vIn engine.Array
	layer    int
	c        appender
}

// appender is a KV cache that appends on the MLX thread.
type appender interface{ appendOn(o *appendOp) }

func (o *appendOp) runOp() {
	o.c.appendOn(o)
	o.kIn, o.vIn = nil, nil
}

// queueAppend queues c's Append of k, v at layer and returns the views'
// placeholders.
func (b *backend) queueAppend(c appender, layer int, k, v engine.Array) (kAll, vAll engine.Array) {
	o := &appendOp{kIn: k, vIn: v, layer: layer, c: c}
	o.k.owner, o.v.owner = b, b
	defer closedError()
	b.thread.postOp(o)
	return &o.k, &o.v
}

func runAdd(b *backend, a *array) *array { return b.add(b.arr(a.args.x), b.arr(a.args.y)) }
func runMul(b *backend, a *array) *array { return b.mul(b.arr(a.args.x), b.arr(a.args.y)) }

func (b *backend) matmul(x, y *array) *array {
	return b.mk("matmul", func(r *C.xmx_array) C.int { return C.xmx_matmul(r, x.h, y.h, b.stream) })
}

func (b *backend) transpose(x *array, perm ...int) *array {
	cp := b.cints(0, perm)
	return b.mk("transpose", func(r *C.xmx_array) C.int {
		return C.xmx_transpose(r, x.h, intsPtr(cp), C.size_t(len(cp)), b.stream)
	})
}

func (b *backend) reshape(x *array, shape ...int) *array {
	cs := b.cints(0, shape)
	return b.mk("reshape", func(r *C.xmx_array) C.int {
		return C.xmx_reshape(r, x.h, intsPtr(cs), C.size_t(len(cs)), b.stream)
	})
}

func (b *backend) expandDims(x *array, axis int) *array {
	return b.mk("expand_dims", func(r *C.xmx_array) C.int { return C.xmx_expand_dims(r, x.h, C.int(axis), b.stream) })
}

func (b *backend) add(x, y *array) *array {
	return b.mk("add", func(r *C.xmx_array) C.int { return C.xmx_add(r, x.h, y.h, b.stream) })
}

func (b *backend) mul(x, y *array) *array {
	return b.mk("multiply", func(r *C.xmx_array) C.int { return C.xmx_multiply(r, x.h, y.h, b.stream) })
}

func (b *backend) astype(x *array, mdt C.int) *array {
	if x.mdt == mdt {
		return x
	}
	return b.mk("astype", func(r *C.xmx_array) C.int { return C.xmx_astype(r, x.h, mdt, b.stream) })
}

func (b *backend) slice(x *array, axis, start, end int) *array {
	n := len(x.shape)
	if axis < 0 {
		axis += n
	}
	if axis < 0 || axis >= n || start < 0 || end < start || end > x.shape[axis] {
		panic(fmt.Sprintf("mlx: Slice [%d, %d) of axis %d of %v", start, end, axis, x.shape))
	}
	lo, hi, st := b.cfill(0, n, 0), b.cints(1, x.shape), b.cfill(2, n, 1)
	lo[axis], hi[axis] = C.int(start), C.int(end)
	return b.mk("slice", func(r *C.xmx_array) C.int {
		return C.xmx_slice(r, x.h, intsPtr(lo), intsPtr(hi), intsPtr(st), C.size_t(n), b.stream)
	})
}

// sliceUpdate writes upd into src at offset start along axis (every other
// axis whole) and returns the new array.
func (b *backend) sliceUpdate(src, upd *array, axis, start int) *array {
	n := len(src.shape)
	lo, hi, st := b.cfill(0, n, 0), b.cints(1, src.shape), b.cfill(2, n, 1)
	lo[axis], hi[axis] = C.int(start), C.int(start+upd.shape[axis])
	return b.mk("slice_update", func(r *C.xmx_array) C.int {
		return C.xmx_slice_update(r, src.h, upd.h, intsPtr(lo), intsPtr(hi), intsPtr(st), C.size_t(n), b.stream)
	})
}

func (b *backend) concat(axis int, as ...*array) *array {
	hs := make([]C.xmx_array, len(as))
	for i, a := range as {
		hs[i] = a.h
	}
	return b.mk("concatenate", func(r *C.xmx_array) C.int {
		return C.xmx_concat(r, &hs[0], C.size_t(len(hs)), C.int(axis), b.stream)
	})
}

func (b *backend) zeros(shape []int, dt engine.DType) *array {
	cs := b.cints(0, shape)
	return b.mk("zeros", func(r *C.xmx_array) C.int {
		return C.xmx_zeros(r, intsPtr(cs), C.size_t(len(cs)), toMLX(dt), b.stream)
	})
}

// scalar is a 0-d array of value v in dtype mdt, made once and kept for
// later steps (up to maxConsts constants).
func (b *backend) scalar(v float32, mdt C.int) *array {
	k := constKey{bits: math.Float32bits(v), mdt: mdt}
	if a, ok := b.consts[k]; ok && !a.freed {
		return a
	}
	s := b.mk("scalar", func(r *C.xmx_array) C.int { return C.xmx_scalar_f32(r, C.float(v)) })
	return b.constant(k, b.astype(s, mdt))
}

// constKey names a constant kept across steps: a scalar (bits, mdt) or
// the rows a rope table is made from (l, dims, mdt).
type constKey struct {
	bits    uint32
	l, dims int
	mdt     C.int
}

// maxConsts bounds the constants kept; maxConstValues the size of one.
const (
	maxConsts      = 64
	maxConstValues = 1 << 12
)

// constant keeps a (a temporary just made) as the constant k, while there
// is room, and returns it.
func (b *backend) constant(k constKey, a *array) *array {
	if len(b.consts) < maxConsts {
		b.keep(a)
		b.consts[k] = a
	}
	return a
}

func (b *backend) Linear(x engine.Array, l *engine.Linear) engine.Array {
	a := b.opOf(runLinear, x, nil, nil)
	a.args.lin = l
	return b.queue(a)
}

func runLinear(b *backend, a *array) *array { return b.linear(b.arr(a.args.x), a.args.lin) }

func (b *backend) linear(x *array, l *engine.Linear) *array {
	w := b.arr(l.W)
	var y *array
	if l.Bits == 0 {
		y = b.matmul(x, b.weightT(w))
	} else {
		s := b.arr(l.Scales)
		var bi C.xmx_array // null: no biases
		if l.Biases != nil {
			bi = b.arr(l.Biases).h
		}
		if b.qmmErr == nil {
			y = b.mk("quantized_matmul", func(r *C.xmx_array) C.int {
				return C.xmx_qmm_mode(r, x.h, w.h, s.h, bi, C.int(l.GroupSize), C.int(l.Bits), quantMode(l.Mode), b.stream)
			})
		} else {
			y = b.matmul(x, b.weightT(b.dequantized(w, l)))
		}
	}
	if l.Bias != nil {
		y = b.add(y, b.arr(l.Bias))
	}
	return y
}

// dequantized returns (making once, kept) the dense copy of a quantized
// weight, used only when the device cannot run quantized_matmul.
func (b *backend) dequantized(w *array, l *engine.Linear) *array {
	if d, ok := b.deq[w]; ok {
		return d
	}
	if !w.kept {
		return b.dequantize(w, b.arr(l.Scales), l.Biases, l) // a temporary: per use
	}
	d := b.dequantize(w, b.arr(l.Scales), l.Biases, l)
	b.keep(d)
	if err := b.eval(d); err != nil {
		panic(err)
	}
	b.deq[w] = d
	return d
}

func (b *backend) dequantize(w, s *array, biases engine.Array, l *engine.Linear) *array {
	var bi C.xmx_array
	if biases != nil {
		bi = b.arr(biases).h
	}
	return b.dequantizeRaw(w, s, bi, l)
}

func (b *backend) dequantizeRaw(w, s *array, bi C.xmx_array, l *engine.Linear) *array {
	return b.mk("dequantize", func(r *C.xmx_array) C.int {
		return C.xmx_dequantize_mode(r, w.h, s.h, bi, C.int(l.GroupSize), C.int(l.Bits), quantMode(l.Mode), b.stream)
	})
}

func (b *backend) MatMul(x, y engine.Array) engine.Array {
	return b.queue(b.opOf(runMatMul, x, y, nil))
}

func runMatMul(b *backend, a *array) *array { return b.matmul(b.arr(a.args.x), b.arr(a.args.y)) }

func (b *backend) Embedding(table *engine.Linear, ids engine.Array) engine.Array {
	return b.op(func() *array {
		idx := b.arr(ids)
		if idx.dt != engine.I32 {
			panic(fmt.Sprintf("mlx: Embedding: ids are %v, want int32", idx.dt))
		}
		take := func(t *array) *array {
			return b.mk("take", func(r *C.xmx_array) C.int { return C.xmx_take(r, t.h, idx.h, 0, b.stream) })
		}
		w := b.arr(table.W)
		if table.Bits == 0 {
			return take(w)
		}
		rows, scales := take(w), take(b.arr(table.Scales))
		var bi C.xmx_array
		if table.Biases != nil {
			bi = take(b.arr(table.Biases)).h
		}
		return b.dequantizeRaw(rows, scales, bi, table)
	})
}

func (b *backend) RMSNorm(x, w engine.Array, eps float32) engine.Array {
	a := b.opOf(runRMSNorm, x, w, nil)
	a.args.f = eps
	return b.queue(a)
}

func runRMSNorm(b *backend, a *array) *array {
	xa, wa, eps := b.arr(a.args.x), b.arr(a.args.y), a.args.f
	if f, ok := b.normClosure(xa, eps); ok {
		return b.mk("compiled rms_norm", func(r *C.xmx_array) C.int { return C.xmx_apply2(r, f, xa.h, wa.h) })
	}
	return b.rmsNorm(xa, wa, eps)
}

// rmsNorm is MLX's fast::rms_norm.
func (b *backend) rmsNorm(x, w *array, eps float32) *array {
	return b.mk("rms_norm", func(r *C.xmx_array) C.int { return C.xmx_rms_norm(r, x.h, w.h, C.float(eps), b.stream) })
}

// compileFallbacks readies the compiled rope rotation where MLX's
// fast::rope and fast::rms_norm are fallback graphs (the CPU device) and
// kernel fusion works; the error says why not.
func (b *backend) compileFallbacks() error {
	switch {
	case b.name != "mlx-cpu":
		return errors.New("the device has rope and rms_norm kernels")
	case b.fuseErr != nil:
		return fmt.Errorf("no kernel fusion: %w", b.fuseErr)
	}
	if C.xmx_rope_compile(&b.ropeFused, b.stream) != 0 {
		b.ropeFused.ctx = nil
		return mlxErr("compile rope")
	}
	return nil
}

// normClosure returns the compiled rms_norm for x's width and eps, made at
// first use (false: use MLX's rms_norm).
func (b *backend) normClosure(x *array, eps float32) (C.xmx_closure, bool) {
	if b.fallbackErr != nil || len(x.shape) == 0 {
		return C.xmx_closure{}, false
	}
	k := normKey{x.shape[len(x.shape)-1], eps}
	if f, ok := b.norms[k]; ok {
		return f, f.ctx != nil
	}
	f := b.compileNorm(k)
	b.norms[k] = f // ctx nil: compiling failed, not tried again
	return f, f.ctx != nil
}

// ropeTable returns the cosines and sines of rotating positions
// offset…offset+l-1 by rope's frequencies, in x's type, kept for the next
// calls with the same positions (every layer of a step). They come from
// MLX's own rope applied to rows [1…1, 0…0] (then out₁ = 1·cos − 0·sin =
// cos and out₂ = 1·sin + 0·cos = sin exactly), so they are the fallback's
// tables bit for bit.
// compileNorm compiles rms_norm for k (ctx nil: it failed). Apart from
// normClosure so that the closure's address, which goes to C, is not a
// heap allocation on every lookup.
func (b *backend) compileNorm(k normKey) (f C.xmx_closure) {
	if C.xmx_rms_compile(&f, C.float(k.eps), b.stream) != 0 {
		b.log.Warn("mlx: compiling rms_norm failed; it builds MLX's graph each call", "width", k.width, "reason", lastError())
		f.ctx = nil
	}
	return f
}

func (b *backend) ropeTable(key ropeTabKey, freqs C.xmx_array) (c, s *array) {
	for i := len(b.ropeTabs) - 1; i >= 0; i-- {
		if t := b.ropeTabs[i]; t.key == key {
			// Used last, evicted last: RoPERows stacks up to
			// maxRopeTabs tables looked up in a row.
			copy(b.ropeTabs[i:], b.ropeTabs[i+1:])
			b.ropeTabs[len(b.ropeTabs)-1] = t
			return t.c, t.s
		}
	}
	h := key.dims / 2
	e := b.ropeRows(key.l, key.dims, key.mdt)
	cs := b.mk("rope", func(r *C.xmx_array) C.int {
		return C.xmx_rope(r, e.h, C.int(key.dims), C.bool(key.hasBase), C.float(key.base), 1, C.int(key.offset), freqs, b.stream)
	})
	c, s = b.slice(cs, 2, 0, h), b.slice(cs, 2, h, key.dims)
	b.keep(c)
	b.keep(s)
	b.ropeTabs = append(b.ropeTabs, ropeTab{key, c, s})
	kept := 0
	for _, t := range b.ropeTabs {
		kept += t.key.l * t.key.dims
	}
	// Evict the oldest beyond the count or the size bound (a long
	// prefill chunk's table is kept for its layers, then goes).
	for len(b.ropeTabs) > 1 && (len(b.ropeTabs) > maxRopeTabs || kept > maxRopeTabValues) {
		old := b.ropeTabs[0]
		b.release(old.c)
		b.release(old.s)
		kept -= old.key.l * old.key.dims
		b.ropeTabs = slices.Delete(b.ropeTabs, 0, 1)
	}
	return c, s
}

// ropeOp is a RoPE op's placeholder with its own copy of the parameters
// (the caller's may change once RoPE returns): one allocation.
type ropeOp struct {
	array
	rp engine.RoPE
}

// ropeRows returns the [1, l, dims] rows [1…1, 0…0] that ropeTable
// rotates, in dtype mdt; kept for later steps when small (a decode step's:
// only the positions change).
func (b *backend) ropeRows(l, dims int, mdt C.int) *array {
	k := constKey{l: l, dims: dims, mdt: mdt}
	if e, ok := b.consts[k]; ok && !e.freed {
		return e
	}
	rows := make([]float32, l*dims)
	for i := range l {
		for j := range dims / 2 {
			rows[i*dims+j] = 1
		}
	}
	e := b.fromBytes(unsafe.Slice((*byte)(unsafe.Pointer(&rows[0])), 4*len(rows)), []int{1, l, dims}, engine.F32)
	if mdt != e.mdt {
		e = b.astype(e, mdt)
	}
	if l*dims > maxConstValues {
		return e
	}
	return b.constant(k, e)
}

func (b *backend) RoPE(x engine.Array, offset int, r *engine.RoPE) engine.Array {
	o := &ropeOp{rp: *r}
	a := &o.array
	a.owner, a.run = b, runRoPE
	a.args.x, a.args.rope, a.args.ints[0] = x, &o.rp, offset
	return b.queue(a)
}

func runRoPE(b *backend, a *array) *array {
	return b.rope(b.arr(a.args.x), a.args.ints[0], a.args.rope, b.fallbackErr == nil)
}

// rope is RoPE on the MLX thread; compiled picks the compiled rotation
// with shared tables over MLX's fast::rope (see ropeTable).
func (b *backend) rope(xa *array, offset int, rp *engine.RoPE, compiled bool) *array {
	xa, ra := b.ropeSetup(xa, rp)
	if compiled && len(xa.shape) >= 3 && xa.shape[len(xa.shape)-2] > 0 && ra.dims%2 == 0 {
		c, s := b.ropeTable(ra.key(offset, xa.shape[len(xa.shape)-2], xa.mdt), ra.freqs)
		return b.ropeApply(xa, c, s, ra.dims)
	}
	return b.mk("rope", func(r *C.xmx_array) C.int {
		return C.xmx_rope(r, xa.h, C.int(ra.dims), C.bool(ra.hasBase), C.float(ra.base), 1, C.int(offset), ra.freqs, b.stream)
	})
}

// ropeApply rotates the first dims of xa's last axis with the compiled
// rotation and the tables c, s.
func (b *backend) ropeApply(xa, c, s *array, dims int) *array {
	return b.mk("compiled rope", func(r *C.xmx_array) C.int {
		return C.xmx_rope_apply(r, b.ropeFused, xa.h, c.h, s.h, C.int(dims), b.stream)
	})
}

// ropeArgs is what MLX's rope takes for one engine.RoPE: the rotated
// dims, and a base or (scaled schemes) the periods.
type ropeArgs struct {
	dims    int
	freqs   C.xmx_array // null: rotate with base
	periods *array
	hasBase bool
	base    float32
}

// key is ropeTable's key for l positions from offset in dtype mdt.
func (ra *ropeArgs) key(offset, l int, mdt C.int) ropeTabKey {
	return ropeTabKey{offset: offset, l: l, dims: ra.dims, mdt: mdt, hasBase: ra.hasBase, base: ra.base, periods: ra.periods}
}

// ropeSetup returns rp's arguments for x and x with a scaled scheme's
// attention factor applied to its rotated part.
func (b *backend) ropeSetup(xa *array, rp *engine.RoPE) (*array, ropeArgs) {
	if len(xa.shape) < 2 {
		panic(fmt.Sprintf("mlx: RoPE of %v", xa.shape))
	}
	dh := xa.shape[len(xa.shape)-1]
	dims := rp.Dims
	if dims <= 0 || dims > dh {
		dims = dh
	}
	ra := ropeArgs{dims: dims, hasBase: true, base: float32(rp.Base)}
	mscale := float32(1)
	if t := rp.Scale.Type; t != "" && t != "default" {
		// Scaled schemes: the frequencies the engine computes for
		// every backend, handed to MLX as periods (1/inv_freq).
		key := *rp
		key.Dims = dims
		f, ok := b.freqs[key]
		if !ok {
			inv, attn, err := engine.RoPEFrequencies(rp, dims)
			if err != nil {
				panic(fmt.Errorf("mlx: RoPE: %w", err))
			}
			periods := make([]float32, len(inv))
			for i, v := range inv {
				periods[i] = 1 / v
			}
			f.periods = b.fromBytes(unsafe.Slice((*byte)(unsafe.Pointer(&periods[0])), 4*len(periods)), []int{len(periods)}, engine.F32)
			b.keep(f.periods)
			f.attn = attn
			b.freqs[key] = f
		}
		ra.freqs, ra.periods, ra.hasBase, mscale = f.periods.h, f.periods, false, f.attn
	}
	if mscale != 1 {
		ms := b.scalar(mscale, xa.mdt)
		if dims == dh {
			xa = b.mul(xa, ms)
		} else {
			axis := len(xa.shape) - 1
			xa = b.concat(axis, b.mul(b.slice(xa, axis, 0, dims), ms), b.slice(xa, axis, dims, dh))
		}
	}
	return xa, ra
}

var (
	maskCausal = C.CString("causal")
	maskNone   = C.CString("")
)

func (b *backend) Attention(q, k, v engine.Array, scale float32) engine.Array {
	a := b.opOf(runAttention, q, k, v)
	a.args.f = scale
	return b.queue(a)
}

func runAttention(b *backend, a *array) *array {
	qa, ka, va, scale := b.arr(a.args.x), b.arr(a.args.y), b.arr(a.args.z), a.args.f
	if len(qa.shape) != 3 || len(ka.shape) != 3 || len(va.shape) != 3 {
		panic(fmt.Sprintf("mlx: Attention wants q [H, L, Dh], k, v [Hkv, T, Dh]; got %v %v %v", qa.shape, ka.shape, va.shape))
	}
	h, l, dh := qa.shape[0], qa.shape[1], qa.shape[2]
	if ka.shape[0] == 0 || h%ka.shape[0] != 0 || ka.shape[2] != dh || !slices.Equal(ka.shape, va.shape) || ka.shape[1] < l {
		panic(fmt.Sprintf("mlx: Attention shapes q %v k %v v %v", qa.shape, ka.shape, va.shape))
	}
	mask := maskNone
	if l > 1 {
		mask = maskCausal // bottom-right aligned: query i sees keys ≤ T-L+i
	}
	return b.mk("scaled_dot_product_attention", func(r *C.xmx_array) C.int {
		return C.xmx_sdpa3(r, qa.h, ka.h, va.h, C.float(scale), mask, b.stream)
	})
}

func (b *backend) SwiGLU(gate, up engine.Array) engine.Array {
	return b.queue(b.opOf(runSwiGLU, gate, up, nil))
}

func runSwiGLU(b *backend, a *array) *array {
	g, u := b.arr(a.args.x), b.arr(a.args.y)
	if !slices.Equal(g.shape, u.shape) {
		panic(fmt.Sprintf("mlx: SwiGLU of %v and %v", g.shape, u.shape))
	}
	if b.fuseErr != nil {
		return b.swigluOps(g, u)
	}
	return b.mk("compiled swiglu", func(r *C.xmx_array) C.int { return C.xmx_apply2(r, b.fused, g.h, u.h) })
}

// swigluOps is SwiGLU as three ops, the graph the compiled closure fuses.
func (b *backend) swigluOps(g, u *array) *array {
	return b.mk("swiglu", func(r *C.xmx_array) C.int { return C.xmx_swiglu(r, g.h, u.h, b.stream) })
}

func (b *backend) Add(x, y engine.Array) engine.Array { return b.queue(b.opOf(runAdd, x, y, nil)) }

func (b *backend) Mul(x, y engine.Array) engine.Array { return b.queue(b.opOf(runMul, x, y, nil)) }

func (b *backend) Softmax(x engine.Array) engine.Array {
	return b.queue(b.opOf(runSoftmax, x, nil, nil))
}

func runSoftmax(b *backend, a *array) *array {
	xa := b.arr(a.args.x)
	return b.mk("softmax", func(r *C.xmx_array) C.int { return C.xmx_softmax(r, xa.h, -1, b.stream) })
}

func (b *backend) Argmax(x engine.Array) engine.Array { return b.queue(b.opOf(runArgmax, x, nil, nil)) }

func runArgmax(b *backend, a *array) *array {
	xa := b.arr(a.args.x)
	i := b.mk("argmax", func(r *C.xmx_array) C.int { return C.xmx_argmax(r, xa.h, -1, b.stream) })
	return b.astype(i, C.XMX_INT32) // MLX's argmax is uint32
}

// withInts queues an op whose int arguments are v (copied: the caller's
// slice may change once the op returns): ints gives them to run.
func (b *backend) withInts(run opFunc, x engine.Array, v []int) engine.Array {
	if len(v) > inlineDims { // rare: more dimensions than fit
		long := slices.Clone(v) // not v: captured, v would escape on every call
		return b.op(func() *array { return run(b, &array{owner: b, args: opArgs{x: x, long: long}}) })
	}
	a := b.opOf(run, x, nil, nil)
	a.args.n = uint8(copy(a.args.ints[:], v))
	return b.queue(a)
}

// ints returns a withInts op's ints.
func (a *array) ints() []int {
	if a.args.long != nil {
		return a.args.long
	}
	return a.args.ints[:a.args.n]
}

func (b *backend) Reshape(x engine.Array, shape ...int) engine.Array {
	return b.withInts(runReshape, x, shape)
}

func runReshape(b *backend, a *array) *array {
	xa, shape := b.arr(a.args.x), a.ints()
	if numel(shape) != numel(xa.shape) && !slices.Contains(shape, -1) {
		panic(fmt.Sprintf("mlx: Reshape %v to %v", xa.shape, shape))
	}
	return b.reshape(xa, shape...)
}

func (b *backend) Transpose(x engine.Array, perm ...int) engine.Array {
	return b.withInts(runTranspose, x, perm)
}

func runTranspose(b *backend, a *array) *array {
	xa, perm := b.arr(a.args.x), a.ints()
	if len(perm) != len(xa.shape) {
		panic(fmt.Sprintf("mlx: Transpose %v by %v", xa.shape, perm))
	}
	return b.transpose(xa, perm...)
}

func (b *backend) Slice(x engine.Array, axis, start, end int) engine.Array {
	return b.withInts(runSlice, x, []int{axis, start, end})
}

func runSlice(b *backend, a *array) *array {
	v := a.ints()
	return b.slice(b.arr(a.args.x), v[0], v[1], v[2])
}

func (b *backend) Concat(axis int, arrays ...engine.Array) engine.Array {
	arrays = slices.Clone(arrays)
	return b.op(func() *array {
		if len(arrays) == 0 {
			panic("mlx: Concat of nothing")
		}
		as := make([]*array, len(arrays))
		for i, x := range arrays {
			as[i] = b.arr(x)
		}
		return b.concat(axis, as...)
	})
}

func (b *backend) AsType(x engine.Array, dt engine.DType) engine.Array {
	return b.op(func() *array {
		xa := b.arr(x)
		if xa.dt == dt {
			// A new handle on the same array, so freeing either is safe.
			return b.reshape(xa, xa.shape...)
		}
		return b.astype(xa, toMLX(dt))
	})
}

// ActiveMemory reports MLX's allocated bytes in use and in its buffer cache.
// PeakMemory returns the most memory MLX has had allocated for arrays since
// the last reset (or the start), and with reset starts counting anew. Tests
// and benchmarks use it; it is not part of engine.Backend.
func (b *backend) PeakMemory(reset bool) (peak int64, err error) {
	err = b.doErr(func() error {
		var p C.size_t
		if C.xmx_peak_memory(&p) != 0 {
			return mlxErr("get peak memory")
		}
		if reset && C.xmx_reset_peak_memory() != 0 {
			return mlxErr("reset peak memory")
		}
		peak = int64(p)
		return nil
	})
	return peak, err
}

func (b *backend) ActiveMemory() (active, cache int64, err error) {
	err = b.doErr(func() error {
		var a, c C.size_t
		if C.xmx_active_memory(&a) != 0 || C.xmx_cache_memory(&c) != 0 {
			return mlxErr("get memory")
		}
		active, cache = int64(a), int64(c)
		return nil
	})
	return active, cache, err
}

// QuantizedMatmul reports nil when quantized weights are multiplied
// natively on this device, or why they are dequantized instead.
func (b *backend) QuantizedMatmul() error { return b.qmmErr }

var _ engine.Backend = (*backend)(nil)
