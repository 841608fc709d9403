package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The gated delta rule of Gated DeltaNet layers: its float32 gates and the
// token-by-token recurrence over each head's state [Dv, Dk]. Heads are
// independent and run in parallel; within a head every token's update is
// the same sequence of float32 operations however the tokens are split
// into calls, so chunked prefill and decode give the same state bit for
// bit.

// DeltaGates computes g = exp(−exp(aLog)·softplus(a + dtBias)) and
// beta = sigmoid(b) in float32 (softplus as log1p(exp(x)), or x itself
// above 20 where the two agree in float32).
func (b *Backend) DeltaGates(a, bb, aLog, dtBias engine.Array) (engine.Array, engine.Array) {
	aa, ba := arr(a), arr(bb)
	rows, H := lastDim("DeltaGates", aa)
	if !slices.Equal(aa.shape, ba.shape) || numel(arr(aLog).shape) != H || numel(arr(dtBias).shape) != H {
		panic(fmt.Sprintf("cpu: DeltaGates: a %v, b %v, aLog %v, dtBias %v", aa.shape, ba.shape, arr(aLog).shape, arr(dtBias).shape))
	}
	av, bv := floats(aa), floats(ba)
	al, dt := floats(arr(aLog)), floats(arr(dtBias))
	ga, betaA := b.newF32(aa.shape...), b.newF32(ba.shape...) // the step's arena
	g, beta := ga.f32, betaA.f32
	for r := range rows {
		for h := range H {
			i := r*H + h
			x := float32(av[i] + dt[h])
			sp := x
			if x <= 20 {
				sp = float32(math.Log1p(math.Exp(float64(x))))
			}
			g[i] = float32(math.Exp(float64(-float32(float32(math.Exp(float64(al[h]))) * sp))))
			beta[i] = float32(1 / (1 + math.Exp(-float64(bv[i]))))
		}
	}
	return ga, betaA
}

// GatedDelta runs the recurrence (see engine.Backend.GatedDelta).
func (b *Backend) GatedDelta(q, k, v, g, beta, state engine.Array) (engine.Array, engine.Array) {
	qa, ka, va, ga, ba, sa := arr(q), arr(k), arr(v), arr(g), arr(beta), arr(state)
	if len(qa.shape) != 3 || !slices.Equal(qa.shape, ka.shape) || len(va.shape) != 3 || len(sa.shape) != 3 {
		panic(fmt.Sprintf("cpu: GatedDelta: q %v, k %v, v %v, state %v", qa.shape, ka.shape, va.shape, sa.shape))
	}
	L, Hk, Dk := qa.shape[0], qa.shape[1], qa.shape[2]
	Hv, Dv := va.shape[1], va.shape[2]
	if va.shape[0] != L || Hk == 0 || Hv%Hk != 0 || !slices.Equal(sa.shape, []int{Hv, Dv, Dk}) ||
		!slices.Equal(ga.shape, []int{L, Hv}) || !slices.Equal(ba.shape, []int{L, Hv}) {
		panic(fmt.Sprintf("cpu: GatedDelta: q %v, v %v, g %v, beta %v, state %v", qa.shape, va.shape, ga.shape, ba.shape, sa.shape))
	}
	if ga.dt != engine.F32 || ba.dt != engine.F32 || sa.dt != engine.F32 {
		panic(fmt.Sprintf("cpu: GatedDelta: g %v, beta %v, state %v (want float32)", ga.dt, ba.dt, sa.dt))
	}
	qv, kv, vv := floats(qa), floats(ka), floats(va)
	gv, bv := floats(ga), floats(ba)
	S := slices.Clone(floats(sa))
	ya := b.newF32(L, Hv, Dv) // the step's arena; S is the new state, on the heap
	y := ya.f32
	rep := Hv / Hk
	b.parallel(Hv, 1, func(lo, hi int) {
		for h := lo; h < hi; h++ {
			kh := h / rep
			st := S[h*Dv*Dk : (h+1)*Dv*Dk]
			for t := range L {
				gt, bt := gv[t*Hv+h], bv[t*Hv+h]
				kt := kv[(t*Hk+kh)*Dk : (t*Hk+kh+1)*Dk]
				qt := qv[(t*Hk+kh)*Dk : (t*Hk+kh+1)*Dk]
				vt := vv[(t*Hv+h)*Dv : (t*Hv+h+1)*Dv]
				yt := y[(t*Hv+h)*Dv : (t*Hv+h+1)*Dv]
				for i := range Dv {
					row := st[i*Dk : (i+1)*Dk]
					var mem float32
					for j := range row {
						row[j] = float32(row[j] * gt)
						mem += float32(row[j] * kt[j])
					}
					d := float32((vt[i] - mem) * bt)
					var out float32
					for j := range row {
						row[j] += float32(kt[j] * d)
						out += float32(row[j] * qt[j])
					}
					yt[i] = out
				}
			}
		}
	})
	return ya, heapF32([]int{Hv, Dv, Dk}, S)
}
