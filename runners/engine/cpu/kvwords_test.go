package cpu

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// TestKVWordsExportLoad: export writes rows [off, off+n) of every head in
// little-endian [Hkv, n, Dh] and load puts them back, on the native copy
// path and on the byte-by-byte one big-endian hosts take.
func TestKVWordsExportLoad(t *testing.T) {
	const heads, stride, dh, off, n = 2, 5, 3, 1, 3
	native := nativeLittle
	t.Cleanup(func() { nativeLittle = native })
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		for _, little := range []bool{true, false} {
			if little && !native {
				continue
			}
			nativeLittle = little
			var w kvWords
			size := heads * stride * dh
			w.k32, w.v32 = make([]float32, size), make([]float32, size)
			w.k16, w.v16 = make([]uint16, size), make([]uint16, size)
			for i := range size {
				w.k32[i], w.v32[i] = float32(i)+0.5, -float32(i)
				w.k16[i], w.v16[i] = uint16(1000+i), uint16(2000+i)
			}
			kb, vb := w.export(dt, heads, dh, stride, off, n)
			es := dt.Size()
			if len(kb) != heads*n*dh*es || len(vb) != len(kb) {
				t.Fatalf("%v little=%v: %d/%d bytes", dt, little, len(kb), len(vb))
			}
			for h := range heads {
				for i := range n * dh {
					src, dst := (h*stride+off)*dh+i, (h*n*dh+i)*es
					var gk, gv, wk, wv uint32
					if dt == engine.F32 {
						gk, gv = binary.LittleEndian.Uint32(kb[dst:]), binary.LittleEndian.Uint32(vb[dst:])
						wk, wv = math.Float32bits(w.k32[src]), math.Float32bits(w.v32[src])
					} else {
						gk, gv = uint32(binary.LittleEndian.Uint16(kb[dst:])), uint32(binary.LittleEndian.Uint16(vb[dst:]))
						wk, wv = uint32(w.k16[src]), uint32(w.v16[src])
					}
					if gk != wk || gv != wv {
						t.Fatalf("%v little=%v head %d word %d: exported %#x/%#x, want %#x/%#x", dt, little, h, i, gk, gv, wk, wv)
					}
				}
			}
			var r kvWords
			r.k32, r.v32 = make([]float32, size), make([]float32, size)
			r.k16, r.v16 = make([]uint16, size), make([]uint16, size)
			r.load(dt, heads, dh, stride, off, n, kb, vb)
			for h := range heads {
				lo, hi := (h*stride+off)*dh, (h*stride+off+n)*dh
				if dt == engine.F32 {
					if !slices.Equal(r.k32[lo:hi], w.k32[lo:hi]) || !slices.Equal(r.v32[lo:hi], w.v32[lo:hi]) {
						t.Fatalf("%v little=%v head %d: loaded rows differ", dt, little, h)
					}
				} else if !slices.Equal(r.k16[lo:hi], w.k16[lo:hi]) || !slices.Equal(r.v16[lo:hi], w.v16[lo:hi]) {
					t.Fatalf("%v little=%v head %d: loaded rows differ", dt, little, h)
				}
			}
			if r.k32[0] != 0 || r.k16[0] != 0 || r.v32[size-1] != 0 || r.v16[size-1] != 0 {
				t.Fatalf("%v little=%v: load wrote outside rows [off, off+n)", dt, little)
			}
		}
	}
}
