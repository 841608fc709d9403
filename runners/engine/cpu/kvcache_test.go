package cpu

import (
	"bytes"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

func TestKVCacheAppendExportTruncate(t *testing.T) {
	for _, dt := range []engine.DType{engine.F32, engine.F16, engine.BF16} {
		b := New(1)
		g := engine.CacheGeometry{Layers: 2, KVHeads: 2, HeadDim: 4}
		c := b.NewKVCache(g, dt)
		step := func(L int, base float32) {
			vals := make([]float32, g.KVHeads*L*g.HeadDim)
			for i := range vals {
				vals[i] = base + float32(i)
			}
			before := c.Len()
			for l := range g.Layers {
				k, v := c.Append(l, b.FromFloat32(vals, g.KVHeads, L, g.HeadDim), b.FromFloat32(vals, g.KVHeads, L, g.HeadDim))
				if s := k.Shape(); s[1] != before+L || v.Shape()[1] != before+L {
					t.Fatalf("view shape %v at Len %d", s, c.Len())
				}
			}
		}
		// Cross a growth step so the copy-on-grow path runs.
		step(200, 0)
		step(100, 1000)
		if c.Len() != 300 {
			t.Fatalf("Len %d", c.Len())
		}
		kb, vb, err := c.Export(1, 199, 2)
		if err != nil || !bytes.Equal(kb, vb) {
			t.Fatalf("export: %v", err)
		}
		// Head 0 token 199 is the last row of the first step: value 199*4..;
		// token 200 is the first row of the second step: 1000+0..
		got, _ := b.Float32(b.FromBytes(kb, []int{2, 2, 4}, dt))
		if got[0] != 199*4 || got[4] != 1000 {
			t.Fatalf("%v: exported %v", dt, got[:8])
		}
		c.Truncate(150)
		if c.Len() != 150 {
			t.Fatalf("Len after Truncate %d", c.Len())
		}
		if _, _, err := c.Export(0, 149, 2); err == nil {
			t.Fatal("export past Len after Truncate succeeded")
		}
		step(1, 5) // appends continue at the truncated length
		if c.Len() != 151 {
			t.Fatalf("Len %d", c.Len())
		}
	}
}

// FuzzKVImport feeds arbitrary ranges and bytes (as they would come off
// the wire) to Import/Commit: errors are fine, panics are not, and a
// successful import reads back unchanged.
func FuzzKVImport(f *testing.F) {
	f.Add(0, 0, 1, []byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(0))
	f.Add(1, 3, 2, make([]byte, 16), uint8(1))
	f.Add(-1, -5, 1<<30, []byte{}, uint8(2))
	f.Fuzz(func(t *testing.T, layer, start, n int, data []byte, dtSel uint8) {
		dt := []engine.DType{engine.F32, engine.F16, engine.BF16}[int(dtSel)%3]
		g := engine.CacheGeometry{Layers: 2, KVHeads: 1, HeadDim: 2}
		c := New(1).NewKVCache(g, dt)
		if n > 1<<16 || start > 1<<16 {
			n, start = n%(1<<16), start%(1<<16) // keep allocations bounded
		}
		if err := c.Import(layer, start, n, data, data); err != nil {
			return
		}
		k, v, err := c.Export(layer, start, n)
		if err != nil {
			t.Fatalf("export of an imported range: %v", err)
		}
		if !bytes.Equal(k, data) || !bytes.Equal(v, data) {
			t.Fatal("imported bytes do not read back")
		}
		_ = c.Commit(start + n)
	})
}
