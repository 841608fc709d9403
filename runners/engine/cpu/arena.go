package cpu

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Step arena.
//
// The engine's memory contract (engine.Backend): arrays made during a step
// are temporaries that Free() with no arguments ends, except those Keep
// pinned. The cpu backend uses it to make a decode step allocate nothing on
// the Go heap: op results take their element storage from one slab and
// their Array headers from a pool, both handed out again after the sweep.
// A step that needs more than the slab holds gets the rest from the heap,
// and the next sweep grows the slab to fit (up to arenaMaxFloats), so the
// second step of a given shape allocates nothing. A long prefill chunk,
// whose temporaries are far larger than a decode step's, takes the cap and
// leaves the rest to the GC as before.
//
// Arrays made by FromBytes (weights, imported data) never live in the
// arena. Keep moves an arena array's data to the heap and takes its header
// out of the pool, so kept arrays survive sweeps. Using a temporary after
// the sweep that ended it is a programming error, as on the mlx backend;
// the cpu backend panics when it notices (the header not yet reused).

// arenaMaxFloats bounds the slab: 64 MiB of float32.
const arenaMaxFloats = 16 << 20

// maxPooledHeaders bounds the header pool (a decode step of a 30-layer
// model uses about 600).
const maxPooledHeaders = 1 << 16

type arena struct {
	slab  []float32
	off   int // floats handed out this step
	extra int // floats this step wanted beyond the slab (served by the heap)
	// hdrs is the header pool; hdrs[:used] were handed out this step.
	hdrs []*Array
	used int
	gen  uint32 // incremented by every sweep; 0 is never a live generation
}

// floats returns n zeroed float32 from the slab, or from the heap when the
// slab is full.
func (b *Backend) floats(n int) []float32 {
	a := &b.arena
	if a.off+n <= len(a.slab) {
		s := a.slab[a.off : a.off+n : a.off+n]
		a.off += n
		clear(s)
		return s
	}
	a.extra += n
	return make([]float32, n)
}

// int32s is floats viewed as int32 (same size, no pointers).
func (b *Backend) int32s(n int) []int32 {
	f := b.floats(n)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&f[0])), n)
}

// uint16s is floats viewed as uint16, rounded up to whole floats.
func (b *Backend) uint16s(n int) []uint16 {
	f := b.floats((n + 1) / 2)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&f[0])), n)
}

// header returns a zeroed Array header from the pool with the given shape
// (copied into the header's own storage when it fits).
func (b *Backend) header(shape []int) *Array {
	a := &b.arena
	if a.gen == 0 {
		a.gen = 1
	}
	var h *Array
	switch {
	case a.used < len(a.hdrs):
		h = a.hdrs[a.used]
		*h = Array{}
	case a.used >= maxPooledHeaders || a.extra > 0:
		// A backend whose steps are never swept (ops used directly, or a
		// cache of this backend serving a model on another) must not
		// hold every header it ever made. And once a step has outgrown
		// the slab (a long prefill chunk), its further arrays are left to
		// the GC entirely: a pooled header would keep its heap data alive
		// until the sweep, where before the arena it died with its last
		// use.
		h = new(Array)
		h.setShape(shape)
		return h
	default:
		h = new(Array)
		a.hdrs = append(a.hdrs, h)
	}
	a.used++
	h.gen, h.owner = a.gen, b
	h.setShape(shape)
	return h
}

// header3 is header for a 3-axis shape.
func (b *Backend) header3(d0, d1, d2 int) *Array {
	s := [3]int{d0, d1, d2}
	return b.header(s[:])
}

// setShape copies shape into a's inline storage (or a new slice when it
// has more axes than that holds).
func (a *Array) setShape(shape []int) {
	if len(shape) <= len(a.dims) {
		a.shape = a.dims[:len(shape):len(shape)]
		copy(a.shape, shape)
		return
	}
	a.shape = slices.Clone(shape)
}

// newF32 makes an F32 temporary of the given shape with zeroed data.
func (b *Backend) newF32(shape ...int) *Array {
	f := b.floats(numel(shape)) // first: an overflow unpools the header
	h := b.header(shape)
	h.dt = engine.F32
	h.f32 = f
	return h
}

// sweep ends the step: every header and the slab are handed out again. The
// slab grows to hold the step's demand (bounded), so a repeated step of the
// same shapes allocates nothing.
func (b *Backend) sweep() {
	a := &b.arena
	if need := a.off + a.extra; need > len(a.slab) && len(a.slab) < arenaMaxFloats {
		a.slab = make([]float32, min(need, arenaMaxFloats))
	}
	for i, h := range a.hdrs[:a.used] {
		if h.kept {
			a.hdrs[i] = new(Array) // the kept array keeps its header
		} else {
			h.gen = 0 // marks it dead until reused
		}
	}
	a.off, a.extra, a.used = 0, 0, 0
	a.gen++
	if a.gen == 0 {
		a.gen = 1
	}
}

// keep pins x: its data moves off the slab and its header leaves the pool.
func (b *Backend) keep(x *Array) {
	if x.owner == nil || x.kept {
		return
	}
	x.kept = true
	x.owner, x.gen = nil, 0
	x.f32 = slices.Clone(x.f32)
	x.u16 = slices.Clone(x.u16)
	x.i32 = slices.Clone(x.i32)
	x.u32 = slices.Clone(x.u32)
	x.u8 = slices.Clone(x.u8)
	x.shape = slices.Clone(x.shape)
}

// checkLive panics when a is a temporary whose step has been swept.
func (a *Array) checkLive() {
	if a.owner != nil && a.gen != a.owner.arena.gen {
		panic(fmt.Sprintf("cpu: array %v used after the Free that ended its step", a.shape))
	}
}
