package engine

import (
	"fmt"
	"math"
)

// RoPEFrequencies returns the inverse frequencies [dims/2] and the factor
// that cos and sin are multiplied by (1 except for YaRN), exactly as HF
// transformers' ROPE_INIT_FUNCTIONS compute them for r's scaling type.
// Backends share it so that every backend rotates alike.
func RoPEFrequencies(r *RoPE, dims int) (invFreq []float32, attnFactor float32, err error) {
	if dims <= 0 || dims%2 != 0 {
		return nil, 0, fmt.Errorf("rope: %d rotated dims", dims)
	}
	base := r.Base
	if base <= 0 {
		return nil, 0, fmt.Errorf("rope: base %v", base)
	}
	half := dims / 2
	inv := make([]float64, half)
	for j := range half {
		// HF: 1 / base ** (arange(0, dim, 2) / dim), in float32.
		inv[j] = float64(float32(1 / math.Pow(base, float64(2*j)/float64(dims))))
	}
	s := r.Scale
	attn := 1.0
	switch s.Type {
	case "", "default":
	case "linear":
		if s.Factor <= 0 {
			return nil, 0, fmt.Errorf("rope: linear scaling factor %v", s.Factor)
		}
		for j := range inv {
			inv[j] /= s.Factor
		}
	case "llama3":
		if s.Factor <= 0 || s.OriginalMaxPositions <= 0 || s.HighFreqFactor <= s.LowFreqFactor {
			return nil, 0, fmt.Errorf("rope: llama3 scaling %+v", s)
		}
		old := float64(s.OriginalMaxPositions)
		lowWave := old / s.LowFreqFactor
		highWave := old / s.HighFreqFactor
		for j, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
				// high frequency: unchanged
			case wave > lowWave:
				inv[j] = f / s.Factor
			default:
				smooth := (old/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				inv[j] = (1-smooth)*f/s.Factor + smooth*f
			}
		}
	case "yarn":
		if s.Factor <= 0 || s.OriginalMaxPositions <= 0 {
			return nil, 0, fmt.Errorf("rope: yarn scaling %+v", s)
		}
		fast, slow := s.BetaFast, s.BetaSlow
		if fast == 0 {
			fast = 32
		}
		if slow == 0 {
			slow = 1
		}
		mscale := func(scale, m float64) float64 {
			if scale <= 1 {
				return 1
			}
			return 0.1*m*math.Log(scale) + 1
		}
		if s.MScale != 0 && s.MScaleAllDim != 0 {
			attn = mscale(s.Factor, s.MScale) / mscale(s.Factor, s.MScaleAllDim)
		} else {
			attn = mscale(s.Factor, 1)
		}
		d := float64(dims)
		corr := func(rot float64) float64 {
			return d * math.Log(float64(s.OriginalMaxPositions)/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		low, high := corr(fast), corr(slow)
		if !s.NoTruncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low, high = math.Max(low, 0), math.Min(high, d-1)
		if low == high {
			high += 0.001
		}
		for j, f := range inv {
			ramp := math.Min(math.Max((float64(j)-low)/(high-low), 0), 1)
			extra := 1 - ramp // weight of extrapolation (original frequency)
			inv[j] = f/s.Factor*(1-extra) + f*extra
		}
	default:
		return nil, 0, fmt.Errorf("rope: unknown scaling type %q", s.Type)
	}
	invFreq = make([]float32, half)
	for j, f := range inv {
		invFreq[j] = float32(f)
	}
	return invFreq, float32(attn), nil
}
