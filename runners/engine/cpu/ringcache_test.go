package cpu

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// viewBytes reads a cache view [Hkv, T, Dh] back as float32 values.
func viewFloats(t *testing.T, b engine.Backend, a engine.Array) []float32 {
	t.Helper()
	f, err := b.Float32(a)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRingCacheWrapsAtManyOffsets appends steps of many sizes to a cache
// with a full layer and sliding layers of several windows, and checks at
// every step that each view holds exactly the window its new positions
// see, equal to the same positions of a full cache, and that Export,
// CanTruncate and Truncate agree with what is held, across many slides.
func TestRingCacheWrapsAtManyOffsets(t *testing.T) {
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		for _, windows := range [][]int{{0, 1, 5}, {7, 16, 0}, {3, 3, 3}} {
			t.Run(fmt.Sprint(dt, windows), func(t *testing.T) {
				b := New(1)
				g := engine.CacheGeometry{Layers: 3, KVHeads: 2, HeadDim: 4, Windows: windows}
				ring := b.NewKVCache(g, dt)
				full := b.NewKVCache(engine.CacheGeometry{Layers: 3, KVHeads: 2, HeadDim: 4}, dt)
				if _, ok := ring.(*ringCache); !ok {
					t.Fatalf("NewKVCache with windows made %T", ring)
				}
				r := rand.New(rand.NewPCG(1, 2))
				val := float32(0)
				for step := range 120 {
					L := 1
					if step%7 == 0 {
						L = 1 + r.IntN(40)
					}
					n := ring.Len()
					for l := range g.Layers {
						vals := make([]float32, g.KVHeads*L*g.HeadDim)
						for i := range vals {
							val++
							vals[i] = val
						}
						kr, vr := ring.Append(l, b.FromFloat32(vals, g.KVHeads, L, g.HeadDim), b.FromFloat32(vals, g.KVHeads, L, g.HeadDim))
						kf, _ := full.Append(l, b.FromFloat32(vals, g.KVHeads, L, g.HeadDim), b.FromFloat32(vals, g.KVHeads, L, g.HeadDim))
						from := engine.WindowStart(windows[l], n)
						if s := kr.Shape(); s[1] != n+L-from || vr.Shape()[1] != s[1] {
							t.Fatalf("step %d layer %d: view of %d positions, want [%d, %d)", step, l, s[1], from, n+L)
						}
						want := viewFloats(t, b, b.Slice(kf, 1, from, n+L))
						if got := viewFloats(t, b, kr); fmt.Sprint(got) != fmt.Sprint(want) {
							t.Fatalf("step %d layer %d: ring view differs from the full cache's [%d, %d)", step, l, from, n+L)
						}
					}
					n = ring.Len()
					for l := range g.Layers {
						from := engine.WindowStart(windows[l], n)
						k1, v1, err := ring.Export(l, from, n-from)
						if err != nil {
							t.Fatalf("step %d layer %d: export of the window: %v", step, l, err)
						}
						k2, v2, _ := full.Export(l, from, n-from)
						if !bytes.Equal(k1, k2) || !bytes.Equal(v1, v2) {
							t.Fatalf("step %d layer %d: exported window differs", step, l)
						}
					}
					if !ring.CanTruncate(n) || !ring.CanTruncate(0) || ring.CanTruncate(n+1) {
						t.Fatalf("step %d: CanTruncate wrong at the ends", step)
					}
				}
				// Long past every window: going back a little works (the
				// slack), going back to the start of the prompt does not.
				n := ring.Len()
				if !ring.CanTruncate(n - 1) {
					t.Fatal("cannot go back one position")
				}
				if ring.CanTruncate(n / 2) {
					t.Fatalf("CanTruncate(%d) with windows %v after %d positions", n/2, windows, n)
				}
				if _, _, err := ring.Export(2, 0, 1); err == nil && windows[2] > 0 {
					t.Fatal("exported a position the sliding layer dropped")
				}
				ring.Truncate(n - 1)
				full.Truncate(n - 1)
				for l := range g.Layers {
					from := engine.WindowStart(windows[l], n-1)
					k1, _, err := ring.Export(l, from, n-1-from)
					k2, _, _ := full.Export(l, from, n-1-from)
					if err != nil || !bytes.Equal(k1, k2) {
						t.Fatalf("after Truncate layer %d: %v", l, err)
					}
				}
			})
		}
	}
}

