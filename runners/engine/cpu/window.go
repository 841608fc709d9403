package cpu

import (
	"fmt"
	"math"

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
		sinks = floats(arr(sinksA))
		if len(sinks) != H {
			panic(fmt.Sprintf("cpu: WindowedAttention: %d sinks for %d heads", len(sinks), H))
		}
	}
	qv := floats(q)
	group := H / hkv
	out := make([]float32, H*L*Dh)
	b.parallel(H, 1, func(lo, hi int) {
		scores := make([]float32, L*T)
		buf := make([]float32, 4*Dh)
		for h := lo; h < hi; h++ {
			kh := h / group
			keys := &weight{out: T, in: Dh, dt: engine.F32, f32: kd[kh*kst : kh*kst+T*Dh]}
			b.gemmBlocks(scores, qv[h*L*Dh:(h+1)*L*Dh], L, keys, 0, (T+3)/4, buf)
			vbase := vd[kh*vst:]
			for i := range L {
				limit := T - L + i + 1 // keys first..T-L+i
				first := 0
				if window > 0 {
					first = max(0, limit-window)
				}
				row := scores[i*T+first : i*T+limit]
				m := float32(math.Inf(-1))
				if sinks != nil {
					m = sinks[h]
				}
				for t, s := range row {
					s *= scale
					row[t] = s
					m = max(m, s)
				}
				var sum float32
				for t, s := range row {
					p := float32(math.Exp(float64(s - m)))
					row[t] = p
					sum += p
				}
				if sinks != nil {
					sum += float32(math.Exp(float64(sinks[h] - m)))
				}
				o := out[(h*L+i)*Dh : (h*L+i+1)*Dh]
				for t, p := range row {
					b.axpy(p, vbase[(first+t)*Dh:(first+t+1)*Dh], o)
				}
				inv := 1 / sum
				for d := range o {
					o[d] *= inv
				}
			}
		}
	})
	return heapF32([]int{H, L, Dh}, out)
}
