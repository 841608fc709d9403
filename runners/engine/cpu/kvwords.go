package cpu

import (
	"encoding/binary"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// kvWords is one layer's K and V stored as [Hkv, stride, Dh]: float32
// (k32, v32) or 16-bit words (k16, v16) by the cache's dtype. kvCache's
// layers and ringCache's slabs both hold their data this way.
type kvWords struct {
	k32, v32 []float32
	k16, v16 []uint16
}

// export copies positions [off, off+n) of every head (off counted in the
// stored rows) into Export's little-endian layout [Hkv, n, Dh].
func (w *kvWords) export(dt engine.DType, heads, dh, stride, off, n int) (kb, vb []byte) {
	kb = make([]byte, heads*n*dh*dt.Size())
	vb = make([]byte, len(kb))
	for h := range heads {
		src := (h*stride + off) * dh
		dst := h * n * dh
		if nativeLittle {
			if dt == engine.F32 {
				copy(kb[4*dst:4*(dst+n*dh)], asBytes(w.k32[src:src+n*dh]))
				copy(vb[4*dst:4*(dst+n*dh)], asBytes(w.v32[src:src+n*dh]))
			} else {
				copy(kb[2*dst:2*(dst+n*dh)], asBytes(w.k16[src:src+n*dh]))
				copy(vb[2*dst:2*(dst+n*dh)], asBytes(w.v16[src:src+n*dh]))
			}
			continue
		}
		for i := range n * dh {
			if dt == engine.F32 {
				binary.LittleEndian.PutUint32(kb[4*(dst+i):], math.Float32bits(w.k32[src+i]))
				binary.LittleEndian.PutUint32(vb[4*(dst+i):], math.Float32bits(w.v32[src+i]))
			} else {
				binary.LittleEndian.PutUint16(kb[2*(dst+i):], w.k16[src+i])
				binary.LittleEndian.PutUint16(vb[2*(dst+i):], w.v16[src+i])
			}
		}
	}
	return kb, vb
}

// load copies Export-layout bytes k and v ([Hkv, n, Dh]) into rows
// [off, off+n) of every head.
func (w *kvWords) load(dt engine.DType, heads, dh, stride, off, n int, k, v []byte) {
	for h := range heads {
		dst := (h*stride + off) * dh
		src := h * n * dh
		if nativeLittle {
			if dt == engine.F32 {
				copy(asBytes(w.k32[dst:dst+n*dh]), k[4*src:4*(src+n*dh)])
				copy(asBytes(w.v32[dst:dst+n*dh]), v[4*src:4*(src+n*dh)])
			} else {
				copy(asBytes(w.k16[dst:dst+n*dh]), k[2*src:2*(src+n*dh)])
				copy(asBytes(w.v16[dst:dst+n*dh]), v[2*src:2*(src+n*dh)])
			}
			continue
		}
		for i := range n * dh {
			if dt == engine.F32 {
				w.k32[dst+i] = math.Float32frombits(binary.LittleEndian.Uint32(k[4*(src+i):]))
				w.v32[dst+i] = math.Float32frombits(binary.LittleEndian.Uint32(v[4*(src+i):]))
			} else {
				w.k16[dst+i] = binary.LittleEndian.Uint16(k[2*(src+i):])
				w.v16[dst+i] = binary.LittleEndian.Uint16(v[2*(src+i):])
			}
		}
	}
}