// TestRingCacheStagedImport: an import that starts past what a sliding
// layer holds is staged; the committed content is untouched until Commit
// (so Truncate rolls back), and Commit then serves the imported window.
func TestRingCacheStagedImport(t *testing.T) {
	b := New(1)
	g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 2, Windows: []int{0, 4}}
	src := b.NewKVCache(g, engine.F32)
	dst := b.NewKVCache(g, engine.F32)
	put := func(c engine.KVCache, L int, base float32) {
		for l := range g.Layers {
			vals := make([]float32, L*2)
			for i := range vals {
				vals[i] = base + float32(i)
			}
			c.Append(l, b.FromFloat32(vals, 1, L, 2), b.FromFloat32(vals, 1, L, 2))
		}
	}
	put(src, 30, 0)
	put(dst, 10, 0) // dst holds the first 10 positions (the same values)
	inject := func() error {
		k, v, err := src.Export(0, 10, 20)
		if err != nil {
			return err
		}
		if err := dst.Import(0, 10, 20, k, v); err != nil {
			return err
		}
		k, v, err = src.Export(1, 27, 3) // the window of position 30
		if err != nil {
			return err
		}
		return dst.Import(1, 27, 3, k, v)
	}
	if err := inject(); err != nil {
		t.Fatal(err)
	}
	// A failed stream rolls back: dst still holds its 10 positions.
	dst.Truncate(10)
	if k, _, err := dst.Export(1, 7, 3); err != nil || len(k) != 3*2*4 {
		t.Fatalf("rollback lost the committed window: %v", err)
	}
	if err := inject(); err != nil {
		t.Fatal(err)
	}
	if err := dst.Commit(30); err != nil {
		t.Fatal(err)
	}
	for l, from := range []int{0, 27} {
		k1, _, err1 := src.Export(l, from, 30-from)
		k2, _, err2 := dst.Export(l, from, 30-from)
		if err1 != nil || err2 != nil || !bytes.Equal(k1, k2) {
			t.Fatalf("layer %d after commit: %v %v", l, err1, err2)
		}
	}
	if dst.CanTruncate(20) {
		t.Fatal("CanTruncate(20) after importing only the window of 30")
	}
	// Too short a staged window cannot commit; a gap in a full layer is refused.
	c := b.NewKVCache(g, engine.F32)
	k, v, _ := src.Export(1, 28, 2)
	if err := c.Import(1, 28, 2, k, v); err != nil {
		t.Fatal(err)
	}
	k, v, _ = src.Export(0, 0, 30)
	if err := c.Import(0, 0, 30, k, v); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(30); err == nil {
		t.Fatal("committed a sliding layer missing position 27 of its window")
	}
	k, v, _ = src.Export(0, 5, 2)
	if err := b.NewKVCache(g, engine.F32).Import(0, 5, 2, k, v); err == nil {
		t.Fatal("a full layer accepted an import leaving a gap")
	}
}

// naiveAttention is softmax attention in float64 with a window and sinks.
func naiveAttention(q, k, v []float32, H, Hkv, L, T, Dh int, scale float32, window int, sinks []float32) []float64 {
	out := make([]float64, H*L*Dh)
	for h := range H {
		kh := h / (H / Hkv)
		for i := range L {
			last := T - L + i
			var ps []float64
			var idx []int
			m := math.Inf(-1)
			if sinks != nil {
				m = float64(sinks[h])
			}
			for j := 0; j <= last; j++ {
				if window > 0 && j <= last-window {
					continue
				}
				var d float64
				for e := range Dh {
					d += float64(q[(h*L+i)*Dh+e]) * float64(k[(kh*T+j)*Dh+e])
				}
				d *= float64(scale)
				ps, idx = append(ps, d), append(idx, j)
				m = math.Max(m, d)
			}
			var sum float64
			for x := range ps {
				ps[x] = math.Exp(ps[x] - m)
				sum += ps[x]
			}
			if sinks != nil {
				sum += math.Exp(float64(sinks[h]) - m)
			}
			for x, j := range idx {
				for e := range Dh {
					out[(h*L+i)*Dh+e] += ps[x] / sum * float64(v[(kh*T+j)*Dh+e])
				}
			}
		}
	}
	return out
}

