package kvwire

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// FP8 E4M3 (the "fn" variant: bias 7, no infinities, 0x7f/0xff NaN, largest
// finite ±448) is the opt-in wire element type for attention KV (issue 15).
// Each head of a chunk's K and of its V carries one float32 scale; elements
// are value/scale, encoded round-to-nearest-even and saturating to ±448.

// E4M3Max is the largest finite E4M3 value.
const E4M3Max = 448

// F32ToE4M3 encodes f round-to-nearest-even. Finite values beyond ±448 and
// ±Inf saturate to ±448 (the reference ml_dtypes turns them into NaN; we
// saturate so one outlier cannot poison a head); NaN stays NaN (sign kept).
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>31) << 7
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7f
	case a >= 0x43e00000: // ≥ 2^8: round in the top binade, then saturate
		if a >= 0x43e80000+1 { // beyond 464 (the tie at 464 rounds to 448)
			return sign | 0x7e
		}
	case a < 0x3c800000: // below 2^-6: subnormal, steps of 2^-9
		q := math.RoundToEven(float64(math.Float32frombits(a)) * 512)
		return sign | uint8(q) // q ≤ 8, and 8 is the smallest normal 0x08
	}
	lsb := (a >> 20) & 1
	u := (a + 0x7ffff + lsb) >> 20 // f32 exponent and 3 mantissa bits, rounded
	u -= (127 - 7) << 3
	if u > 0x7e {
		u = 0x7e
	}
	return sign | uint8(u)
}

// E4M3ToF32 widens an E4M3 byte exactly.
func E4M3ToF32(q uint8) float32 {
	e, m := int(q>>3)&0xf, float64(q&7)
	var v float64
	switch {
	case e == 0xf && m == 7:
		v = math.NaN()
	case e == 0:
		v = m * 0x1p-9
	default:
		v = (1 + m/8) * math.Ldexp(1, e-7)
	}
	if q&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// FP8Len is the byte length of one K (or V) section of an FP8 chunk:
// heads float32 scales, then one byte per element.
func FP8Len(heads, elems int) int { return 4*heads + elems }

// EncodeFP8 encodes src ([heads, …] row-major elements of from) into dst
// (FP8Len(heads, n) bytes): per head the scale amax/448 over its finite
// elements (1 when all are zero or non-finite), then the scaled elements.
func EncodeFP8(dst []byte, src []byte, from DType, heads int) error {
	fs := from.Size()
	if fs == 0 || heads <= 0 || len(src)%fs != 0 || (len(src)/fs)%heads != 0 {
		return fmt.Errorf("kvwire: fp8 encode: %d bytes of %v over %d heads", len(src), from, heads)
	}
	n := len(src) / fs
	if len(dst) != FP8Len(heads, n) {
		return fmt.Errorf("kvwire: fp8 encode: dst %d bytes, want %d", len(dst), FP8Len(heads, n))
	}
	per := n / heads
	at := func(i int) float32 {
		switch from {
		case DTypeF32:
			return math.Float32frombits(le.Uint32(src[4*i:]))
		case DTypeBF16:
			return half.BF16ToF32(le.Uint16(src[2*i:]))
		default:
			return half.F16ToF32(le.Uint16(src[2*i:]))
		}
	}
	body := dst[4*heads:]
	for h := range heads {
		var amax float32
		for i := h * per; i < (h+1)*per; i++ {
			if a := float32(math.Abs(float64(at(i)))); a > amax && !math.IsInf(float64(a), 0) {
				amax = a
			}
		}
		scale := amax / E4M3Max
		if scale == 0 || math.IsInf(float64(scale), 0) || scale < math.SmallestNonzeroFloat32*1e10 {
			scale = 1
		}
		le.PutUint32(dst[4*h:], math.Float32bits(scale))
		inv := 1 / scale
		for i := h * per; i < (h+1)*per; i++ {
			body[i] = F32ToE4M3(at(i) * inv)
		}
	}
	return nil
}

// DecodeFP8 widens an FP8 section (src, as EncodeFP8 writes it) into dst as
// dtype to (len(dst) = elements · to.Size()). Bytes come from a peer: a
// scale that is not finite and positive, or a length that does not fit, is
// ErrCorrupt.
func DecodeFP8(dst []byte, to DType, src []byte, heads int) error {
	ts := to.Size()
	if ts == 0 || heads <= 0 || len(dst)%ts != 0 {
		return fmt.Errorf("kvwire: fp8 decode into %d bytes of %v over %d heads", len(dst), to, heads)
	}
	n := len(dst) / ts
	if n%heads != 0 || len(src) != FP8Len(heads, n) {
		return fmt.Errorf("%w: fp8 section of %d bytes, want %d (%d elements over %d heads)", ErrCorrupt, len(src), FP8Len(heads, n), n, heads)
	}
	per := n / heads
	body := src[4*heads:]
	for h := range heads {
		scale := math.Float32frombits(le.Uint32(src[4*h:]))
		if !(scale > 0) || math.IsInf(float64(scale), 0) {
			return fmt.Errorf("%w: fp8 head %d scale %v", ErrCorrupt, h, scale)
		}
		for i := h * per; i < (h+1)*per; i++ {
			v := E4M3ToF32(body[i]) * scale
			switch to {
			case DTypeF32:
				le.PutUint32(dst[4*i:], math.Float32bits(v))
			case DTypeBF16:
				le.PutUint16(dst[2*i:], half.F32ToBF16(v))
			default:
				le.PutUint16(dst[2*i:], half.F32ToF16(v))
			}
		}
	}
	return nil
}
