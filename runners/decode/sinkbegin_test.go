package decode

import (
	"errors"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// geomCache is a KVCache of which the sinks' header check reads only the
// geometry and dtype.
type geomCache struct {
	engine.KVCache
	g engine.CacheGeometry
}

func (c geomCache) Geometry() engine.CacheGeometry { return c.g }
func (c geomCache) DType() engine.DType            { return engine.F32 }

// TestSinkBegin: the one header check of the whole-cache, pipeline-stage
// and head-piece sinks (cacheSink.begin) accepts a stream of the cache's
// start, dtype, heads, head dim and windows, over all its layers (whole)
// or the stage's from off, and refuses by sentinel a stream starting
// elsewhere (corrupt), of an unknown dtype, too many or too few layers,
// other heads or head dim, or another window (mismatch); an FP8 stream is
// widened into the cache dtype.
func TestSinkBegin(t *testing.T) {
	cache := geomCache{g: engine.CacheGeometry{Layers: 4, KVHeads: 4, HeadDim: 8, Windows: []int{0, 16, 0, 16}}}
	hdr := func(layers, heads, dim int, windows []int, dt kvwire.DType) *kvwire.Header {
		return &kvwire.Header{DType: dt, KVHeads: heads, HeadDim: dim, Kinds: make([]kvwire.LayerKind, layers), Windows: windows, TokenStart: 3}
	}
	all := []int{0, 16, 0, 16}
	for _, tc := range []struct {
		name        string
		h           *kvwire.Header
		off, heads  int
		whole       bool
		start       int
		want        error
		fp8, widens bool
	}{
		{"whole cache", hdr(4, 4, 8, all, kvwire.DTypeF32), 0, 4, true, 3, nil, false, false},
		{"whole cache, fp8", hdr(4, 4, 8, all, kvwire.DTypeF8E4M3), 0, 4, true, 3, nil, true, true},
		{"stage from layer 1", hdr(2, 4, 8, []int{16, 0}, kvwire.DTypeF32), 1, 4, false, 3, nil, false, false},
		{"last stage", hdr(1, 4, 8, []int{16}, kvwire.DTypeF32), 3, 4, false, 3, nil, false, false},
		{"head piece", hdr(4, 2, 8, all, kvwire.DTypeBF16), 0, 2, true, 3, nil, false, false},
		{"starts elsewhere", hdr(4, 4, 8, all, kvwire.DTypeF32), 0, 4, true, 0, kvwire.ErrCorrupt, false, false},
		{"unknown dtype", hdr(4, 4, 8, all, kvwire.DType(99)), 0, 4, true, 3, kvwire.ErrMismatch, false, false},
		{"too few layers for a whole cache", hdr(3, 4, 8, all[:3], kvwire.DTypeF32), 0, 4, true, 3, kvwire.ErrMismatch, false, false},
		{"stage past the cache's layers", hdr(2, 4, 8, []int{0, 16}, kvwire.DTypeF32), 3, 4, false, 3, kvwire.ErrMismatch, false, false},
		{"other heads", hdr(4, 2, 8, all, kvwire.DTypeF32), 0, 4, true, 3, kvwire.ErrMismatch, false, false},
		{"a piece's heads but the cache's asked", hdr(4, 4, 8, all, kvwire.DTypeF32), 0, 2, true, 3, kvwire.ErrMismatch, false, false},
		{"other head dim", hdr(4, 4, 16, all, kvwire.DTypeF32), 0, 4, true, 3, kvwire.ErrMismatch, false, false},
		{"other window", hdr(4, 4, 8, []int{0, 8, 0, 16}, kvwire.DTypeF32), 0, 4, true, 3, kvwire.ErrMismatch, false, false},
		{"stage's window off by its offset", hdr(2, 4, 8, []int{0, 16}, kvwire.DTypeF32), 1, 4, false, 3, kvwire.ErrMismatch, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &cacheSink{cache: cache, start: tc.start}
			err := s.begin(tc.h, tc.off, tc.heads, tc.whole)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if s.fp8 != tc.fp8 || tc.widens && (s.wire != engine.F32 || s.heads != tc.h.KVHeads) {
					t.Fatalf("fp8 %v, wire %v, heads %d", s.fp8, s.wire, s.heads)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}
