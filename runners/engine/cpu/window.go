package cpu

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// WindowedAttention is Attention with a sliding window and attention sinks
// (see engine.Backend). Like Attention it computes each row over its
// visible keys only, in key order, so a row's result does not depend on how
// the prompt was chunked or how much the cache view holds before the window.
func (b *Backend) WindowedAttention(qa, ka, va engine.Array, scale float32, window int, sinksA engine.Array) engine.Array {
	if window <= 0 && sinksA == nil {
		return b.Attention(qa, ka, va, scale)
	}
	q := arr(qa)
	if len(q.shape) != 3 {
		panic(fmt.Sprintf("cpu: WindowedAttention: q of shape %v, want [H, L, Dh]", q.shape))
	}
	H, L, Dh := q.shape[0], q.shape[1], q.shape[2]
	kd, hkv, T, kdh, kst := b.kvRows(arr(ka))
	vd, vhkv, vT, vdh, vst := b.kvRows(arr(va))
	if kdh != Dh || vdh != Dh || vhkv != hkv || vT != T || hkv == 0 || H%hkv != 0 || T < L {
		panic(fmt.Sprintf("cpu: WindowedAttention: q %v with k [%d %d %d] v [%d %d %d]", q.shape, hkv, T, kdh, vhkv, vT, vdh))
	}
	var sinks []float32
	if sinksA != nil {
		sinks = halfFloats(arr(sinksA)) // a weight: widened once, kept with it
		if len(sinks) != H {
			panic(fmt.Sprintf("cpu: WindowedAttention: %d sinks for %d heads", len(sinks), H))
		}
	}
	return b.attend(q, kd, vd, H, L, T, Dh, hkv, kst, vst, scale, window, sinks)
}
