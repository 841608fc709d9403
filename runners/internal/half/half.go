// Package half converts between float32 and the two 16-bit float formats
// the runners use: IEEE 754 binary16 (f16) and bfloat16 (bf16). It is the
// one implementation shared by the CPU backend, the weight loaders, the KV
// wire and the KV dtype conversion, so that every copy of a tensor rounds
// the same way. It is a leaf: it imports only the standard library and
// must not import anything else in this module (runners/kvwire relies on
// that to stay independent of runners/engine).
//
// Narrowing rounds to nearest, ties to even; values beyond f16's range
// become ±Inf; NaN stays NaN (f16: the canonical quiet NaN with the
// input's sign; bf16: the input's top bits with the quiet bit set);
// f16 subnormals are produced and read exactly. Widening is exact.
package half

import "math"

// F16ToF32 widens IEEE half bits to float32 (exact, including subnormals;
// a NaN keeps its payload).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf, NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = man·2^-24, exact in float32.
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToF16 narrows float32 to IEEE half bits, rounding to nearest, ties to
// even, with overflow to ±Inf and gradual underflow.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half (or zero): a half subnormal unit is 2^-24.
		if e < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rest := man & (1<<shift - 1)
		r := man >> shift
		if rest > half || (rest == half && r&1 == 1) {
			r++ // may carry into the smallest normal, which is right
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rest := man & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is right (up to Inf)
	}
	return sign | uint16(r)
}

// BF16ToF32 widens bfloat16 bits to float32 (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 narrows float32 to bfloat16 bits, rounding to nearest, ties to
// even; NaN stays NaN (quieted, sign kept).
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// WidenF16 writes F16ToF32(src[i]) to dst[i]; len(dst) must be at least
// len(src).
func WidenF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = F16ToF32(h)
	}
}

// WidenBF16 writes BF16ToF32(src[i]) to dst[i]; len(dst) must be at least
// len(src).
func WidenBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = BF16ToF32(h)
	}
}

// NarrowF16 writes F32ToF16(src[i]) to dst[i]; len(dst) must be at least
// len(src).
func NarrowF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToF16(f)
	}
}

// NarrowBF16 writes F32ToBF16(src[i]) to dst[i]; len(dst) must be at least
// len(src).
func NarrowBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToBF16(f)
	}
}
