package cpu

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// e2m1 are the values of a 4-bit E2M1 float (bit 3 is the sign), times 2:
// 0, 0.5, 1, 1.5, 2, 3, 4, 6 → 0, 1, 2, 3, 4, 6, 8, 12.
var e2m1x2 = [16]int{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// mxfp4Weight runs an MXFP4 weight (engine.Linear Mode "mxfp4") on the 8-bit
// affine kernels, exactly: each value 2^(s-127) · v with v ∈ ±{0, 0.5, 1,
// 1.5, 2, 3, 4, 6} is scale·q + bias with q = 2v + 12 ∈ [0, 24] (8 bits),
// scale = 2^(s-128) and bias = -12·scale, all exact in float32, so the
// kernels see exactly the weights MXFP4 encodes. The 8-bit form is made
// once per weight array and kept with it (twice MXFP4's size). A stacked
// weight [E, out, in/8] (GatherLinear) expands to E·out rows.
func mxfp4Weight(l *engine.Linear) *weight {
	w := arr(l.W)
	if w.mxfp4 != nil {
		return w.mxfp4
	}
	if l.Bits != 4 || l.GroupSize != 32 || w.dt != engine.U32 || len(w.shape) < 2 || l.Scales == nil {
		panic(fmt.Sprintf("cpu: mxfp4 Linear: %d bits, group %d, weight %v %v", l.Bits, l.GroupSize, w.dt, w.shape))
	}
	s := arr(l.Scales)
	// Stacked experts [E, out, in/8] expand as E·out rows.
	out, in := numel(w.shape)/w.shape[len(w.shape)-1], w.shape[len(w.shape)-1]*8
	ng := in / 32
	if s.dt != engine.U8 || numel(s.shape) != out*ng {
		panic(fmt.Sprintf("cpu: mxfp4 Linear: scales %v %v for weight %v (want uint8 [%d %d])", s.dt, s.shape, w.shape, out, ng))
	}
	r := &weight{out: out, in: in, bits: 8, gs: 32, wpr: in / 4,
		q: make([]uint32, out*in/4), scales: make([]float32, out*ng), biases: make([]float32, out*ng)}
	for i := range out * ng {
		sc := float32(math.Ldexp(1, int(s.u8[i])-128))
		r.scales[i], r.biases[i] = sc, -12*sc
	}
	for o := range out {
		for j := range in {
			nib := (w.u32[o*(in/8)+j/8] >> (4 * uint(j%8))) & 15
			q := uint32(e2m1x2[nib] + 12)
			r.q[o*r.wpr+j/4] |= q << (8 * uint(j%4))
		}
	}
	w.mxfp4 = r
	return r
}
