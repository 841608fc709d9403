//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// hasSIMD reports whether the AVX2+FMA kernels in simd_amd64.s can run.
func hasSIMD() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }

// dot2x4AVX accumulates the 2×4 block of dot products of x0, x1 with w0..w3
// over n elements (n a multiple of 8) into acc: lane l of pair (i, k) at
// acc[(i*4+k)*8+l].
//
//go:noescape
func dot2x4AVX(x0, x1, w0, w1, w2, w3 *float32, n int, acc *[64]float32)

// dot1x4AVX is dot2x4AVX for one input row: acc[k*8+l].
//
//go:noescape
func dot1x4AVX(x0, w0, w1, w2, w3 *float32, n int, acc *[32]float32)

// q4dotAVX accumulates, lane-wise, w·x over ngroups groups of 8·iters
// elements of one 4-bit weight row, w widened in registers exactly as
// q4expandAVX would (so results match the expand path bit for bit).
//
//go:noescape
func q4dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32)

// q8dotAVX is q4dotAVX for 8-bit weights.
//
//go:noescape
func q8dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32)

// axpyAVX adds a·x to y over n elements (n a multiple of 8).
//
//go:noescape
func axpyAVX(a float32, x, y *float32, n int)

// q4expandAVX writes scale·q + bias for ngroups groups of 8·iters 4-bit
// values to dst.
//
//go:noescape
func q4expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32)

// q8expandAVX is q4expandAVX for 8-bit values.
//
//go:noescape
func q8expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32)

// halfSIMD reports whether bf16WidenAVX and f16WidenAVX can run (their
// results are exact, so callers need no switch for testing).
var halfSIMD = cpu.X86.HasAVX2 && cpu.X86.HasF16C

//go:noescape
func bf16WidenAVX(src *uint16, dst *float32, n int)

//go:noescape
func f16WidenAVX(src *uint16, dst *float32, n int)

// gemm3x4AVX computes 3×4 blocks of dot products for `triples` groups of
// three consecutive x rows against four weight rows and stores them (see
// simd_amd64.s); ldx and ldo are row strides in bytes.
//
//go:noescape
func gemm3x4AVX(x *float32, ldx, triples int, w0, w1, w2, w3 *float32, k int, out *float32, ldo int)

// q4dot4AVX is q4dotAVX for four consecutive weight rows at once (strides
// in bytes), bit-identical per row.
//
//go:noescape
func q4dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32)

// q8dot4AVX is q4dot4AVX for 8-bit weights.
//
//go:noescape
func q8dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32)

// q4dot4HAVX is q4dot4AVX with float16 scales and biases (sstride in
// bytes), widened exactly in registers: bit-identical results, and a
// quarter less memory traffic per 4-bit weight (decode is bandwidth-bound).
//
//go:noescape
func q4dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32)

// q8dot4HAVX is q4dot4HAVX for 8-bit weights.
//
//go:noescape
func q8dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32)

// scaleMaxAVX multiplies n (a multiple of 8, > 0) elements of row by
// scale and returns their maximum; nan is non-zero when a product is NaN.
//
//go:noescape
func scaleMaxAVX(row *float32, n int, scale float32) (m float32, nan int)

// wsumAVX adds Σ_t p[t]·v_t to o over chunks groups of 8 lanes, t in
// order, each step one fused multiply-add per element: bit-identical to
// axpyAVX(p[t], v_t, o) for t = 0..n-1, without reloading o per key. vstride
// is in bytes.
//
//go:noescape
func wsumAVX(p *float32, n int, v *float32, vstride int, o *float32, chunks int)

// q4i16dot8AVX computes iq.go's integer products of 4-bit weight rows
// j..j+7 with one quantized input row (p describes both) into res.
//
//go:noescape
func q4i16dot8AVX(p *iqArgs, res *[8]float32)

// q8i16dot8AVX is q4i16dot8AVX for 8-bit weights.
//
//go:noescape
func q8i16dot8AVX(p *iqArgs, res *[8]float32)

// q4i16unpack8AVX writes 4-bit weight rows 0..7 (words, wstride bytes
// apart) as int16 for i16gemm8AVX: for each of nblk blocks, eight rows of
// 32 values in nibble order (even elements, then odd ones). Every
// unpacking prefetches the same blocks of the rows ahead bytes further on
// (the next group's: its words arrive while the gemm runs over these).
//
//go:noescape
func q4i16unpack8AVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

// q8i16unpack8AVX is q4i16unpack8AVX for 8-bit rows (element order).
//
//go:noescape
func q8i16unpack8AVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

// i16gemm8AVX is q4i16dot8AVX for p.rows input rows against eight weight
// rows unpacked by q4i16unpack8AVX or q8i16unpack8AVX (p.w8), writing each
// row's eight results to p.out, p.ldo bytes apart.
//
//go:noescape
func i16gemm8AVX(p *iqArgs)

