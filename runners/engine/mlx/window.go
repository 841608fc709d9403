//go:build cgo && (linux || darwin)

package mlx

// #include "capi.h"
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// WindowedAttention is MLX's fused attention with an additive mask that
// keeps each query's last window keys (made on the host: [L, T]) and the
// per-head sinks, which MLX's scaled_dot_product_attention takes as they
// are (mlx-lm's gpt_oss passes them the same way).
func (b *backend) WindowedAttention(q, k, v engine.Array, scale float32, window int, sinks engine.Array) engine.Array {
	if window <= 0 && sinks == nil {
		return b.Attention(q, k, v, scale)
	}
	return b.op(func() *array {
		qa, ka, va := b.arr(q), b.arr(k), b.arr(v)
		if len(qa.shape) != 3 || len(ka.shape) != 3 || len(va.shape) != 3 {
			panic(fmt.Sprintf("mlx: WindowedAttention wants q [H, L, Dh], k, v [Hkv, T, Dh]; got %v %v %v", qa.shape, ka.shape, va.shape))
		}
		h, l, dh := qa.shape[0], qa.shape[1], qa.shape[2]
		t := ka.shape[1]
		if ka.shape[0] == 0 || h%ka.shape[0] != 0 || ka.shape[2] != dh || !slices.Equal(ka.shape, va.shape) || t < l {
			panic(fmt.Sprintf("mlx: WindowedAttention shapes q %v k %v v %v", qa.shape, ka.shape, va.shape))
		}
		q4, k4, v4 := b.expandDims(qa, 0), b.expandDims(ka, 0), b.expandDims(va, 0)
		mode := maskNone
		var mask C.xmx_array
		needMask := window > 0 && (l > 1 || t > window)
		switch {
		case needMask:
			// Query i (key index t-l+i) sees keys t-l+i-window+1..t-l+i.
			neg := math.Float32bits(float32(math.Inf(-1)))
			buf := make([]byte, 4*l*t)
			for i := range l {
				last := t - l + i
				for j := range t {
					if j > last || j <= last-window {
						binary.LittleEndian.PutUint32(buf[4*(i*t+j):], neg)
					}
				}
			}
			m := b.astype(b.fromBytes(buf, []int{l, t}, engine.F32), qa.mdt)
			mask = m.h
		case l > 1:
			mode = maskCausal
		}
		var sk C.xmx_array
		if sinks != nil {
			sa := b.arr(sinks)
			if len(sa.shape) != 1 || sa.shape[0] != h {
				panic(fmt.Sprintf("mlx: WindowedAttention: sinks %v for %d heads", sa.shape, h))
			}
			sk = b.astype(sa, qa.mdt).h
		}
		o := b.mk("scaled_dot_product_attention", func(r *C.xmx_array) C.int {
			return C.xmx_sdpa_ext(r, q4.h, k4.h, v4.h, C.float(scale), mode, mask, sk, b.stream)
		})
		return b.reshape(o, h, l, dh)
	})
}