func TestWindowedAttention(t *testing.T) {
	b := New(2)
	r := rand.New(rand.NewPCG(3, 4))
	rnd := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	const H, Hkv, Dh = 4, 2, 8
	for _, c := range []struct{ L, T, window int }{{1, 9, 4}, {5, 12, 4}, {7, 7, 3}, {3, 20, 1}, {6, 6, 0}, {2, 5, 100}} {
		for _, withSinks := range []bool{false, true} {
			q, k, v := rnd(H*c.L*Dh), rnd(Hkv*c.T*Dh), rnd(Hkv*c.T*Dh)
			var sinks []float32
			var sa engine.Array
			if withSinks {
				sinks = rnd(H)
				sa = b.FromFloat32(sinks, H)
			}
			got, _ := b.Float32(b.WindowedAttention(b.FromFloat32(q, H, c.L, Dh), b.FromFloat32(k, Hkv, c.T, Dh), b.FromFloat32(v, Hkv, c.T, Dh), 0.3, c.window, sa))
			want := naiveAttention(q, k, v, H, Hkv, c.L, c.T, Dh, 0.3, c.window, sinks)
			for i := range want {
				if math.Abs(float64(got[i])-want[i]) > 1e-5 {
					t.Fatalf("%+v sinks %v: element %d = %v, want %v", c, withSinks, i, got[i], want[i])
				}
			}
			if !withSinks && (c.window == 0 || c.window >= c.T) {
				plain, _ := b.Float32(b.Attention(b.FromFloat32(q, H, c.L, Dh), b.FromFloat32(k, Hkv, c.T, Dh), b.FromFloat32(v, Hkv, c.T, Dh), 0.3))
				if fmt.Sprint(plain) != fmt.Sprint(got) {
					t.Fatalf("%+v: a window covering every key differs from Attention", c)
				}
			}
		}
	}
}

// FuzzRingImport feeds arbitrary ranges and bytes (as they come off the
// wire) to a ring cache holding 5 positions: errors are fine, panics are
// not, and an import that commits reads back in the positions the layer
// must hold.
func FuzzRingImport(f *testing.F) {
	f.Add(1, 5, 3, make([]byte, 24), uint8(0))
	f.Add(1, 9, 2, make([]byte, 8), uint8(1))
	f.Add(0, 5, 4, make([]byte, 16), uint8(2))
	f.Add(1, -1, 1<<30, []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, layer, start, n int, data []byte, dtSel uint8) {
		dt := []engine.DType{engine.F32, engine.F16, engine.BF16}[int(dtSel)%3]
		g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 2, Windows: []int{0, 3}}
		b := New(1)
		c := b.NewKVCache(g, dt)
		for l := range g.Layers {
			x := b.FromFloat32(make([]float32, 5*2), 1, 5, 2)
			c.Append(l, x, x)
		}
		if n > 1<<16 || start > 1<<16 {
			n, start = n%(1<<16), start%(1<<16)
		}
		if err := c.Import(layer, start, n, data, data); err != nil {
			return
		}
		if layer == 1 {
			// The full layer must reach start+n too before a commit.
			k, v, err := c.Export(0, 0, 5)
			if err != nil || c.Import(0, 0, 5, k, v) != nil {
				t.Fatal("re-import of held positions failed")
			}
		}
		if c.Commit(start+n) != nil || n == 0 {
			return
		}
		from := max(start, engine.WindowStart(g.Windows[layer], start+n))
		k, _, err := c.Export(layer, from, start+n-from)
		if err != nil {
			t.Fatalf("export of committed imported positions [%d, %d): %v", from, start+n, err)
		}
		es := dt.Size() * 2
		if !bytes.Equal(k, data[(from-start)*es:]) {
			t.Fatal("imported bytes do not read back")
		}
	})
}
