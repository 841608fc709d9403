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
		if C.xmx_sample_rows(&rt, &rs, &rc, la.h, pa.h, u, handle(sa.Mask), handle(sa.Bias), handle(sa.Seen), handle(sa.Counts),
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

// RowLogprobs implements engine.RowLogprober: one mlx-c shim
// (xmx_logprobs) computes the log-softmax at each row's token and the top
// alternatives by a stable sort of the logits.
func (b *backend) RowLogprobs(logits, tok engine.Array, top int) (chosen, ids, vals engine.Array) {
	ca := &array{owner: b}
	var ia, va *array
	if top > 0 {
		ia, va = &array{owner: b}, &array{owner: b}
	}
	b.post(func() {
		la, ta := b.arr(logits), b.arr(tok)
		if len(la.shape) != 2 || len(ta.shape) != 1 || ta.shape[0] != la.shape[0] || top > la.shape[1] {
			panic(fmt.Sprintf("mlx: RowLogprobs: logits %v, tokens %v, top %d", la.shape, ta.shape, top))
		}
		var rc, ri, rv C.xmx_array
		if C.xmx_logprobs(&rc, &ri, &rv, la.h, ta.h, C.int(top), b.stream) != 0 {
			for _, r := range []C.xmx_array{rc, ri, rv} {
				if r.ctx != nil {
					C.xmx_array_free(r)
				}
			}
			panic(mlxErr("row logprobs"))
		}
		b.adopt(ca, b.track(rc))
		if ia != nil {
			b.adopt(ia, b.track(ri))
			b.adopt(va, b.track(rv))
		}
	})
	chosen = ca
	if ia != nil {
		ids, vals = ia, va
	}
	return chosen, ids, vals
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}
