package cpu

import (
	"encoding/binary"
	"unsafe"
)

// nativeLittle is true on little-endian machines (every deployment target:
// amd64, arm64), where host bytes and typed slices share a layout and bulk
// copies replace per-element conversion.
var nativeLittle = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// asBytes views a typed slice's memory as bytes (no copy).
func asBytes[T float32 | uint16 | uint32 | int32](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
