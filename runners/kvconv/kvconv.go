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
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// Wire maps an engine dtype to the wire's (0 when it has none).
func Wire(d engine.DType) kvwire.DType {
	switch d {
	case engine.F32:
		return kvwire.DTypeF32
	case engine.F16:
		return kvwire.DTypeF16
	case engine.BF16:
		return kvwire.DTypeBF16
	}
	return 0
}

// Engine maps a wire dtype to the engine's (0 when invalid).
func Engine(d kvwire.DType) engine.DType {
	switch d {
	case kvwire.DTypeF32:
		return engine.F32
	case kvwire.DTypeF16:
		return engine.F16
	case kvwire.DTypeBF16:
		return engine.BF16
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
			f = HalfToFloat(binary.LittleEndian.Uint16(src[2*i:]))
		case engine.BF16:
			f = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
		switch to {
		case engine.F32:
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		case engine.F16:
			binary.LittleEndian.PutUint16(dst[2*i:], FloatToHalf(f))
		case engine.BF16:
			binary.LittleEndian.PutUint16(dst[2*i:], FloatToBF16(f))
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

// FloatToBF16 rounds to nearest even (NaN stays NaN).
func FloatToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// HalfToFloat converts IEEE binary16 to float32.
func HalfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// FloatToHalf converts float32 to IEEE binary16, rounding to nearest even.
func FloatToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case exp >= 0x1f: // overflow or Inf
		return sign | 0x7c00
	case exp <= 0: // subnormal or zero
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - exp)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || rem == mid && half&1 == 1 {
			half++
		}
		return sign | uint16(half)
	}
	half := uint16(exp)<<10 | uint16(mant>>13)
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && half&1 == 1 {
		half++
	}
	return sign | half
}
