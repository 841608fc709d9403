package kvwire

import (
	"fmt"
	"math"
)

// ConvertedLen is the byte length of src (n elements of from) as elements
// of to.
func ConvertedLen(srcLen int, from, to DType) int {
	if from.Size() == 0 || to.Size() == 0 {
		return 0
	}
	return srcLen / from.Size() * to.Size()
}

// Convert writes the elements of src (dtype from, little-endian) into dst
// as dtype to. The decode side uses it when the wire dtype differs from its
// cache dtype. Narrowing rounds to nearest, ties to even; values beyond
// f16's range become ±Inf; NaN stays NaN. len(dst) must be
// ConvertedLen(len(src), from, to). Same dtypes copy.
func Convert(dst []byte, to DType, src []byte, from DType) error {
	fs, ts := from.Size(), to.Size()
	if fs == 0 || ts == 0 {
		return fmt.Errorf("kvwire: convert %v → %v: unknown dtype", from, to)
	}
	if len(src)%fs != 0 || len(dst) != len(src)/fs*ts {
		return fmt.Errorf("kvwire: convert %v → %v: %d source bytes into %d", from, to, len(src), len(dst))
	}
	if from == to {
		copy(dst, src)
		return nil
	}
	n := len(src) / fs
	for i := range n {
		var f uint32
		switch from {
		case DTypeF32:
			f = le.Uint32(src[4*i:])
		case DTypeBF16:
			f = uint32(le.Uint16(src[2*i:])) << 16
		case DTypeF16:
			f = f16ToF32(le.Uint16(src[2*i:]))
		}
		switch to {
		case DTypeF32:
			le.PutUint32(dst[4*i:], f)
		case DTypeBF16:
			le.PutUint16(dst[2*i:], f32ToBF16(f))
		case DTypeF16:
			le.PutUint16(dst[2*i:], f32ToF16(f))
		}
	}
	return nil
}

// f32ToBF16 rounds float32 bits to bfloat16 bits (nearest, ties to even).
func f32ToBF16(f uint32) uint16 {
	if f&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and signed
		return uint16(f>>16) | 0x0040
	}
	f += 0x7fff + (f>>16)&1
	return uint16(f >> 16)
}

// f32ToF16 rounds float32 bits to IEEE half bits (nearest, ties to even).
func f32ToF16(f uint32) uint16 {
	sign := uint16(f>>16) & 0x8000
	exp := int(f>>23) & 0xff
	mant := f & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half (or zero): the value is m·2^(exp−150) with the
		// implicit bit; a half subnormal unit is 2^−24.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to Inf
	}
	return sign | uint16(h)
}

// f16ToF32 widens IEEE half bits to float32 bits (exact).
func f16ToF32(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return sign | 0x7f800000 | mant<<13
	case exp == 0:
		if mant == 0 {
			return sign
		}
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return sign | e<<23 | (mant&0x3ff)<<13
	}
	return sign | (exp+127-15)<<23 | mant<<13
}

// f16Value is the exact value of half bits (for tests and docs).
func f16Value(h uint16) float64 {
	return float64(math.Float32frombits(f16ToF32(h)))
}
