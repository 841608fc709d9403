package cpu

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// kvRows returns the float32 rows of a K or V array [Hkv, T, Dh] (a cache
// view or a plain array) and the distance between heads in elements.
func kvRows(a *Array) (data []float32, heads, T, dh, headStride int) {
	if a.kv != nil {
		v := a.kv
		if v.dt == engine.F32 {
			return v.f32, v.heads, v.n, v.dh, v.cap * v.dh
		}
		// Expand only the live part of each head.
		out := make([]float32, v.heads*v.n*v.dh)
		for h := 0; h < v.heads; h++ {
			halfToF32(out[h*v.n*v.dh:(h+1)*v.n*v.dh], v.u16[h*v.cap*v.dh:h*v.cap*v.dh+v.n*v.dh], v.dt)
		}
		return out, v.heads, v.n, v.dh, v.n * v.dh
	}
	if len(a.shape) != 3 {
		panic(fmt.Sprintf("cpu: Attention: k/v of shape %v, want [Hkv, T, Dh]", a.shape))
	}
	return floats(a), a.shape[0], a.shape[1], a.shape[2], a.shape[1] * a.shape[2]
}

// Attention computes causal softmax(q kᵀ·scale) v with grouped-query heads.
func (b *Backend) Attention(qa, ka, va engine.Array, scale float32) engine.Array {
	q := arr(qa)
	if len(q.shape) != 3 {
		panic(fmt.Sprintf("cpu: Attention: q of shape %v, want [H, L, Dh]", q.shape))
	}
	H, L, Dh := q.shape[0], q.shape[1], q.shape[2]
	kd, hkv, T, kdh, kst := kvRows(arr(ka))
	vd, vhkv, vT, vdh, vst := kvRows(arr(va))
	if kdh != Dh || vdh != Dh || vhkv != hkv || vT != T || hkv == 0 || H%hkv != 0 || T < L {
		panic(fmt.Sprintf("cpu: Attention: q %v with k [%d %d %d] v [%d %d %d]", q.shape, hkv, T, kdh, vhkv, vT, vdh))
	}
	qv := floats(q)
	group := H / hkv
	out := make([]float32, H*L*Dh)
	rows := H * L
	b.parallel(rows, max(1, 4096/max(1, T)), func(lo, hi int) {
		scores := make([]float32, T)
		acc := make([]float32, Dh)
		for r := lo; r < hi; r++ {
			h, i := r/L, r%L
			kh := h / group
			limit := T - L + i + 1 // keys 0..T-L+i
			qi := qv[(h*L+i)*Dh : (h*L+i+1)*Dh]
			kbase := kd[kh*kst:]
			vbase := vd[kh*vst:]
			m := float32(math.Inf(-1))
			for t := range limit {
				s := dot(qi, kbase[t*Dh:(t+1)*Dh]) * scale
				scores[t] = s
				m = max(m, s)
			}
			var sum float32
			for t := range limit {
				p := float32(math.Exp(float64(scores[t] - m)))
				scores[t] = p
				sum += p
			}
			clear(acc)
			for t := range limit {
				p := scores[t]
				vr := vbase[t*Dh : (t+1)*Dh : (t+1)*Dh]
				for d := range acc {
					acc[d] += p * vr[d]
				}
			}
			inv := 1 / sum
			o := out[(h*L+i)*Dh : (h*L+i+1)*Dh]
			for d := range o {
				o[d] = acc[d] * inv
			}
		}
	})
	return newF32([]int{H, L, Dh}, out)
}

// RoPE rotates the first r.Dims dims of x [H, L, Dh] ("rotate half" form)
// for positions offset..offset+L-1.
func (b *Backend) RoPE(xa engine.Array, offset int, r *engine.RoPE) engine.Array {
	x := arr(xa)
	if len(x.shape) != 3 {
		panic(fmt.Sprintf("cpu: RoPE: x of shape %v, want [H, L, Dh]", x.shape))
	}
	H, L, Dh := x.shape[0], x.shape[1], x.shape[2]
	dims := r.Dims
	if dims == 0 {
		dims = Dh
	}
	if dims > Dh || dims%2 != 0 {
		panic(fmt.Sprintf("cpu: RoPE: %d rotated dims for head dim %d", dims, Dh))
	}
	invFreq, attnFactor, err := engine.RoPEFrequencies(r, dims)
	if err != nil {
		panic(fmt.Errorf("cpu: RoPE: %w", err))
	}
	half := dims / 2
	cos := make([]float32, L*half)
	sin := make([]float32, L*half)
	for i := range L {
		pos := float32(offset + i)
		for j := range half {
			// HF computes the angle in float32: pos · inv_freq.
			ang := float64(pos * invFreq[j])
			cos[i*half+j] = float32(math.Cos(ang)) * attnFactor
			sin[i*half+j] = float32(math.Sin(ang)) * attnFactor
		}
	}
	v := floats(x)
	out := make([]float32, len(v))
	copy(out, v)
	for h := range H {
		for i := range L {
			row := out[(h*L+i)*Dh : (h*L+i)*Dh+dims]
			c := cos[i*half : (i+1)*half]
			s := sin[i*half : (i+1)*half]
			for j := range half {
				x1, x2 := row[j], row[j+half]
				row[j] = x1*c[j] - x2*s[j]
				row[j+half] = x2*c[j] + x1*s[j]
			}
		}
	}
	return newF32(x.shape, out)
}
