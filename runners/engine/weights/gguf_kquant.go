package weights

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The GGUF types converted group by group: Q5_0 and Q5_1 (blocks of 32),
// and the K-quants Q4_K, Q5_K and Q6_K (super-blocks of 256 in groups of 32
// or 16). Each becomes MLX's affine form with group size 32, w = scale*q +
// bias, at 4 bits (Q4_K) or 8 bits (the others):
//
//	Q5_0: w = d*(q-16)             → 8-bit q, scale d, bias -16d      (exact)
//	Q5_1: w = d*q + m              → 8-bit q, scale d, bias m         (exact)
//	Q4_K: w = d*sc*q - dmin*m      → 4-bit q, scale d*sc, bias -dmin*m
//	Q5_K: w = d*sc*q - dmin*m      → 8-bit q, scale d*sc, bias -dmin*m
//	Q6_K: w = d*sc*(q-32), sc per 16 elements → requantized to 8 bits
//
// For Q4_K and Q5_K the only loss is rounding d*sc and dmin*m to float16
// (a relative 2^-11, far below the 4/5-bit step). Q6_K's sub-blocks of 16
// have their own scales, which no 32-element group of MLX can share, so its
// values are requantized to 8 bits over each group's range: the added
// error is at most half an 8-bit step, about an eighth of a 6-bit step.
// The packing follows ggml's dequantize_row_* in ggml-quants.c.

// affineGroup is one group of 32 quantized values with its f16 scale and
// bias.
type affineGroup struct {
	q           [32]uint8
	scale, bias uint16
}

// groupwise describes a type converted through affineGroups.
type groupwise struct {
	blockElems, blockBytes, bits int
	decode                       func(blk []byte, out []affineGroup)
}

var groupwiseTypes = map[GGMLType]groupwise{
	TypeQ5_0: {32, 22, 8, decodeQ5_0},
	TypeQ5_1: {32, 24, 8, decodeQ5_1},
	TypeQ4_K: {256, 144, 4, decodeQ4K},
	TypeQ5_K: {256, 176, 8, decodeQ5K},
	TypeQ6_K: {256, 210, 8, decodeQ6K},
}

// groupwiseToMLX converts rows×cols elements of a groupwise type (see
// above) to MLX's packed words and F16 scales and biases.
func groupwiseToMLX(gw groupwise, raw []byte, rows, cols int) (w, scales, biases []byte, err error) {
	if cols%gw.blockElems != 0 {
		return nil, nil, nil, fmt.Errorf("%d columns not a multiple of the block size %d", cols, gw.blockElems)
	}
	blocks := rows * cols / gw.blockElems
	if len(raw) != blocks*gw.blockBytes {
		return nil, nil, nil, fmt.Errorf("%d bytes for %d blocks of %d bytes", len(raw), blocks, gw.blockBytes)
	}
	groups := rows * cols / 32
	wordsPerGroup := gw.bits // 32 values of `bits` bits
	w = make([]byte, groups*wordsPerGroup*4)
	scales = make([]byte, groups*2)
	biases = make([]byte, groups*2)
	perBlock := gw.blockElems / 32
	gs := make([]affineGroup, perBlock)
	le := binary.LittleEndian
	for b := range blocks {
		gw.decode(raw[b*gw.blockBytes:(b+1)*gw.blockBytes], gs)
		for i := range gs {
			g := b*perBlock + i
			out := w[g*wordsPerGroup*4 : (g+1)*wordsPerGroup*4]
			if gw.bits == 4 {
				for k := range 4 {
					var word uint32
					for j := range 8 {
						word |= uint32(gs[i].q[8*k+j]&0xf) << (4 * j)
					}
					le.PutUint32(out[4*k:], word)
				}
			} else {
				copy(out, gs[i].q[:])
			}
			le.PutUint16(scales[2*g:], gs[i].scale)
			le.PutUint16(biases[2*g:], gs[i].bias)
		}
	}
	return w, scales, biases, nil
}

func decodeQ5_0(blk []byte, out []affineGroup) {
	d := binary.LittleEndian.Uint16(blk)
	unpack5(&out[0], binary.LittleEndian.Uint32(blk[2:]), blk[6:22])
	out[0].scale, out[0].bias = d, F32ToF16(F16ToF32(d)*-16)
}

func decodeQ5_1(blk []byte, out []affineGroup) {
	le := binary.LittleEndian
	unpack5(&out[0], le.Uint32(blk[4:]), blk[8:24])
	out[0].scale, out[0].bias = le.Uint16(blk), le.Uint16(blk[2:])
}

