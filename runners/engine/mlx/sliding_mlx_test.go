//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// WindowedAttention (windows, sinks, GQA, one and several queries, bf16)
// agrees with the cpu backend's.
func TestWindowedAttentionMatchesCPU(t *testing.T) {
	p := newPair(t)
	const H, Hkv, Dh = 4, 2, 16
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		for _, c := range []struct{ L, T, window int }{{1, 9, 4}, {5, 12, 4}, {7, 7, 3}, {1, 4, 8}, {6, 6, 0}} {
			for _, sinks := range []bool{false, true} {
				qm, qc := p.in(p.randn(H*c.L*Dh, 1), dt, H, c.L, Dh)
				km, kc := p.in(p.randn(Hkv*c.T*Dh, 1), dt, Hkv, c.T, Dh)
				vm, vc := p.in(p.randn(Hkv*c.T*Dh, 1), dt, Hkv, c.T, Dh)
				var sm, sc engine.Array
				if sinks {
					sm, sc = p.in(p.randn(H, 1), engine.F32, H)
				} else if c.window == 0 {
					continue // plain Attention, tested elsewhere
				}
				tol := 1e-5
				if dt == engine.BF16 {
					tol = 3e-2
				}
				p.same(fmt.Sprintf("%v %+v sinks %v", dt, c, sinks), p.m.WindowedAttention(qm, km, vm, 0.25, c.window, sm),
					p.c.WindowedAttention(qc, kc, vc, 0.25, c.window, sc), tol)
			}
		}
	}
}

// A tiny Mistral with window 8 on MLX follows the cpu backend through a
// chunked prefill of 5 windows and 8 windows of decode (past the slab of
// 2·(W+slack) positions, so the ring slides), and its ring exports the
// same window.
func TestSlidingModelMatchesCPU(t *testing.T) {
	mb := newTestBackend(t)
	dir := filepath.Join(t.TempDir(), "mistral")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "mistral", Seed: 4, SlidingWindow: 8}); err != nil {
		t.Fatal(err)
	}
	mm, cm := load(t, dir, mb), load(t, dir, cpu.New(0))
	mc, cc := mm.NewCache(), cm.NewCache()
	prompt := testmodel.ReferencePrompts()[4][:40]
	for _, x := range []struct {
		m *engine.Model
		c engine.KVCache
	}{{mm, mc}, {cm, cc}} {
		if err := x.m.Prefill(t.Context(), x.c, prompt[:39], 7, nil); err != nil {
			t.Fatal(err)
		}
	}
	tok := prompt[39]
	for step := range 64 {
		ml, cl := forward(t, mm, mc, tok), forward(t, cm, cc, tok)
		if c := fixture.Cosine(ml, cl); c < 0.999 {
			t.Fatalf("step %d: cosine %v", step, c)
		}
		tok = argmax(cl)
	}
	n := mc.Len()
	from := engine.WindowStart(8, n)
	for l := range mm.Info().Layers {
		k1, _, err1 := mc.Export(l, from, n-from)
		k2, _, err2 := cc.Export(l, from, n-from)
		if err1 != nil || err2 != nil || len(k1) != len(k2) || fixture.Cosine(f32(k1), f32(k2)) < 0.999 {
			t.Fatalf("layer %d export: %v %v", l, err1, err2)
		}
		if _, _, err := mc.Export(l, 0, 1); err == nil {
			t.Fatalf("layer %d exported a position its window dropped", l)
		}
	}
	if mc.CanTruncate(10) || !mc.CanTruncate(n-3) {
		t.Fatal("CanTruncate does not follow the held window")
	}
}

func f32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// GeGLU agrees with the cpu backend's in f32 and bf16.
func TestGeGLUMatchesCPU(t *testing.T) {
	p := newPair(t)
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		g := p.randn(6*40, 2)
		u := p.randn(6*40, 1)
		gm, gc := p.in(g, dt, 6, 40)
		um, uc := p.in(u, dt, 6, 40)
		tol := 1e-5
		if dt == engine.BF16 {
			tol = 2e-2
		}
		p.same(fmt.Sprint("GeGLU ", dt), p.m.GeGLU(gm, um), p.c.GeGLU(gc, uc), tol)
	}
}

// ClampedSwiGLU (gpt-oss) agrees with the cpu backend's, with inputs
// beyond the clamp.
func TestClampedSwiGLUMatchesCPU(t *testing.T) {
	p := newPair(t)
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		gm, gc := p.in(p.randn(6*40, 6), dt, 6, 40)
		um, uc := p.in(p.randn(6*40, 6), dt, 6, 40)
		tol := 1e-5
		if dt == engine.BF16 {
			tol = 2e-2
		}
		p.same(fmt.Sprint("ClampedSwiGLU ", dt), p.m.ClampedSwiGLU(gm, um, 1.702, 7), p.c.ClampedSwiGLU(gc, uc, 1.702, 7), tol)
	}
}

// The sliding reference models (Gemma 3 f32, 4-bit, tied; gpt-oss) on MLX
// follow the cpu backend through a chunked prefill of 5 windows and 32
// greedy steps.
func TestSlidingReferenceModelsMatchCPU(t *testing.T) {
	mb := newTestBackend(t)
	for _, ref := range testmodel.SlidingSet() {
		t.Run(ref.Name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), ref.Name)
			if err := testmodel.Write(dir, ref.Spec); err != nil {
				t.Fatal(err)
			}
			mm, cm := load(t, dir, mb), load(t, dir, cpu.New(0))
			mc, cc := mm.NewCache(), cm.NewCache()
			prompt := testmodel.SlidingPrompts()[3]
			for _, x := range []struct {
				m *engine.Model
				c engine.KVCache
			}{{mm, mc}, {cm, cc}} {
				if err := x.m.Prefill(t.Context(), x.c, prompt[:len(prompt)-1], 7, nil); err != nil {
					t.Fatal(err)
				}
			}
			tok := prompt[len(prompt)-1]
			for step := range 32 {
				ml, cl := forward(t, mm, mc, tok), forward(t, cm, cc, tok)
				if c := fixture.Cosine(ml, cl); c < 0.999 {
					t.Fatalf("step %d: cosine %v", step, c)
				}
				tok = argmax(cl)
			}
		})
	}
}
