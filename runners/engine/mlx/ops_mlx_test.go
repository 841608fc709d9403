//go:build mlx && cgo && (linux || darwin)

// These tests need libmlxc: go test -tags mlx with EXO_MLXC_PATH set to
// libmlxc's path (or the library beside the test binary or on the loader's
// path). Without it they skip, saying so. EXO_MLX_TEST_DEVICE picks the
// device ("cpu", "gpu"; default: gpu when MLX has one).

package mlx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/internal/half"
)

func newTestBackend(t testing.TB) *backend {
	t.Helper()
	b, err := newBackend(Options{Device: os.Getenv("EXO_MLX_TEST_DEVICE")})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("libmlxc not found; set %s to the path of libmlxc.so to run the MLX tests: %v", EnvLibPath, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// pair holds the backend under test and the cpu reference.
type pair struct {
	t   *testing.T
	m   *backend
	c   engine.Backend
	rng *rand.Rand
}

func newPair(t *testing.T) *pair {
	return &pair{t: t, m: newTestBackend(t), c: cpu.New(0), rng: rand.New(rand.NewPCG(1, 2))}
}

func (p *pair) randn(n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(p.rng.NormFloat64() * scale)
	}
	return out
}

// in makes the same array on both backends from host float32 data, stored
// as dt.
func (p *pair) in(data []float32, dt engine.DType, shape ...int) (m, c engine.Array) {
	raw := encode(data, dt)
	return p.m.FromBytes(raw, shape, dt), p.c.FromBytes(raw, shape, dt)
}

func (p *pair) raw(raw []byte, dt engine.DType, shape ...int) (m, c engine.Array) {
	return p.m.FromBytes(raw, shape, dt), p.c.FromBytes(raw, shape, dt)
}

func encode(v []float32, dt engine.DType) []byte {
	switch dt {
	case engine.F32:
		out := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
		return out
	case engine.BF16:
		out := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToBF16(x))
		}
		return out
	case engine.F16:
		out := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToF16(x))
		}
		return out
	}
	panic(fmt.Sprintf("encode %v", dt))
}