// unpack5 sets the 32 5-bit values of a Q5_0/Q5_1 block: element j's low
// nibble is qs[j]'s (j < 16) or qs[j-16]'s high one, its fifth bit is bit j
// of qh.
func unpack5(g *affineGroup, qh uint32, qs []byte) {
	for j := range 16 {
		g.q[j] = qs[j]&0xf | uint8(qh>>j&1)<<4
		g.q[j+16] = qs[j]>>4 | uint8(qh>>(j+16)&1)<<4
	}
}

// scaleMinK4 unpacks sub-block j's 6-bit scale and min from the 12 packed
// bytes of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | q[j-4]>>6<<4, q[j+4]>>4 | q[j]>>6<<4
}

// kGroup sets a Q4_K/Q5_K group's scale d*sc and bias -dmin*m, computed in
// float32 as ggml does, rounded to f16.
func kGroup(g *affineGroup, d, dmin float32, sc, m uint8) {
	g.scale = F32ToF16(d * float32(sc))
	g.bias = F32ToF16(-(dmin * float32(m)))
}

func decodeQ4K(blk []byte, out []affineGroup) {
	le := binary.LittleEndian
	d, dmin := F16ToF32(le.Uint16(blk)), F16ToF32(le.Uint16(blk[2:]))
	sc := blk[4:16]
	qs := blk[16:144]
	for k := range 4 { // 64 elements: low nibbles, then high nibbles
		q := qs[32*k : 32*k+32]
		lo, hi := &out[2*k], &out[2*k+1]
		for l := range 32 {
			lo.q[l], hi.q[l] = q[l]&0xf, q[l]>>4
		}
		s, m := scaleMinK4(2*k, sc)
		kGroup(lo, d, dmin, s, m)
		s, m = scaleMinK4(2*k+1, sc)
		kGroup(hi, d, dmin, s, m)
	}
}

func decodeQ5K(blk []byte, out []affineGroup) {
	le := binary.LittleEndian
	d, dmin := F16ToF32(le.Uint16(blk)), F16ToF32(le.Uint16(blk[2:]))
	sc := blk[4:16]
	qh := blk[16:48]
	qs := blk[48:176]
	for k := range 4 {
		q := qs[32*k : 32*k+32]
		lo, hi := &out[2*k], &out[2*k+1]
		for l := range 32 {
			lo.q[l] = q[l]&0xf | (qh[l]>>(2*k)&1)<<4
			hi.q[l] = q[l]>>4 | (qh[l]>>(2*k+1)&1)<<4
		}
		s, m := scaleMinK4(2*k, sc)
		kGroup(lo, d, dmin, s, m)
		s, m = scaleMinK4(2*k+1, sc)
		kGroup(hi, d, dmin, s, m)
	}
}

func decodeQ6K(blk []byte, out []affineGroup) {
	ql, qh, sc := blk[0:128], blk[128:192], blk[192:208]
	d := F16ToF32(binary.LittleEndian.Uint16(blk[208:]))
	var v [256]float32
	for n := range 2 { // two halves of 128
		l8, h8, s8 := ql[64*n:], qh[32*n:], sc[8*n:]
		y := v[128*n:]
		for l := range 32 {
			is := l / 16
			q1 := int8(l8[l]&0xf|(h8[l]&3)<<4) - 32
			q2 := int8(l8[l+32]&0xf|(h8[l]>>2&3)<<4) - 32
			q3 := int8(l8[l]>>4|(h8[l]>>4&3)<<4) - 32
			q4 := int8(l8[l+32]>>4|(h8[l]>>6&3)<<4) - 32
			y[l] = d * float32(int8(s8[is])) * float32(q1)
			y[l+32] = d * float32(int8(s8[is+2])) * float32(q2)
			y[l+64] = d * float32(int8(s8[is+4])) * float32(q3)
			y[l+96] = d * float32(int8(s8[is+6])) * float32(q4)
		}
	}
	for i := range out {
		requant8(&out[i], v[32*i:32*i+32])
	}
}

// requant8 quantizes 32 values to 8 bits over their range: scale
// (max-min)/255 and bias min, both rounded to f16 first so that q is chosen
// against the values MLX will use.
func requant8(g *affineGroup, v []float32) {
	lo, hi := v[0], v[0]
	for _, x := range v[1:] {
		lo, hi = min(lo, x), max(hi, x)
	}
	g.bias = F32ToF16(lo)
	g.scale = F32ToF16((hi - lo) / 255)
	b, s := F16ToF32(g.bias), F16ToF32(g.scale)
	for i, x := range v {
		q := 0.0
		if s > 0 {
			q = math.Round(float64((x - b) / s))
		}
		g.q[i] = uint8(min(max(q, 0), 255))
	}
}
