package cpu

import "math"

// A float32 exp for the softmax of attention, vectorized on amd64.
//
// math.Exp (float64, one element at a time) was about a quarter of a
// 2048-token prefill: every query row exponentiates all the keys it sees.
// exp32 is Cephes' expf (range reduction by ln 2 in two parts, a degree-5
// polynomial, the exponent set directly), written with float32 operations
// that each round on their own, no fused multiply-add, so the Go code and
// expSumAVX give the same bits. Relative error about 1e-7 against the exact
// exp, for arguments down to -87.3 (below, exp32 returns exp(-87.3), a
// weight of 1e-38 next to the row's largest, which is 1).

const (
	expLo    = -87.33654
	expLog2e = 1.44269504088896341
	expC1    = 0.693359375
	expC2    = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

// exp32 is e^x for x ≤ 0 (the softmax's s − max); NaN stays NaN.
func exp32(x float32) float32 {
	if x != x {
		return x
	}
	x = max(x, expLo)
	n := float32(math.RoundToEven(float64(float32(x * expLog2e))))
	r := float32(x - float32(n*expC1))
	r = float32(r - float32(n*expC2))
	p := float32(expP0)
	p = float32(float32(p*r) + expP1)
	p = float32(float32(p*r) + expP2)
	p = float32(float32(p*r) + expP3)
	p = float32(float32(p*r) + expP4)
	p = float32(float32(p*r) + expP5)
	y := float32(float32(float32(p*r)*r) + r)
	y = float32(y + 1)
	return y * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// expSum replaces row[j] by exp32(row[j] − m) and returns their sum, added
// lane-wise in eight running sums (element j into sum j mod 8) reduced as
// hsum8 does: the same bits on every path.
func (b *Backend) expSum(row []float32, m float32) float32 {
	var acc [8]float32
	j := 0
	if b.simd && len(row) >= 8 {
		j = len(row) &^ 7
		expSumAVX(&row[0], j, m, &acc)
	}
	for ; j < len(row); j++ {
		p := exp32(row[j] - m)
		row[j] = p
		acc[j%8] += p
	}
	return hsum8(acc[:])
}
