package kvwire

import (
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/internal/half"
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
			f = math.Float32bits(half.F16ToF32(le.Uint16(src[2*i:])))
		}
		switch to {
		case DTypeF32:
			le.PutUint32(dst[4*i:], f)
		case DTypeBF16:
			le.PutUint16(dst[2*i:], half.F32ToBF16(math.Float32frombits(f)))
		case DTypeF16:
			le.PutUint16(dst[2*i:], half.F32ToF16(math.Float32frombits(f)))
		}
	}
	return nil
}
