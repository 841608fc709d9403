//go:build cgo && (linux || darwin)

package mlx

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Device sampling (engine.RowSampler): the whole pick, penalties to the
// inverse-CDF draw, is one mlx-c shim (xmx_sample_rows, capi.go), so a
// step's sampling costs the host one call however many ops it has.

// The params columns of xmx_sample_rows are engine's.
var _ = [1]struct{}{}[engine.SPCount-C.XMX_SP_N]

func (b *backend) CanSampleRows() bool { return C.xmx_has_sample() != 0 }

func (b *backend) SampleRows(logits engine.Array, sa *engine.SampleArrays) (tok, seen, counts engine.Array) {
	ta := &array{owner: b}
	var sn, cn *array
	if sa.Seen != nil {
		sn = &array{owner: b}
	}
	if sa.Counts != nil {
		cn = &array{owner: b}
	}
	handle := func(x engine.Array) C.xmx_array {
		if x == nil {
			return C.xmx_array{}
		}
		return b.arr(x).h
	}
	b.post(func() {
		la, pa := b.arr(logits), b.arr(sa.Params)
		if len(la.shape) != 2 || len(pa.shape) != 2 || pa.shape[0] != la.shape[0] || pa.shape[1] != engine.SPCount {
			panic(fmt.Sprintf("mlx: SampleRows: logits %v, params %v", la.shape, pa.shape))
		}
		u := handle(sa.U)
		if sa.U == nil {
			u = handle(sa.Params) // unused: no row samples
		}
		var rt, rs, rc C.xmx_array
		if C.xmx_sample_rows(&rt, &rs, &rc, la.h, pa.h, u, handle(sa.Bias), handle(sa.Seen), handle(sa.Counts),
			cbool(sa.Sampled), cbool(sa.Sorted), cbool(sa.TopP), b.stream) != 0 {
			for _, r := range []C.xmx_array{rt, rs, rc} {
				if r.ctx != nil {
					C.xmx_array_free(r)
				}
			}
			panic(mlxErr("sample rows"))
		}
		b.adopt(ta, b.track(rt))
		if sn != nil {
			b.adopt(sn, b.track(rs))
		}
		if cn != nil {
			b.adopt(cn, b.track(rc))
		}
	})
	tok = ta
	if sn != nil {
		seen = sn
	}
	if cn != nil {
		counts = cn
	}
	return tok, seen, counts
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}