// iqquantAVX quantizes nblk blocks of 32 floats for iq.go (see the
// assembly's comment for what it leaves in m).
//
//go:noescape
func iqquantAVX(x *float32, nblk int, q *int16, m *iqMeta, nibble int)

// hasVNNI reports whether the VNNI variants of the integer kernels can run
// (VPDPWSSD on 256-bit registers: AVX-512 VNNI and VL).
func hasVNNI() bool { return hasSIMD() && cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512VL }

// q4i16dot8VNNI and q8i16dot8VNNI are the AVX2 kernels with VPDPWSSD
// folding a multiply-add pair (the same exact integer sums).
//
//go:noescape
func q4i16dot8VNNI(p *iqArgs, res *[8]float32)

//go:noescape
func q8i16dot8VNNI(p *iqArgs, res *[8]float32)

// q4i16unpack8TAVX and q8i16unpack8TAVX are q4i16unpack8AVX and
// q8i16unpack8AVX writing pairs interleaved for the VNNI gemm: in each
// block's 512 bytes, the dword at 32j + 4r holds values 2j and 2j+1 of row
// r (kernel order).
//
//go:noescape
func q4i16unpack8TAVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

//go:noescape
func q8i16unpack8TAVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

// i16gemm8x1VNNI … i16gemm8x8VNNI compute exactly what i16gemm8AVX does
// for 1 … 8 input rows (p.rows is not read) against eight weight rows
// unpacked by the T variants: each activation pair is a broadcast operand
// of VPDPWSSD, so an accumulator's lanes are the eight rows' sums and no
// horizontal reduction is needed.
//
//go:noescape
func i16gemm8x1VNNI(p *iqArgs)

//go:noescape
func i16gemm8x2VNNI(p *iqArgs)

//go:noescape
func i16gemm8x3VNNI(p *iqArgs)

//go:noescape
func i16gemm8x4VNNI(p *iqArgs)

//go:noescape
func i16gemm8x5VNNI(p *iqArgs)

//go:noescape
func i16gemm8x6VNNI(p *iqArgs)

//go:noescape
func i16gemm8x7VNNI(p *iqArgs)

//go:noescape
func i16gemm8x8VNNI(p *iqArgs)

// hasVNNI512 reports whether the 512-bit gemm (i16gemm16x*VNNI) can run.
func hasVNNI512() bool { return hasVNNI() && cpu.X86.HasAVX512F }

// q4i16unpack8TWAVX and q8i16unpack8TWAVX are the T variants for the
// 512-bit gemm: the same 32-byte pair registers, 64 bytes apart (pair j of
// the block at 64j, blocks 1024 bytes apart), so that a second call 32
// bytes further on fills in eight more rows.
//
//go:noescape
func q4i16unpack8TWAVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

//go:noescape
func q8i16unpack8TWAVX(words *uint32, wstride, nblk int, dst *int16, ahead int)

// i16gemm16x1VNNI … i16gemm16x8VNNI are i16gemm8x*VNNI on 512-bit
// registers: sixteen weight rows (two groups of eight, unpacked by the TW
// variants; the second group's scales and biases p.sstride bytes after the
// first's), the same operations per lane and so the same bits.
//
//go:noescape
func i16gemm16x1VNNI(p *iqArgs)

//go:noescape
func i16gemm16x2VNNI(p *iqArgs)

//go:noescape
func i16gemm16x3VNNI(p *iqArgs)

//go:noescape
func i16gemm16x4VNNI(p *iqArgs)

//go:noescape
func i16gemm16x5VNNI(p *iqArgs)

//go:noescape
func i16gemm16x6VNNI(p *iqArgs)

//go:noescape
func i16gemm16x7VNNI(p *iqArgs)

//go:noescape
func i16gemm16x8VNNI(p *iqArgs)

// expSumAVX is expSum's vector part for n (a multiple of 8) elements:
// row[j] = exp32(row[j] − m), acc[j mod 8] += row[j].
//
//go:noescape
func expSumAVX(row *float32, n int, m float32, acc *[8]float32)

// swigluAVX is swiglu's vector part for n (a multiple of 8) elements.
//
//go:noescape
func swigluAVX(out, gate, up *float32, n int)

// hasVBMI reports whether q4i16unpack8TWVBMI can run.
func hasVBMI() bool { return hasVNNI512() && cpu.X86.HasAVX512VBMI && cpu.X86.HasAVX512BW }

// q4i16unpack8TWVBMI writes what q4i16unpack8TWAVX does with AVX-512
// VBMI byte permutes (about half the instructions; for 8-bit weights the
// permutes gain nothing, so there is no 8-bit variant).
//
//go:noescape
func q4i16unpack8TWVBMI(words *uint32, wstride, nblk int, dst *int16, ahead int)
