//go:build amd64 && !purego

#include "textflag.h"

// func dot2x4AVX(x0, x1, w0, w1, w2, w3 *float32, n int, acc *[64]float32)
TEXT ·dot2x4AVX(SB), NOSPLIT, $0-64
	MOVQ x0+0(FP), SI
	MOVQ x1+8(FP), DI
	MOVQ w0+16(FP), R8
	MOVQ w1+24(FP), R9
	MOVQ w2+32(FP), R10
	MOVQ w3+40(FP), R11
	MOVQ n+48(FP), CX
	MOVQ acc+56(FP), DX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ AX, AX

loop2:
	CMPQ AX, CX
	JGE  done2
	VMOVUPS (SI)(AX*4), Y8
	VMOVUPS (DI)(AX*4), Y9
	VMOVUPS (R8)(AX*4), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS (R9)(AX*4), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS (R10)(AX*4), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS (R11)(AX*4), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $8, AX
	JMP  loop2

done2:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VMOVUPS Y4, 128(DX)
	VMOVUPS Y5, 160(DX)
	VMOVUPS Y6, 192(DX)
	VMOVUPS Y7, 224(DX)
	VZEROUPPER
	RET

// func dot1x4AVX(x0, w0, w1, w2, w3 *float32, n int, acc *[32]float32)
TEXT ·dot1x4AVX(SB), NOSPLIT, $0-56
	MOVQ x0+0(FP), SI
	MOVQ w0+8(FP), R8
	MOVQ w1+16(FP), R9
	MOVQ w2+24(FP), R10
	MOVQ w3+32(FP), R11
	MOVQ n+40(FP), CX
	MOVQ acc+48(FP), DX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX

loop1:
	CMPQ AX, CX
	JGE  done1
	VMOVUPS (SI)(AX*4), Y8
	VFMADD231PS (R8)(AX*4), Y8, Y0
	VFMADD231PS (R9)(AX*4), Y8, Y1
	VFMADD231PS (R10)(AX*4), Y8, Y2
	VFMADD231PS (R11)(AX*4), Y8, Y3
	ADDQ $8, AX
	JMP  loop1

done1:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

DATA q4shifts<>+0(SB)/4, $0
DATA q4shifts<>+4(SB)/4, $4
DATA q4shifts<>+8(SB)/4, $8
DATA q4shifts<>+12(SB)/4, $12
DATA q4shifts<>+16(SB)/4, $16
DATA q4shifts<>+20(SB)/4, $20
DATA q4shifts<>+24(SB)/4, $24
DATA q4shifts<>+28(SB)/4, $28
GLOBL q4shifts<>(SB), RODATA|NOPTR, $32

DATA q4mask<>+0(SB)/4, $15
GLOBL q4mask<>(SB), RODATA|NOPTR, $4

