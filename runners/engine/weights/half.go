package weights

import "github.com/exo-pd/exo-pd/runners/internal/half"

// The conversions below are this package's public names for the shared
// implementation in runners/internal/half (callers outside runners/, such
// as generators and tests, use them).

// F16ToF32 converts an IEEE 754 half-precision value to float32.
func F16ToF32(h uint16) float32 { return half.F16ToF32(h) }

// F32ToF16 converts float32 to IEEE half precision, rounding to nearest
// even; overflow gives infinity.
func F32ToF16(f float32) uint16 { return half.F32ToF16(f) }

// BF16ToF32 converts a bfloat16 value to float32.
func BF16ToF32(h uint16) float32 { return half.BF16ToF32(h) }

// F32ToBF16 converts float32 to bfloat16, rounding to nearest even (NaN
// stays NaN).
func F32ToBF16(f float32) uint16 { return half.F32ToBF16(f) }
