package cpu

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// kvRows returns the float32 rows of a K or V array [Hkv, T, Dh] (a cache
// view or a plain array) and the distance between heads in elements.
func (b *Backend) kvRows(a *Array) (data []float32, heads, T, dh, headStride int) {
	if a.kv != nil {
		v := a.kv
		if v.dt == engine.F32 {
			return v.f32, v.heads, v.n, v.dh, v.cap * v.dh
		}
		// Expand only the live part of each head.
		out := b.floats(v.heads * v.n * v.dh)
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
	kd, hkv, T, kdh, kst := b.kvRows(arr(ka))
	vd, vhkv, vT, vdh, vst := b.kvRows(arr(va))
	if kdh != Dh || vdh != Dh || vhkv != hkv || vT != T || hkv == 0 || H%hkv != 0 || T < L {
		panic(fmt.Sprintf("cpu: Attention: q %v with k [%d %d %d] v [%d %d %d]", q.shape, hkv, T, kdh, vhkv, vT, vdh))
	}
	return b.attend(q, kd, vd, H, L, T, Dh, hkv, kst, vst, scale, 0, nil)
}

// attend runs attnTask over the heads of q: Attention's and, with a window
// or sinks, WindowedAttention's body.
func (b *Backend) attend(q *Array, kd, vd []float32, H, L, T, Dh, hkv, kst, vst int, scale float32, window int, sinks []float32) *Array {
	res := b.newF32(H, L, Dh)
	t := &b.att
	*t = attnTask{b: b, q: floats(q), kd: kd, vd: vd, out: res.f32, scratch: t.scratch,
		L: L, T: T, Dh: Dh, group: H / hkv, kst: kst, vst: vst, scale: scale, window: window, sinks: sinks}
	// Each range of heads gets its own scores and row buffers.
	per := L*T + 4*Dh
	if need := b.threads * per; cap(t.scratch) < need {
		// Room for the next kvStep keys too: decode grows T by one a step.
		t.scratch = make([]float32, b.threads*(L*(T+kvStep)+4*Dh))
	}
	b.run(H, 1, t)
	scratch := t.scratch
	*t = attnTask{scratch: scratch}
	return res
}

// attnTask is Attention's work over query heads; the Backend owns one.
//
// Per query head: scores [L, T] = q_h · K_khᵀ on the matmul kernels,
// causal softmax per row, then out_i = Σ_t p_t v_t over the visible keys
// only, accumulated in key order. Every number a row gets is computed
// the same way whatever L and T are, so chunked prefill, one-shot
// prefill and decode agree bit for bit.
type attnTask struct {
	b               *Backend
	q, kd, vd, out  []float32
	scratch         []float32 // threads × (L·T + 4·Dh)
	L, T, Dh, group int
	kst, vst        int
	scale           float32
	window          int       // > 0: each row sees its last window keys only
	sinks           []float32 // per query head, or nil (WindowedAttention)
}

func (t *attnTask) run(lo, hi int) {
	b, L, T, Dh := t.b, t.L, t.T, t.Dh
	// The range's slot in scratch: run's ranges start at multiples of
	// their length.
	_, per := b.split(len(t.out)/(L*Dh), 1)
	slot := lo / per
	sz := L*T + 4*Dh
	mine := t.scratch[slot*sz : (slot+1)*sz]
	scores, buf := mine[:L*T], mine[L*T:]
	var keys weight
	for h := lo; h < hi; h++ {
		kh := h / t.group
		keys = weight{out: T, in: Dh, dt: engine.F32, f32: t.kd[kh*t.kst : kh*t.kst+T*Dh]}
		// Scores row by row block, each only against the keys its rows
		// see (causal, and inside the window): a prompt's first rows skip
		// most of the keys. Each score is one fixed-order dot product, so
		// the bits do not depend on the blocking.
		qh := t.q[h*L*Dh : (h+1)*L*Dh]
		for i0 := 0; i0 < L; i0 += attnRowBlock {
			i1 := min(L, i0+attnRowBlock)
			first := 0
			if t.window > 0 {
				first = max(0, T-L+i0+1-t.window)
			}
			b.gemmBlocks(scores[i0*T:], qh[i0*Dh:], i1-i0, &keys, first/4, (T-L+i1+3)/4, buf)
		}
		vbase := t.vd[kh*t.vst:]
		for i := range L {
			limit := T - L + i + 1 // keys first..T-L+i
			first := 0
			if t.window > 0 {
				first = max(0, limit-t.window)
			}
			row := scores[i*T+first : i*T+limit]
			m := float32(math.Inf(-1))
			if t.sinks != nil {
				m = t.sinks[h]
			}
			m = b.scaleMax(row, t.scale, m)
			sum := b.expSum(row, m)
			if t.sinks != nil {
				sum += exp32(t.sinks[h] - m)
			}
			o := t.out[(h*L+i)*Dh : (h*L+i+1)*Dh]
			vrow := vbase[first*Dh:]
			if b.simd && Dh%8 == 0 && len(row) > 0 {
				_ = vrow[len(row)*Dh-1]
				wsumAVX(&row[0], len(row), &vrow[0], 4*Dh, &o[0], Dh/8)
			} else {
				for j, p := range row {
					b.axpy(p, vrow[j*Dh:(j+1)*Dh], o)
				}
			}
			inv := 1 / sum
			for d := range o {
				o[d] *= inv
			}
		}
	}
}

// scaleMax multiplies row by scale and returns the maximum of m and the
// products (Go's max: NaN wins).
func (b *Backend) scaleMax(row []float32, scale, m float32) float32 {
	j := 0
	if b.simd && len(row) >= 8 {
		j = len(row) &^ 7
		vm, nan := scaleMaxAVX(&row[0], j, scale)
		if nan != 0 {
			vm = float32(math.NaN())
		}
		m = max(m, vm)
	}
	for ; j < len(row); j++ {
		s := row[j] * scale
		row[j] = s
		m = max(m, s)
	}
	return m
}

// attnRowBlock is how many query rows attnTask scores against one range of
// keys (a multiple of gemm3x4AVX's three rows).
const attnRowBlock = 48

// axpy adds a·x to y.
func (b *Backend) axpy(a float32, x, y []float32) {
	n := len(y)
	x = x[:n]
	i := 0
	if b.simd && n >= 8 {
		i = n &^ 7
		axpyAVX(a, &x[0], &y[0], i)
	}
	for ; i < n; i++ {
		y[i] += a * x[i]
	}
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
	invFreq, attnFactor := b.rope.frequencies(r, dims)
	half := dims / 2
	cos := b.floats(L * half)
	sin := b.floats(L * half)
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
	res := b.newF32(x.shape...)
	out := res.f32
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
	return res
}

// ropeCache remembers the inverse frequencies of the last few RoPE
// settings used (a model uses one or two: Gemma 3 alternates local and
// global), so RoPE does not recompute them per call.
type ropeCache struct {
	entries [4]ropeEntry
	next    int
}

type ropeEntry struct {
	key        engine.RoPE
	dims       int
	invFreq    []float32
	attnFactor float32
}

func (c *ropeCache) frequencies(r *engine.RoPE, dims int) ([]float32, float32) {
	for i := range c.entries {
		if e := &c.entries[i]; e.invFreq != nil && e.key == *r && e.dims == dims {
			return e.invFreq, e.attnFactor
		}
	}
	invFreq, attnFactor, err := engine.RoPEFrequencies(r, dims)
	if err != nil {
		panic(fmt.Errorf("cpu: RoPE: %w", err))
	}
	c.entries[c.next] = ropeEntry{key: *r, dims: dims, invFreq: invFreq, attnFactor: attnFactor}
	c.next = (c.next + 1) % len(c.entries)
	return invFreq, attnFactor
}
