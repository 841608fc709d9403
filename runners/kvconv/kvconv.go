// Package kvconv converts KV bytes between the wire and cache element types
// (float32, float16, bfloat16; little-endian) and maps engine dtypes to the
// KV wire's. Both runners use it: the prefill side converts its cache dtype
// to the dtype a decode runner asks for, and the decode side converts
// whatever arrives into its cache dtype. It must not import supervisor/.
package kvconv

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/half"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// dtypes pairs the engine's KV dtypes with the wire's (read-only).
var dtypes = [...]struct {
	e engine.DType
	w kvwire.DType
}{{engine.F32, kvwire.DTypeF32}, {engine.F16, kvwire.DTypeF16}, {engine.BF16, kvwire.DTypeBF16}}

// Wire maps an engine dtype to the wire's (0 when it has none).
func Wire(d engine.DType) kvwire.DType {
	for _, p := range dtypes {
		if p.e == d {
			return p.w
		}
	}
	return 0
}

// Engine maps a wire dtype to the engine's (0 when invalid).
func Engine(d kvwire.DType) engine.DType {
	for _, p := range dtypes {
		if p.w == d {
			return p.e
		}
	}
	return 0
}

// Convert returns src (elements of dtype from) as elements of dtype to. It
// returns src itself when the dtypes are equal, else a new slice.
func Convert(src []byte, from, to engine.DType) ([]byte, error) {
	if from == to {
		return src, nil
	}
	fs, ts := size(from), size(to)
	if fs == 0 || ts == 0 {
		return nil, fmt.Errorf("kvconv: cannot convert %v to %v", from, to)
	}
	if len(src)%fs != 0 {
		return nil, fmt.Errorf("kvconv: %d bytes is not a whole number of %v elements", len(src), from)
	}
	n := len(src) / fs
	dst := make([]byte, n*ts)
	for i := range n {
		var f float32
		switch from {
		case engine.F32:
			f = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		case engine.F16:
			f = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		case engine.BF16:
			f = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
		switch to {
		case engine.F32:
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		case engine.F16:
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToF16(f))
		case engine.BF16:
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToBF16(f))
		}
	}
	return dst, nil
}

func size(d engine.DType) int {
	switch d {
	case engine.F32:
		return 4
	case engine.F16, engine.BF16:
		return 2
	}
	return 0
}
