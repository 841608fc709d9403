//go:build !amd64 || purego

package cpu

func hasSIMD() bool { return false }

func dot2x4AVX(x0, x1, w0, w1, w2, w3 *float32, n int, acc *[64]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func dot1x4AVX(x0, w0, w1, w2, w3 *float32, n int, acc *[32]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q4dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func axpyAVX(a float32, x, y *float32, n int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q4expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32) {
	panic("cpu: no SIMD kernels on this platform")
}

const halfSIMD = false

func bf16WidenAVX(src *uint16, dst *float32, n int) {
	panic("cpu: no SIMD kernels on this platform")
}

func f16WidenAVX(src *uint16, dst *float32, n int) {
	panic("cpu: no SIMD kernels on this platform")
}

func gemm3x4AVX(x *float32, ldx, triples int, w0, w1, w2, w3 *float32, k int, out *float32, ldo int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q4dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q4dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func scaleMaxAVX(row *float32, n int, scale float32) (float32, int) {
	panic("cpu: no SIMD kernels on this platform")
}

func wsumAVX(p *float32, n int, v *float32, vstride int, o *float32, chunks int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q4i16dot8AVX(p *iqArgs, res *[8]float32) { panic("cpu: no SIMD kernels on this platform") }

func q8i16dot8AVX(p *iqArgs, res *[8]float32) { panic("cpu: no SIMD kernels on this platform") }

func q4i16unpack8AVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8i16unpack8AVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func i16gemm8AVX(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func iqquantAVX(x *float32, nblk int, q *int16, m *iqMeta, nibble int) {
	panic("cpu: no SIMD kernels on this platform")
}

func hasVNNI() bool { return false }

func q4i16dot8VNNI(p *iqArgs, res *[8]float32) { panic("cpu: no SIMD kernels on this platform") }

func q8i16dot8VNNI(p *iqArgs, res *[8]float32) { panic("cpu: no SIMD kernels on this platform") }

func q4i16unpack8TAVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8i16unpack8TAVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func i16gemm8x1VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x2VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x3VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x4VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x5VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x6VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x7VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm8x8VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func hasVNNI512() bool { return false }

func q4i16unpack8TWAVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func q8i16unpack8TWAVX(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}

func i16gemm16x1VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x2VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x3VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x4VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x5VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x6VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x7VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func i16gemm16x8VNNI(p *iqArgs) { panic("cpu: no SIMD kernels on this platform") }

func expSumAVX(row *float32, n int, m float32, acc *[8]float32) {
	panic("cpu: no SIMD kernels on this platform")
}

func swigluAVX(out, gate, up *float32, n int) { panic("cpu: no SIMD kernels on this platform") }

func hasVBMI() bool { return false }

func q4i16unpack8TWVBMI(words *uint32, wstride, nblk int, dst *int16, ahead int) {
	panic("cpu: no SIMD kernels on this platform")
}
