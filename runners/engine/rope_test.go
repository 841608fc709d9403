package engine

import (
	"math"
	"testing"
)

// TestRoPEFrequencies checks inverse frequencies and the cos/sin factor
// against values printed by a numpy transcription of HF transformers'
// _compute_default/_llama3/_yarn_parameters (transformers 5.24, including
// its rope_scaling "truncate" flag; torch is not installable here), at a few
// indices.
func TestRoPEFrequencies(t *testing.T) {
	idx := []int{0, 5, 10, 20, 30, 40, 50, 63}
	for _, c := range []struct {
		name string
		r    RoPE
		dims int
		attn float64
		want []float64
	}{
		{"llama3", RoPE{Base: 500000, Scale: RoPEScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}, 128, 1,
			[]float64{1.0, 0.3587302267551422, 0.12868738174438477, 0.016560440883040428, 0.0013718936825171113, 3.428102354519069e-05, 4.411534519022098e-06, 3.068925877869333e-07}},
		{"yarn", RoPE{Base: 1e6, Scale: RoPEScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768}}, 128, 1.138629436111989,
			[]float64{1.0, 0.33982083201408386, 0.11547820270061493, 0.01333521492779255, 0.001064361073076725, 4.4456985051510856e-05, 5.133812464919174e-06, 3.102344408034696e-07}},
		{"yarn mscale", RoPE{Base: 10000, Scale: RoPEScaling{Type: "yarn", Factor: 40, OriginalMaxPositions: 4096, MScale: 1, MScaleAllDim: 0.707}}, 64, 1.0857263992561355,
			[]float64{1.0, 0.23713739216327667, 0.05623412877321243, 0.0007905694073997438, 4.445698323252145e-06}},
		// gpt-oss's YaRN (base 150000, factor 32, 4096 original positions,
		// head dim 64): the correction range is [8.09, 17.40], floored and
		// ceiled to [8, 18] by default, kept fractional with "truncate":
		// false (gpt-oss's config; HF honours it): index 10 differs.
		{"yarn gpt-oss truncated", RoPE{Base: 150000, Scale: RoPEScaling{Type: "yarn", Factor: 32, OriginalMaxPositions: 4096}}, 64, 1.3465735902799727,
			[]float64{1.0, 0.15532298386096954, 0.019450968131422997, 1.818833698052913e-05, 4.38797854940276e-07}},
		{"yarn gpt-oss truncate=false", RoPE{Base: 150000, Scale: RoPEScaling{Type: "yarn", Factor: 32, OriginalMaxPositions: 4096, NoTruncate: true}}, 64, 1.3465735902799727,
			[]float64{1.0, 0.15532298386096954, 0.019335001707077026, 1.818833698052913e-05, 4.38797854940276e-07}},
		{"linear", RoPE{Base: 10000, Scale: RoPEScaling{Type: "linear", Factor: 2}}, 64, 1,
			[]float64{0.5, 0.11856869608163834, 0.028117064386606216, 0.0015811389312148094, 8.891397010302171e-05}},
	} {
		inv, attn, err := RoPEFrequencies(&c.r, c.dims)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if math.Abs(float64(attn)-c.attn) > 1e-6 {
			t.Errorf("%s: attention factor %v, want %v", c.name, attn, c.attn)
		}
		for k, want := range c.want {
			if got := float64(inv[idx[k]]); math.Abs(got-want) > 2e-6*want {
				t.Errorf("%s: inv_freq[%d] = %v, want %v", c.name, idx[k], got, want)
			}
		}
	}
	if _, _, err := RoPEFrequencies(&RoPE{Base: 10000, Scale: RoPEScaling{Type: "dynamic"}}, 64); err == nil {
		t.Error("unknown scaling type accepted")
	}
}