// func q4dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32)
// Lane-wise Σ w·x over one 4-bit weight row, each w widened in registers
// exactly as q4expandAVX writes it (w = fma(q, scale, bias)) and
// accumulated in the order of dot1x4AVX, so decode and prefill agree bit
// for bit. iters = group size / 8.
TEXT ·q4dotAVX(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ scales+16(FP), R8
	MOVQ biases+24(FP), R10
	MOVQ ngroups+32(FP), CX
	MOVQ iters+40(FP), R9
	MOVQ acc+48(FP), DX
	VMOVDQU q4shifts<>(SB), Y15
	VPBROADCASTD q4mask<>(SB), Y14
	VXORPS Y0, Y0, Y0

q4group:
	TESTQ CX, CX
	JE    q4done
	VBROADCASTSS (R8), Y3
	VBROADCASTSS (R10), Y4
	MOVQ R9, BX

q4word:
	VPBROADCASTD (DI), Y2
	VPSRLVD Y15, Y2, Y2
	VPAND Y14, Y2, Y2
	VCVTDQ2PS Y2, Y2
	VMOVAPS Y4, Y5
	VFMADD231PS Y3, Y2, Y5
	VFMADD231PS (SI), Y5, Y0
	ADDQ $4, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q4word
	ADDQ $4, R8
	ADDQ $4, R10
	DECQ CX
	JMP  q4group

q4done:
	VMOVUPS Y0, (DX)
	VZEROUPPER
	RET

// func q8dotAVX(x *float32, words *uint32, scales, biases *float32, ngroups, iters int, acc *[8]float32)
// As q4dotAVX for 8-bit weights (8 bytes per iteration), matching q8expandAVX.
TEXT ·q8dotAVX(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ scales+16(FP), R8
	MOVQ biases+24(FP), R10
	MOVQ ngroups+32(FP), CX
	MOVQ iters+40(FP), R9
	MOVQ acc+48(FP), DX
	VXORPS Y0, Y0, Y0

q8group:
	TESTQ CX, CX
	JE    q8done
	VBROADCASTSS (R8), Y3
	VBROADCASTSS (R10), Y4
	MOVQ R9, BX

q8word:
	VPMOVZXBD (DI), Y2
	VCVTDQ2PS Y2, Y2
	VMOVAPS Y4, Y5
	VFMADD231PS Y3, Y2, Y5
	VFMADD231PS (SI), Y5, Y0
	ADDQ $8, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q8word
	ADDQ $4, R8
	ADDQ $4, R10
	DECQ CX
	JMP  q8group

q8done:
	VMOVUPS Y0, (DX)
	VZEROUPPER
	RET

// func axpyAVX(a float32, x, y *float32, n int)
// y[i] += a·x[i] for n a multiple of 8.
TEXT ·axpyAVX(SB), NOSPLIT, $0-32
	VBROADCASTSS a+0(FP), Y0
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	XORQ AX, AX

axloop:
	CMPQ AX, CX
	JGE  axdone
	VMOVUPS (DI)(AX*4), Y1
	VFMADD231PS (SI)(AX*4), Y0, Y1
	VMOVUPS Y1, (DI)(AX*4)
	ADDQ $8, AX
	JMP  axloop

axdone:
	VZEROUPPER
	RET

// func q4expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32)
// dst = scale·q + bias for every element of ngroups groups of 8·iters.
TEXT ·q4expandAVX(SB), NOSPLIT, $0-48
	MOVQ words+0(FP), DI
	MOVQ scales+8(FP), R8
	MOVQ biases+16(FP), R10
	MOVQ ngroups+24(FP), CX
	MOVQ iters+32(FP), R9
	MOVQ dst+40(FP), SI
	VMOVDQU q4shifts<>(SB), Y15
	VPBROADCASTD q4mask<>(SB), Y14

e4group:
	TESTQ CX, CX
	JE    e4done
	VBROADCASTSS (R8), Y3
	VBROADCASTSS (R10), Y4
	MOVQ R9, BX

e4word:
	VPBROADCASTD (DI), Y2
	VPSRLVD Y15, Y2, Y2
	VPAND Y14, Y2, Y2
	VCVTDQ2PS Y2, Y2
	VMOVAPS Y4, Y5
	VFMADD231PS Y3, Y2, Y5
	VMOVUPS Y5, (SI)
	ADDQ $4, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  e4word
	ADDQ $4, R8
	ADDQ $4, R10
	DECQ CX
	JMP  e4group

e4done:
	VZEROUPPER
	RET

// func q8expandAVX(words *uint32, scales, biases *float32, ngroups, iters int, dst *float32)
TEXT ·q8expandAVX(SB), NOSPLIT, $0-48
	MOVQ words+0(FP), DI
	MOVQ scales+8(FP), R8
	MOVQ biases+16(FP), R10
	MOVQ ngroups+24(FP), CX
	MOVQ iters+32(FP), R9
	MOVQ dst+40(FP), SI

e8group:
	TESTQ CX, CX
	JE    e8done
	VBROADCASTSS (R8), Y3
	VBROADCASTSS (R10), Y4
	MOVQ R9, BX

e8word:
	VPMOVZXBD (DI), Y2
	VCVTDQ2PS Y2, Y2
	VMOVAPS Y4, Y5
	VFMADD231PS Y3, Y2, Y5
	VMOVUPS Y5, (SI)
	ADDQ $8, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  e8word
	ADDQ $4, R8
	ADDQ $4, R10
	DECQ CX
	JMP  e8group

e8done:
	VZEROUPPER
	RET

// func bf16WidenAVX(src *uint16, dst *float32, n int)
// dst[i] = float32 with the bf16 bits src[i] (n a multiple of 8).
TEXT ·bf16WidenAVX(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	XORQ AX, AX

bwloop:
	CMPQ AX, CX
	JGE  bwdone
	VPMOVZXWD (SI)(AX*2), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP  bwloop

bwdone:
	VZEROUPPER
	RET

// func f16WidenAVX(src *uint16, dst *float32, n int)
// IEEE half to float32 with F16C (n a multiple of 8).
TEXT ·f16WidenAVX(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	XORQ AX, AX

fwloop:
	CMPQ AX, CX
	JGE  fwdone
	VCVTPH2PS (SI)(AX*2), Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP  fwloop

fwdone:
	VZEROUPPER
	RET

// func gemm3x4AVX(x *float32, ldx, triples int, w0, w1, w2, w3 *float32, k int, out *float32, ldo int)
// For each of `triples` groups of three x rows (ldx bytes apart), the 3×4
// dot products with w0..w3 over k elements (k a multiple of 8), each
// reduced as ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)) (hsum8's order) and stored
// at out + row·ldo + 4·col; out advances three rows per group.
TEXT ·gemm3x4AVX(SB), NOSPLIT, $0-80
	MOVQ x+0(FP), SI
	MOVQ ldx+8(FP), R8
	MOVQ triples+16(FP), R9
	MOVQ w0+24(FP), R10
	MOVQ w1+32(FP), R11
	MOVQ w2+40(FP), R12
	MOVQ w3+48(FP), R13
	MOVQ k+56(FP), CX
	MOVQ out+64(FP), DI

g3triple:
	TESTQ R9, R9
	JE    g3done
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	LEAQ (SI)(R8*1), BX
	LEAQ (BX)(R8*1), DX
	XORQ AX, AX

g3inner:
	CMPQ AX, CX
	JGE  g3reduce
	VMOVUPS (SI)(AX*4), Y12
	VMOVUPS (BX)(AX*4), Y13
	VMOVUPS (DX)(AX*4), Y14
	VMOVUPS (R10)(AX*4), Y15
	VFMADD231PS Y15, Y12, Y0
	VFMADD231PS Y15, Y13, Y4
	VFMADD231PS Y15, Y14, Y8
	VMOVUPS (R11)(AX*4), Y15
	VFMADD231PS Y15, Y12, Y1
	VFMADD231PS Y15, Y13, Y5
	VFMADD231PS Y15, Y14, Y9
	VMOVUPS (R12)(AX*4), Y15
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y6
	VFMADD231PS Y15, Y14, Y10
	VMOVUPS (R13)(AX*4), Y15
	VFMADD231PS Y15, Y12, Y3
	VFMADD231PS Y15, Y13, Y7
	VFMADD231PS Y15, Y14, Y11
	ADDQ $8, AX
	JMP  g3inner

g3reduce:
	MOVQ ldo+72(FP), BX
	MOVQ DI, DX
	VEXTRACTF128 $1, Y0, X15
	VADDPS X15, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, 0(DX)
	VEXTRACTF128 $1, Y1, X15
	VADDPS X15, X1, X1
	VHADDPS X1, X1, X1
	VHADDPS X1, X1, X1
	VMOVSS X1, 4(DX)
	VEXTRACTF128 $1, Y2, X15
	VADDPS X15, X2, X2
	VHADDPS X2, X2, X2
	VHADDPS X2, X2, X2
	VMOVSS X2, 8(DX)
	VEXTRACTF128 $1, Y3, X15
	VADDPS X15, X3, X3
	VHADDPS X3, X3, X3
	VHADDPS X3, X3, X3
	VMOVSS X3, 12(DX)
	ADDQ BX, DX
	VEXTRACTF128 $1, Y4, X15
	VADDPS X15, X4, X4
	VHADDPS X4, X4, X4
	VHADDPS X4, X4, X4
	VMOVSS X4, 0(DX)
	VEXTRACTF128 $1, Y5, X15
	VADDPS X15, X5, X5
	VHADDPS X5, X5, X5
	VHADDPS X5, X5, X5
	VMOVSS X5, 4(DX)
	VEXTRACTF128 $1, Y6, X15
	VADDPS X15, X6, X6
	VHADDPS X6, X6, X6
	VHADDPS X6, X6, X6
	VMOVSS X6, 8(DX)
	VEXTRACTF128 $1, Y7, X15
	VADDPS X15, X7, X7
	VHADDPS X7, X7, X7
	VHADDPS X7, X7, X7
	VMOVSS X7, 12(DX)
	ADDQ BX, DX
	VEXTRACTF128 $1, Y8, X15
	VADDPS X15, X8, X8
	VHADDPS X8, X8, X8
	VHADDPS X8, X8, X8
	VMOVSS X8, 0(DX)
	VEXTRACTF128 $1, Y9, X15
	VADDPS X15, X9, X9
	VHADDPS X9, X9, X9
	VHADDPS X9, X9, X9
	VMOVSS X9, 4(DX)
	VEXTRACTF128 $1, Y10, X15
	VADDPS X15, X10, X10
	VHADDPS X10, X10, X10
	VHADDPS X10, X10, X10
	VMOVSS X10, 8(DX)
	VEXTRACTF128 $1, Y11, X15
	VADDPS X15, X11, X11
	VHADDPS X11, X11, X11
	VHADDPS X11, X11, X11
	VMOVSS X11, 12(DX)
	ADDQ BX, DX
	MOVQ DX, DI
	LEAQ (SI)(R8*2), SI
	ADDQ R8, SI
	DECQ R9
	JMP  g3triple

g3done:
	VZEROUPPER
	RET

// func q4dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32)
// 4-bit fused decode for four consecutive weight rows (wstride bytes
// apart in words, sstride bytes apart in scales/biases): acc[r*8+l] gets
// lane l of row r. Per row and lane the operations and their order are those
// of the single-row kernel, so results are identical; the four independent
// accumulators hide the FMA latency that bounds the single-row kernel.
TEXT ·q4dot4AVX(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ wstride+16(FP), R8
	MOVQ scales+24(FP), R9
	MOVQ biases+32(FP), R10
	MOVQ sstride+40(FP), R12
	MOVQ ngroups+48(FP), CX
	MOVQ iters+56(FP), AX
	MOVQ acc+64(FP), DX
	LEAQ (R8)(R8*2), R11
	LEAQ (R12)(R12*2), R13
	VMOVDQU q4shifts<>(SB), Y15
	VPBROADCASTD q4mask<>(SB), Y14
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

q4dot4AVXgroup:
	TESTQ CX, CX
	JE    q4dot4AVXdone
	VBROADCASTSS (R9), Y4
	VBROADCASTSS (R9)(R12*1), Y5
	VBROADCASTSS (R9)(R12*2), Y6
	VBROADCASTSS (R9)(R13*1), Y7
	VBROADCASTSS (R10), Y8
	VBROADCASTSS (R10)(R12*1), Y9
	VBROADCASTSS (R10)(R12*2), Y10
	VBROADCASTSS (R10)(R13*1), Y11
	MOVQ AX, BX

q4dot4AVXword:
	VMOVUPS (SI), Y13
	VPBROADCASTD (DI), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y8, Y4, Y12
	VFMADD231PS Y13, Y12, Y0
	VPBROADCASTD (DI)(R8*1), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y9, Y5, Y12
	VFMADD231PS Y13, Y12, Y1
	VPBROADCASTD (DI)(R8*2), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y10, Y6, Y12
	VFMADD231PS Y13, Y12, Y2
	VPBROADCASTD (DI)(R11*1), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y11, Y7, Y12
	VFMADD231PS Y13, Y12, Y3
	ADDQ $4, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q4dot4AVXword
	ADDQ $4, R9
	ADDQ $4, R10
	DECQ CX
	JMP  q4dot4AVXgroup

q4dot4AVXdone:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func q8dot4AVX(x *float32, words *uint32, wstride int, scales, biases *float32, sstride, ngroups, iters int, acc *[32]float32)
// 8-bit fused decode for four consecutive weight rows (wstride bytes
// apart in words, sstride bytes apart in scales/biases): acc[r*8+l] gets
// lane l of row r. Per row and lane the operations and their order are those
// of the single-row kernel, so results are identical; the four independent
// accumulators hide the FMA latency that bounds the single-row kernel.
TEXT ·q8dot4AVX(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ wstride+16(FP), R8
	MOVQ scales+24(FP), R9
	MOVQ biases+32(FP), R10
	MOVQ sstride+40(FP), R12
	MOVQ ngroups+48(FP), CX
	MOVQ iters+56(FP), AX
	MOVQ acc+64(FP), DX
	LEAQ (R8)(R8*2), R11
	LEAQ (R12)(R12*2), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

q8dot4AVXgroup:
	TESTQ CX, CX
	JE    q8dot4AVXdone
	VBROADCASTSS (R9), Y4
	VBROADCASTSS (R9)(R12*1), Y5
	VBROADCASTSS (R9)(R12*2), Y6
	VBROADCASTSS (R9)(R13*1), Y7
	VBROADCASTSS (R10), Y8
	VBROADCASTSS (R10)(R12*1), Y9
	VBROADCASTSS (R10)(R12*2), Y10
	VBROADCASTSS (R10)(R13*1), Y11
	MOVQ AX, BX

q8dot4AVXword:
	VMOVUPS (SI), Y13
	VPMOVZXBD (DI), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y8, Y4, Y12
	VFMADD231PS Y13, Y12, Y0
	VPMOVZXBD (DI)(R8*1), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y9, Y5, Y12
	VFMADD231PS Y13, Y12, Y1
	VPMOVZXBD (DI)(R8*2), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y10, Y6, Y12
	VFMADD231PS Y13, Y12, Y2
	VPMOVZXBD (DI)(R11*1), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y11, Y7, Y12
	VFMADD231PS Y13, Y12, Y3
	ADDQ $8, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q8dot4AVXword
	ADDQ $4, R9
	ADDQ $4, R10
	DECQ CX
	JMP  q8dot4AVXgroup

q8dot4AVXdone:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func q4dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32)
// q4dot4AVX with float16 scales and biases (sstride in bytes), widened
// exactly with VCVTPH2PS: the same products, half the scale traffic.
TEXT ·q4dot4HAVX(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ wstride+16(FP), R8
	MOVQ scales+24(FP), R9
	MOVQ biases+32(FP), R10
	MOVQ sstride+40(FP), R12
	MOVQ ngroups+48(FP), CX
	MOVQ iters+56(FP), AX
	MOVQ acc+64(FP), DX
	LEAQ (R8)(R8*2), R11
	LEAQ (R12)(R12*2), R13
	VMOVDQU q4shifts<>(SB), Y15
	VPBROADCASTD q4mask<>(SB), Y14
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

q4dot4HAVXgroup:
	TESTQ CX, CX
	JE    q4dot4HAVXdone
	VPBROADCASTW (R9), X4
	VCVTPH2PS X4, Y4
	VPBROADCASTW (R9)(R12*1), X5
	VCVTPH2PS X5, Y5
	VPBROADCASTW (R9)(R12*2), X6
	VCVTPH2PS X6, Y6
	VPBROADCASTW (R9)(R13*1), X7
	VCVTPH2PS X7, Y7
	VPBROADCASTW (R10), X8
	VCVTPH2PS X8, Y8
	VPBROADCASTW (R10)(R12*1), X9
	VCVTPH2PS X9, Y9
	VPBROADCASTW (R10)(R12*2), X10
	VCVTPH2PS X10, Y10
	VPBROADCASTW (R10)(R13*1), X11
	VCVTPH2PS X11, Y11
	MOVQ AX, BX

q4dot4HAVXword:
	VMOVUPS (SI), Y13
	VPBROADCASTD (DI), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y8, Y4, Y12
	VFMADD231PS Y13, Y12, Y0
	VPBROADCASTD (DI)(R8*1), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y9, Y5, Y12
	VFMADD231PS Y13, Y12, Y1
	VPBROADCASTD (DI)(R8*2), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y10, Y6, Y12
	VFMADD231PS Y13, Y12, Y2
	VPBROADCASTD (DI)(R11*1), Y12
	VPSRLVD Y15, Y12, Y12
	VPAND Y14, Y12, Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y11, Y7, Y12
	VFMADD231PS Y13, Y12, Y3
	ADDQ $4, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q4dot4HAVXword
	ADDQ $2, R9
	ADDQ $2, R10
	DECQ CX
	JMP  q4dot4HAVXgroup

q4dot4HAVXdone:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func q8dot4HAVX(x *float32, words *uint32, wstride int, scales, biases *uint16, sstride, ngroups, iters int, acc *[32]float32)
// q8dot4AVX with float16 scales and biases (sstride in bytes), widened
// exactly with VCVTPH2PS: the same products, half the scale traffic.
TEXT ·q8dot4HAVX(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), SI
	MOVQ words+8(FP), DI
	MOVQ wstride+16(FP), R8
	MOVQ scales+24(FP), R9
	MOVQ biases+32(FP), R10
	MOVQ sstride+40(FP), R12
	MOVQ ngroups+48(FP), CX
	MOVQ iters+56(FP), AX
	MOVQ acc+64(FP), DX
	LEAQ (R8)(R8*2), R11
	LEAQ (R12)(R12*2), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

q8dot4HAVXgroup:
	TESTQ CX, CX
	JE    q8dot4HAVXdone
	VPBROADCASTW (R9), X4
	VCVTPH2PS X4, Y4
	VPBROADCASTW (R9)(R12*1), X5
	VCVTPH2PS X5, Y5
	VPBROADCASTW (R9)(R12*2), X6
	VCVTPH2PS X6, Y6
	VPBROADCASTW (R9)(R13*1), X7
	VCVTPH2PS X7, Y7
	VPBROADCASTW (R10), X8
	VCVTPH2PS X8, Y8
	VPBROADCASTW (R10)(R12*1), X9
	VCVTPH2PS X9, Y9
	VPBROADCASTW (R10)(R12*2), X10
	VCVTPH2PS X10, Y10
	VPBROADCASTW (R10)(R13*1), X11
	VCVTPH2PS X11, Y11
	MOVQ AX, BX

q8dot4HAVXword:
	VMOVUPS (SI), Y13
	VPMOVZXBD (DI), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y8, Y4, Y12
	VFMADD231PS Y13, Y12, Y0
	VPMOVZXBD (DI)(R8*1), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y9, Y5, Y12
	VFMADD231PS Y13, Y12, Y1
	VPMOVZXBD (DI)(R8*2), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y10, Y6, Y12
	VFMADD231PS Y13, Y12, Y2
	VPMOVZXBD (DI)(R11*1), Y12
	VCVTDQ2PS Y12, Y12
	VFMADD213PS Y11, Y7, Y12
	VFMADD231PS Y13, Y12, Y3
	ADDQ $8, DI
	ADDQ $32, SI
	DECQ BX
	JNZ  q8dot4HAVXword
	ADDQ $2, R9
	ADDQ $2, R10
	DECQ CX
	JMP  q8dot4HAVXgroup

q8dot4HAVXdone:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func wsumAVX(p *float32, n int, v *float32, vstride int, o *float32, chunks int)
// For each of `chunks` groups of 8 lanes of o: o = fma(p[t], v_t, o) for
// t = 0..n-1 in order, v_t at v + t·vstride bytes. Per element exactly the
// sequence of axpyAVX calls it replaces, with o kept in registers (four
// groups per pass over the keys).
TEXT ·wsumAVX(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ v+16(FP), DI
	MOVQ vstride+24(FP), R8
	MOVQ o+32(FP), DX
	MOVQ chunks+40(FP), R9

ws8:
	CMPQ R9, $8
	JLT  ws4
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	VMOVUPS 128(DX), Y5
	VMOVUPS 160(DX), Y6
	VMOVUPS 192(DX), Y7
	VMOVUPS 224(DX), Y8
	MOVQ SI, AX
	MOVQ DI, BX
	MOVQ CX, R10

ws8key:
	TESTQ R10, R10
	JE    ws8store
	VBROADCASTSS (AX), Y4
	VFMADD231PS 0(BX), Y4, Y0
	VFMADD231PS 32(BX), Y4, Y1
	VFMADD231PS 64(BX), Y4, Y2
	VFMADD231PS 96(BX), Y4, Y3
	VFMADD231PS 128(BX), Y4, Y5
	VFMADD231PS 160(BX), Y4, Y6
	VFMADD231PS 192(BX), Y4, Y7
	VFMADD231PS 224(BX), Y4, Y8
	ADDQ $4, AX
	ADDQ R8, BX
	DECQ R10
	JMP  ws8key

ws8store:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VMOVUPS Y5, 128(DX)
	VMOVUPS Y6, 160(DX)
	VMOVUPS Y7, 192(DX)
	VMOVUPS Y8, 224(DX)
	ADDQ $256, DX
	ADDQ $256, DI
	SUBQ $8, R9
	JMP  ws8

ws4:
	CMPQ R9, $4
	JLT  ws1
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	MOVQ SI, AX
	MOVQ DI, BX
	MOVQ CX, R10

ws4key:
	TESTQ R10, R10
	JE    ws4store
	VBROADCASTSS (AX), Y4
	VFMADD231PS 0(BX), Y4, Y0
	VFMADD231PS 32(BX), Y4, Y1
	VFMADD231PS 64(BX), Y4, Y2
	VFMADD231PS 96(BX), Y4, Y3
	ADDQ $4, AX
	ADDQ R8, BX
	DECQ R10
	JMP  ws4key

ws4store:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $4, R9
	JMP  ws4

ws1:
	TESTQ R9, R9
	JE    wsdone
	VMOVUPS 0(DX), Y0
	MOVQ SI, AX
	MOVQ DI, BX
	MOVQ CX, R10

ws1key:
	TESTQ R10, R10
	JE    ws1store
	VBROADCASTSS (AX), Y4
	VFMADD231PS 0(BX), Y4, Y0
	ADDQ $4, AX
	ADDQ R8, BX
	DECQ R10
	JMP  ws1key

ws1store:
	VMOVUPS Y0, 0(DX)
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ R9
	JMP  ws1

wsdone:
	VZEROUPPER
	RET

// func scaleMaxAVX(row *float32, n int, scale float32) (m float32, nan int)
// row[j] *= scale for n (a multiple of 8) elements; m is their maximum and
// nan is non-zero when any product is NaN (the caller then decides).
TEXT ·scaleMaxAVX(SB), NOSPLIT, $0-40
	MOVQ row+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS scale+16(FP), Y0
	VPCMPEQD Y1, Y1, Y1
	VPSLLD $23, Y1, Y1 // 0xff800000 in every lane: -Inf
	VMOVUPS Y1, Y2
	VXORPS Y3, Y3, Y3 // NaN flags
	SHRQ $3, CX

smloop:
	VMULPS (SI), Y0, Y4
	VMOVUPS Y4, (SI)
	VCMPPS $3, Y4, Y4, Y5
	VORPS Y5, Y3, Y3
	VMAXPS Y4, Y1, Y1
	ADDQ $32, SI
	DECQ CX
	JNZ  smloop
	VEXTRACTF128 $1, Y1, X4
	VMAXPS X4, X1, X1
	VPERMILPS $0x4e, X1, X4
	VMAXPS X4, X1, X1
	VPERMILPS $0xb1, X1, X4
	VMAXPS X4, X1, X1
	VMOVSS X1, m+24(FP)
	VMOVMSKPS Y3, AX
	MOVQ AX, nan+32(FP)
	VZEROUPPER
	RET

// expSumAVX: see exp.go. Each constant is broadcast from 4 bytes.
DATA explo<>+0(SB)/4, $0xc2aeac4f
GLOBL explo<>(SB), RODATA|NOPTR, $4
DATA explog2e<>+0(SB)/4, $0x3fb8aa3b
GLOBL explog2e<>(SB), RODATA|NOPTR, $4
DATA expc1<>+0(SB)/4, $0x3f318000
GLOBL expc1<>(SB), RODATA|NOPTR, $4
DATA expc2<>+0(SB)/4, $0xb95e8083
GLOBL expc2<>(SB), RODATA|NOPTR, $4
DATA expp0<>+0(SB)/4, $0x39506967
GLOBL expp0<>(SB), RODATA|NOPTR, $4
DATA expp1<>+0(SB)/4, $0x3ab743ce
GLOBL expp1<>(SB), RODATA|NOPTR, $4
DATA expp2<>+0(SB)/4, $0x3c088908
GLOBL expp2<>(SB), RODATA|NOPTR, $4
DATA expp3<>+0(SB)/4, $0x3d2aa9c1
GLOBL expp3<>(SB), RODATA|NOPTR, $4
DATA expp4<>+0(SB)/4, $0x3e2aaaaa
GLOBL expp4<>(SB), RODATA|NOPTR, $4
DATA expp5<>+0(SB)/4, $0x3f000000
GLOBL expp5<>(SB), RODATA|NOPTR, $4
DATA expone<>+0(SB)/4, $0x3f800000
GLOBL expone<>(SB), RODATA|NOPTR, $4
DATA exp127<>+0(SB)/4, $127
GLOBL exp127<>(SB), RODATA|NOPTR, $4

// func expSumAVX(row *float32, n int, m float32, acc *[8]float32)
TEXT ·expSumAVX(SB), NOSPLIT, $0-32
	MOVQ row+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS m+16(FP), Y15
	MOVQ acc+24(FP), DX
	VMOVUPS (DX), Y14
	VBROADCASTSS explo<>(SB), Y13
	VBROADCASTSS explog2e<>(SB), Y12
	VBROADCASTSS expc1<>(SB), Y11
	VBROADCASTSS expc2<>(SB), Y10
	VBROADCASTSS expp0<>(SB), Y9
	VBROADCASTSS expone<>(SB), Y8
	VPBROADCASTD exp127<>(SB), Y7
expsumloop:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	VCMPPS $3, Y0, Y0, Y6
	VMAXPS Y13, Y0, Y1
	VMULPS Y12, Y1, Y2
	VROUNDPS $0, Y2, Y2
	VMULPS Y11, Y2, Y3
	VSUBPS Y3, Y1, Y1
	VMULPS Y10, Y2, Y3
	VSUBPS Y3, Y1, Y1
	VMOVAPS Y9, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp1<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp2<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp3<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp4<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp5<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VMULPS Y1, Y4, Y4
	VADDPS Y1, Y4, Y4
	VADDPS Y8, Y4, Y4
	VCVTPS2DQ Y2, Y3
	VPADDD Y7, Y3, Y3
	VPSLLD $23, Y3, Y3
	VMULPS Y3, Y4, Y4
	VBLENDVPS Y6, Y0, Y4, Y4
	VMOVUPS Y4, (SI)
	VADDPS Y4, Y14, Y14
	ADDQ $32, SI
	SUBQ $8, CX
	JNZ expsumloop
	VMOVUPS Y14, (DX)
	VZEROUPPER
	RET

DATA expsign<>+0(SB)/4, $0x80000000
GLOBL expsign<>(SB), RODATA|NOPTR, $4

// func swigluAVX(out, gate, up *float32, n int)
TEXT ·swigluAVX(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSS explo<>(SB), Y13
	VBROADCASTSS explog2e<>(SB), Y12
	VBROADCASTSS expc1<>(SB), Y11
	VBROADCASTSS expc2<>(SB), Y10
	VBROADCASTSS expp0<>(SB), Y9
	VBROADCASTSS expone<>(SB), Y8
	VPBROADCASTD exp127<>(SB), Y7
	VBROADCASTSS expsign<>(SB), Y15
swigluloop:
	VMOVUPS (SI), Y14
	VORPS Y15, Y14, Y0
	VCMPPS $3, Y0, Y0, Y6
	VMAXPS Y13, Y0, Y1
	VMULPS Y12, Y1, Y2
	VROUNDPS $0, Y2, Y2
	VMULPS Y11, Y2, Y3
	VSUBPS Y3, Y1, Y1
	VMULPS Y10, Y2, Y3
	VSUBPS Y3, Y1, Y1
	VMOVAPS Y9, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp1<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp2<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp3<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp4<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VBROADCASTSS expp5<>(SB), Y5
	VADDPS Y5, Y4, Y4
	VMULPS Y1, Y4, Y4
	VMULPS Y1, Y4, Y4
	VADDPS Y1, Y4, Y4
	VADDPS Y8, Y4, Y4
	VCVTPS2DQ Y2, Y3
	VPADDD Y7, Y3, Y3
	VPSLLD $23, Y3, Y3
	VMULPS Y3, Y4, Y4
	VBLENDVPS Y6, Y0, Y4, Y4
	VMULPS Y4, Y14, Y5
	VBLENDVPS Y14, Y5, Y14, Y5
	VADDPS Y8, Y4, Y4
	VDIVPS Y4, Y5, Y5
	VMULPS (DX), Y5, Y5
	VMOVUPS Y5, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ swigluloop
	VZEROUPPER
	RET