// same compares the two results (as float32) within tol relative to the
// largest reference magnitude.
func (p *pair) same(name string, m, c engine.Array, tol float64) {
	p.t.Helper()
	if !slices.Equal(m.Shape(), c.Shape()) {
		p.t.Fatalf("%s: mlx shape %v, cpu shape %v", name, m.Shape(), c.Shape())
	}
	mv, err := p.m.Float32(m)
	if err != nil {
		p.t.Fatalf("%s: mlx Float32: %v", name, err)
	}
	cv, err := p.c.Float32(c)
	if err != nil {
		p.t.Fatalf("%s: cpu Float32: %v", name, err)
	}
	var scale, worst float64
	for _, x := range cv {
		scale = math.Max(scale, math.Abs(float64(x)))
	}
	at := -1
	for i := range cv {
		if d := math.Abs(float64(mv[i]) - float64(cv[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	if worst > tol*math.Max(scale, 1e-6) || math.IsNaN(worst) {
		p.t.Errorf("%s: max |mlx-cpu| = %g at %d (mlx %g, cpu %g), scale %g, tol %g", name, worst, at, mv[at], cv[at], scale, tol)
	}
}

// quantized returns random MLX affine-quantized weight data for [out, in].
func (p *pair) quantized(out, in, bits, group int) (w, scales, biases []byte) {
	words := make([]uint32, out*in*bits/32)
	per := 32 / bits
	for i := range words {
		for j := range per {
			words[i] |= uint32(p.rng.IntN(1<<bits)) << (j * bits)
		}
	}
	w = make([]byte, 4*len(words))
	for i, x := range words {
		binary.LittleEndian.PutUint32(w[4*i:], x)
	}
	ng := out * in / group
	scales = encode(p.randn(ng, 0.02), engine.F32)
	biases = encode(p.randn(ng, 0.1), engine.F32)
	return w, scales, biases
}

func TestOpsMatchCPU(t *testing.T) {
	p := newPair(t)
	m, c := p.m, p.c

	t.Run("Linear", func(t *testing.T) {
		p.t = t
		for _, dt := range []engine.DType{engine.F32, engine.BF16} {
			xm, xc := p.in(p.randn(5*64, 1), dt, 5, 64)
			wm, wc := p.in(p.randn(48*64, 0.1), dt, 48, 64)
			bm, bc := p.in(p.randn(48, 0.1), dt, 48)
			tol := 1e-5
			if dt == engine.BF16 {
				tol = 3e-2
			}
			p.same("dense "+dt.String(), m.Linear(xm, &engine.Linear{W: wm}), c.Linear(xc, &engine.Linear{W: wc}), tol)
			p.same("dense+bias "+dt.String(), m.Linear(xm, &engine.Linear{W: wm, Bias: bm}), c.Linear(xc, &engine.Linear{W: wc, Bias: bc}), tol)
		}
		for _, q := range []struct{ bits, group, rows int }{{4, 32, 1}, {4, 64, 3}, {8, 64, 1}, {8, 32, 4}, {4, 128, 2}} {
			w, s, bi := p.quantized(32, 256, q.bits, q.group)
			wm, wc := p.raw(w, engine.U32, 32, 256*q.bits/32)
			sm, sc := p.raw(s, engine.F32, 32, 256/q.group)
			bm, bc := p.raw(bi, engine.F32, 32, 256/q.group)
			xm, xc := p.in(p.randn(q.rows*256, 1), engine.F32, q.rows, 256)
			lm := &engine.Linear{W: wm, Scales: sm, Biases: bm, Bits: q.bits, GroupSize: q.group}
			lc := &engine.Linear{W: wc, Scales: sc, Biases: bc, Bits: q.bits, GroupSize: q.group}
			p.same(fmt.Sprintf("q%d g%d L=%d", q.bits, q.group, q.rows), m.Linear(xm, lm), c.Linear(xc, lc), 1e-4)

			ids := []int32{3, 0, 31, 7}
			p.same(fmt.Sprintf("embedding q%d g%d", q.bits, q.group),
				m.Embedding(lm, m.FromInt32(ids, len(ids))), c.Embedding(lc, c.FromInt32(ids, len(ids))), 1e-5)
		}
	})
	t.Run("Embedding", func(t *testing.T) {
		p.t = t
		tm, tc := p.in(p.randn(40*16, 1), engine.F32, 40, 16)
		ids := []int32{39, 0, 5, 5}
		p.same("dense", m.Embedding(&engine.Linear{W: tm}, m.FromInt32(ids, 4)), c.Embedding(&engine.Linear{W: tc}, c.FromInt32(ids, 4)), 0)
	})
	t.Run("MatMul", func(t *testing.T) {
		p.t = t
		am, ac := p.in(p.randn(2*5*16, 1), engine.F32, 2, 5, 16)
		bm, bc := p.in(p.randn(2*16*7, 1), engine.F32, 2, 16, 7)
		p.same("batched", m.MatMul(am, bm), c.MatMul(ac, bc), 1e-5)
	})
	t.Run("RMSNorm", func(t *testing.T) {
		p.t = t
		xm, xc := p.in(p.randn(5*64, 2), engine.F32, 5, 64)
		wm, wc := p.in(p.randn(64, 1), engine.F32, 64)
		p.same("rmsnorm", m.RMSNorm(xm, wm, 1e-6), c.RMSNorm(xc, wc, 1e-6), 1e-5)
		x3m, x3c := p.in(p.randn(3*4*16, 2), engine.F32, 3, 4, 16)
		w3m, w3c := p.in(p.randn(16, 1), engine.F32, 16)
		p.same("rmsnorm 3d", m.RMSNorm(x3m, w3m, 1e-5), c.RMSNorm(x3c, w3c, 1e-5), 1e-5)
	})
	t.Run("RoPE", func(t *testing.T) {
		p.t = t
		for _, r := range []engine.RoPE{
			{Dims: 32, Base: 10000},
			{Dims: 32, Base: 100000, Scale: engine.RoPEScaling{Type: "linear", Factor: 4}},
			{Dims: 32, Base: 500000, Scale: engine.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}},
			{Dims: 32, Base: 10000, Scale: engine.RoPEScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 256}},
			{Dims: 16, Base: 10000},
		} {
			xm, xc := p.in(p.randn(4*6*32, 1), engine.F32, 4, 6, 32)
			for _, off := range []int{0, 37, 300} {
				p.same(fmt.Sprintf("%s dims %d offset %d", r.Scale.Type, r.Dims, off), m.RoPE(xm, off, &r), c.RoPE(xc, off, &r), 1e-4)
			}
		}
	})
	t.Run("Attention", func(t *testing.T) {
		p.t = t
		for _, s := range []struct{ h, hkv, l, tt, dh int }{{4, 2, 1, 9, 16}, {4, 2, 5, 5, 16}, {4, 1, 3, 8, 32}, {2, 2, 6, 6, 8}} {
			qm, qc := p.in(p.randn(s.h*s.l*s.dh, 1), engine.F32, s.h, s.l, s.dh)
			km, kc := p.in(p.randn(s.hkv*s.tt*s.dh, 1), engine.F32, s.hkv, s.tt, s.dh)
			vm, vc := p.in(p.randn(s.hkv*s.tt*s.dh, 1), engine.F32, s.hkv, s.tt, s.dh)
			scale := float32(1 / math.Sqrt(float64(s.dh)))
			p.same(fmt.Sprintf("H%d Hkv%d L%d T%d", s.h, s.hkv, s.l, s.tt), m.Attention(qm, km, vm, scale), c.Attention(qc, kc, vc, scale), 1e-4)
		}
	})
	t.Run("Elementwise", func(t *testing.T) {
		p.t = t
		xm, xc := p.in(p.randn(4*5*8, 2), engine.F32, 4, 5, 8)
		ym, yc := p.in(p.randn(4*5*8, 2), engine.F32, 4, 5, 8)
		rm, rc := p.in(p.randn(5*8, 2), engine.F32, 5, 8)
		p.same("swiglu", m.SwiGLU(xm, ym), c.SwiGLU(xc, yc), 1e-5)
		p.same("add", m.Add(xm, ym), c.Add(xc, yc), 1e-6)
		p.same("add broadcast", m.Add(xm, rm), c.Add(xc, rc), 1e-6)
		p.same("mul broadcast", m.Mul(xm, rm), c.Mul(xc, rc), 1e-6)
		p.same("softmax", m.Softmax(xm), c.Softmax(xc), 1e-5)
		p.same("reshape", m.Reshape(xm, 20, 8), c.Reshape(xc, 20, 8), 0)
		p.same("transpose", m.Transpose(xm, 1, 0, 2), c.Transpose(xc, 1, 0, 2), 0)
		p.same("slice", m.Slice(xm, 1, 1, 4), c.Slice(xc, 1, 1, 4), 0)
		p.same("concat", m.Concat(1, xm, ym), c.Concat(1, xc, yc), 0)
		p.same("astype bf16", m.AsType(xm, engine.BF16), c.AsType(xc, engine.BF16), 0)
		p.same("transpose then slice", m.Slice(m.Transpose(xm, 2, 0, 1), 2, 1, 3), c.Slice(c.Transpose(xc, 2, 0, 1), 2, 1, 3), 0)

		am, ac := m.Argmax(xm), c.Argmax(xc)
		if am.DType() != engine.I32 {
			t.Errorf("argmax dtype %v, want int32", am.DType())
		}
		mb, err := m.Bytes(am)
		if err != nil {
			t.Fatal(err)
		}
		cb, err := c.Bytes(ac)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(mb, cb) || !slices.Equal(am.Shape(), []int{4, 5}) {
			t.Errorf("argmax: mlx %v %v, cpu %v", am.Shape(), mb, cb)
		}
	})
	t.Run("Bytes", func(t *testing.T) {
		p.t = t
		for _, dt := range []engine.DType{engine.F32, engine.BF16, engine.F16, engine.I32, engine.U32, engine.U8} {
			raw := make([]byte, 6*dt.Size())
			for i := range raw {
				raw[i] = byte(p.rng.IntN(256) & 0x3f) // keep halves finite
			}
			a := m.FromBytes(raw, []int{2, 3}, dt)
			got, err := m.Bytes(a)
			if err != nil || !slices.Equal(got, raw) {
				t.Errorf("%v round trip: %v %x, want %x", dt, err, got, raw)
			}
			tr, err := m.Bytes(m.Transpose(a, 1, 0))
			if err != nil {
				t.Fatal(err)
			}
			ct, _ := c.Bytes(c.Transpose(c.FromBytes(raw, []int{2, 3}, dt), 1, 0))
			if !slices.Equal(tr, ct) {
				t.Errorf("%v transposed bytes: mlx %x cpu %x", dt, tr, ct)
			}
		}
	})
	m.Free()
	if n := m.tempCount(); n != 0 {
		t.Errorf("%d temporaries left after Free()", n)
	}
}

// tempCount returns how many temporaries the backend tracks, after the
// queued work.
func (b *backend) tempCount() int {
	var n int
	b.do(func() { n = len(b.temps) })
	return n
}

// An MLX error becomes a Go error (through the installed handler), not an
// exit of the process: ops are queued, so it surfaces at the next
// synchronous call (Eval, Float32, Bytes) as an error wrapping
// engine.ErrBackend, and the backend keeps working afterwards.
func TestMLXErrorIsGoError(t *testing.T) {
	b := newTestBackend(t)
	x := b.FromFloat32(make([]float32, 6), 2, 3)
	y := b.FromFloat32(make([]float32, 8), 2, 4)
	bad := b.MatMul(x, y) // [2 3] @ [2 4]
	err := b.Eval(bad)
	if !errors.Is(err, engine.ErrBackend) {
		t.Fatalf("Eval of matmul [2 3] @ [2 4]: %v, want an error wrapping engine.ErrBackend", err)
	}
	t.Logf("reported: %v", err)
	func() {
		defer func() {
			r := recover()
			if e, ok := r.(error); !ok || !errors.Is(e, engine.ErrBackend) {
				t.Errorf("Shape of the failed op's array: recovered %v, want an ErrBackend panic", r)
			}
		}()
		bad.Shape()
	}()
	z := b.Add(x, x)
	if _, err := b.Float32(z); err != nil {
		t.Fatalf("backend unusable after an MLX error: %v", err)
	}
	if got := z.Shape(); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("shape %v", got)
	}
	b.Free()
	if _, err := b.Float32(b.Add(x, x)); err == nil {
		t.Fatal("use of a freed array did not fail")
	} else {
		t.Logf("use after free: %v", err)
	}
	if _, err := b.Float32(b.FromFloat32([]float32{1}, 1)); err != nil {
		t.Fatalf("backend unusable after a use-after-free: %v", err)
	}
}

// The backend is used from many goroutines in turn (calls are serialized
// onto the MLX thread).
func TestManyGoroutines(t *testing.T) {
	b := newTestBackend(t)
	w := b.FromFloat32([]float32{1, 2, 3, 4}, 2, 2)
	b.Keep(w)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 50 {
				x := b.FromFloat32([]float32{float32(g), float32(i)}, 1, 2)
				y, err := b.Float32(b.MatMul(x, w))
				if err == nil && (y[0] != float32(g+3*i) || y[1] != float32(2*g+4*i)) {
					err = fmt.Errorf("goroutine %d step %d: %v", g, i, y)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// runners/internal/half's float32→float16 conversion agrees with MLX's.
func TestHalfHelpers(t *testing.T) {
	b := newTestBackend(t)
	p := &pair{rng: rand.New(rand.NewPCG(3, 4))}
	v := append(p.randn(1000, 3), 0, 1, -2, 65504, 1e-6, 6e-8, -3e-5)
	got, err := b.Bytes(b.AsType(b.FromFloat32(v, len(v)), engine.F16))
	if err != nil {
		t.Fatal(err)
	}
	if want := encode(v, engine.F16); !slices.Equal(got, want) {
		t.Fatal("half.F32ToF16 differs from MLX's float32→float16")
	}
	for i := range v {
		h := binary.LittleEndian.Uint16(got[2*i:])
		if back := half.F32ToF16(half.F16ToF32(h)); back != h {
			t.Fatalf("half %#04x round trips to %#04x", h, back)
		}
	}
}

// The compiled SwiGLU is in use wherever it can be (MLX's CPU backend needs
// g++ on PATH and a private JIT directory) and gives what the three ops and
// the cpu backend give, for f32 and bf16, contiguous or not.
func TestSwiGLUFused(t *testing.T) {
	p := newPair(t)
	m := p.m
	_, gxxErr := exec.LookPath("g++")
	switch {
	case m.fuseErr == nil:
		t.Logf("SwiGLU is fused on %s", m.name)
	case m.name == "mlx-cpu" && (gxxErr != nil || jitDirProblem(jitDir(os.Getenv), os.Geteuid()) != nil):
		t.Logf("SwiGLU unfused here, as expected: %v", m.fuseErr)
	default:
		t.Fatalf("SwiGLU unfused on %s although it should fuse: %v", m.name, m.fuseErr)
	}
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		gm, gc := p.in(p.randn(6*40, 3), dt, 6, 40)
		um, uc := p.in(p.randn(6*40, 2), dt, 6, 40)
		tol := 1e-5
		if dt == engine.BF16 {
			tol = 2e-2
		}
		p.same(fmt.Sprintf("%v", dt), m.SwiGLU(gm, um), p.c.SwiGLU(gc, uc), tol)
		// Transposed views: the kernel for strided inputs.
		gt, ut := m.Transpose(gm, 1, 0), m.Transpose(um, 1, 0)
		p.same(fmt.Sprintf("%v strided", dt), m.SwiGLU(gt, ut), p.c.SwiGLU(p.c.Transpose(gc, 1, 0), p.c.Transpose(uc, 1, 0)), tol)
		var plain engine.Array
		m.do(func() { plain = m.swigluOps(m.arr(gm), m.arr(um)) })
		fv, err := m.Float32(m.SwiGLU(gm, um))
		if err != nil {
			t.Fatal(err)
		}
		pv, err := m.Float32(plain)
		if err != nil {
			t.Fatal(err)
		}
		for i := range pv {
			if math.Abs(float64(fv[i]-pv[i])) > tol*(1+math.Abs(float64(pv[i]))) {
				t.Fatalf("%v: fused %v, ops %v at %d", dt, fv[i], pv[i], i)
			}
		}
	}
	m.Free()
}

// Eval releases the step's other temporaries (so MLX can free their
// buffers as the graph runs) and keeps what it was given and what is kept.
func TestEvalReleasesTemporaries(t *testing.T) {
	b := newTestBackend(t)
	w := b.FromFloat32([]float32{1, 2, 3, 4}, 2, 2)
	b.Keep(w)
	x := b.FromFloat32([]float32{1, 1, 1, 1}, 2, 2)
	h := b.Add(x, w)
	y := b.Mul(h, w)
	if err := b.Eval(y); err != nil {
		t.Fatal(err)
	}
	got, err := b.Float32(y)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{2, 6, 12, 20}; !slices.Equal(got, want) {
		t.Fatalf("y = %v, want %v", got, want)
	}
	if _, err := b.Float32(w); err != nil {
		t.Fatalf("kept weight after Eval: %v", err)
	}
	// h was neither evaluated nor kept: its handle is gone.
	var used any
	func() {
		defer func() { used = recover() }()
		b.Add(h, w).Shape()
	}()
	if used == nil {
		t.Fatal("using a temporary released by Eval did not panic")
	}
	b.Free()
	b.Free(w)
}

func TestDescribe(t *testing.T) {
	b := newTestBackend(t)
	info, ok := Describe(b)
	if !ok || info.Lib == "" || info.Device != b.name || !strings.HasPrefix(info.Version, "0.") {
		t.Errorf("Describe = %+v, %v", info, ok)
	}
	t.Logf("%+v", info)
	if _, ok := Describe(cpu.New(1)); ok {
		t.Error("Describe accepted the cpu backend")
	}
}

// TestCompiledFallbacksMatchMLX: on the CPU device RMSNorm and RoPE run as
// compiled closures (RoPE with cosine/sine tables shared between calls)
// instead of the graphs MLX's fast::rms_norm and fast::rope build there;
// the results must be MLX's own, bit for bit, for every type, shape,
// offset, partial rotation and scaled scheme, and a table must serve only
// its own positions.
func TestCompiledFallbacksMatchMLX(t *testing.T) {
	p := newPair(t)
	m := p.m
	if m.name != "mlx-cpu" {
		if m.fallbackErr == nil {
			t.Fatalf("compiled rope/rms_norm on %s, which has kernels", m.name)
		}
		t.Skipf("%s: MLX's own kernels (%v)", m.name, m.fallbackErr)
	}
	if m.fallbackErr != nil {
		if m.fuseErr != nil {
			t.Skipf("no kernel fusion here: %v", m.fallbackErr)
		}
		t.Fatalf("fusion works but rope/rms_norm are not compiled: %v", m.fallbackErr)
	}
	bytesOf := func(name string, x engine.Array) []byte {
		t.Helper()
		raw, err := m.Bytes(x)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return raw
	}
	// MLX's own ops, bypassing the compiled paths.
	plainNorm := func(x, w engine.Array, eps float32) (out engine.Array) {
		m.do(func() { out = m.rmsNorm(m.arr(x), m.arr(w), eps) })
		return out
	}
	plainRoPE := func(x engine.Array, offset int, r *engine.RoPE) (out engine.Array) {
		m.do(func() { out = m.rope(m.arr(x), offset, r, false) })
		return out
	}
	for _, dt := range []engine.DType{engine.F32, engine.BF16, engine.F16} {
		for _, shape := range [][]int{{1, 64}, {7, 64}, {3, 5, 64}, {8, 1, 16}} {
			n := numel(shape)
			x, _ := p.in(p.randn(n, 3), dt, shape...)
			w, _ := p.in(p.randn(shape[len(shape)-1], 1), dt, shape[len(shape)-1])
			name := fmt.Sprintf("rms_norm %v %v", dt, shape)
			if !slices.Equal(bytesOf(name, m.RMSNorm(x, w, 1e-6)), bytesOf(name, plainNorm(x, w, 1e-6))) {
				t.Errorf("%s: compiled differs from MLX's rms_norm", name)
			}
		}
		for _, c := range []struct {
			shape   []int
			offsets []int
			rope    engine.RoPE
		}{
			{[]int{32, 1, 64}, []int{0, 5, 1000, 5, 32767}, engine.RoPE{Base: 10000}},
			{[]int{4, 9, 64}, []int{0, 3}, engine.RoPE{Base: 500000}},
			{[]int{2, 130, 64}, []int{17}, engine.RoPE{Dims: 32, Base: 10000}}, // partial rotation
			{[]int{1, 2, 3, 32}, []int{4}, engine.RoPE{Base: 10000}},           // 4-D
			{[]int{4, 0, 64}, []int{7}, engine.RoPE{Base: 10000}},              // no positions
			{[]int{8, 1, 64}, []int{100, 9000}, engine.RoPE{Base: 500000, Scale: engine.RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}},
			{[]int{8, 1, 64}, []int{100}, engine.RoPE{Base: 150000, Scale: engine.RoPEScaling{Type: "yarn", Factor: 32, BetaFast: 32, BetaSlow: 1, OriginalMaxPositions: 4096}}},
		} {
			x, _ := p.in(p.randn(numel(c.shape), 2), dt, c.shape...)
			for _, off := range c.offsets {
				name := fmt.Sprintf("rope %v %v %+v offset %d", dt, c.shape, c.rope, off)
				if !slices.Equal(bytesOf(name, m.RoPE(x, off, &c.rope)), bytesOf(name, plainRoPE(x, off, &c.rope))) {
					t.Errorf("%s: compiled differs from MLX's rope", name)
				}
			}
		}
		m.Free()
	}
	// The tables kept stay bounded: a long chunk's goes at the next call.
	r := engine.RoPE{Base: 10000}
	big, _ := p.in(p.randn(5000*64, 1), engine.F32, 1, 5000, 64)
	small, _ := p.in(p.randn(64, 1), engine.F32, 1, 1, 64)
	bytesOf("long rope", m.RoPE(big, 0, &r))
	bytesOf("rope after it", m.RoPE(small, 5000, &r))
	var tabs, values int
	m.do(func() {
		tabs = len(m.ropeTabs)
		for _, tab := range m.ropeTabs {
			values += tab.key.l * tab.key.dims
		}
	})
	if tabs == 0 || tabs > maxRopeTabs || values > maxRopeTabValues {
		t.Errorf("%d rope tables kept holding %d values, want 1…%d tables, at most %d values", tabs, values, maxRopeTabs, maxRopeTabValues)
	}
	m.Free()
}
