package testmodel

import (
	"context"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// CheckSampledOverlap decodes steps tokens for one prompt per Params,
// serially with each row's Sampler on the host and overlapped with the
// rows' SampleSpecs, and fails unless they agree (engine's TestSampledOverlapEqualsSerial, and on MLX).
func CheckSampledOverlap(t testing.TB, m *engine.Model, ps []sample.Params, steps int) {
	t.Helper()
	ctx := context.Background()
	n := len(ps)
	mk := func() ([]engine.KVCache, [][]int32) {
		cs := make([]engine.KVCache, n)
		hist := make([][]int32, n)
		for i := range cs {
			p := make([]int32, 5+3*i)
			for j := range p {
				p[j] = int32(1 + (7*j+11*i)%(m.Info().Vocab-1))
			}
			cs[i] = m.NewCache()
			if _, err := m.Forward(ctx, cs[i], p[:len(p)-1]); err != nil {
				t.Fatal(err)
			}
			hist[i] = p
		}
		return cs, hist
	}
	serial, hist := mk()
	defer func() {
		for _, c := range serial {
			c.Free()
		}
	}()
	samplers := make([]*sample.Sampler, n)
	for i, p := range ps {
		samplers[i] = sample.New(p)
	}
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = hist[i][len(hist[i])-1]
	}
	var want [][]int32
	for range steps {
		rows, err := m.ForwardBatch(ctx, serial, toks)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			toks[i] = samplers[i].Sample(r, hist[i])
			hist[i] = append(hist[i], toks[i])
		}
		want = append(want, slices.Clone(toks))
	}
	over, ohist := mk()
	defer func() {
		for _, c := range over {
			c.Free()
		}
	}()
	specs := make([]engine.SampleSpec, n)
	start := make([]int32, n)
	for i, p := range ps {
		draws := sample.New(p)
		specs[i] = engine.SampleSpec{Params: p, History: ohist[i]}
		if p.Temperature > 0 {
			specs[i].Uniform = draws.Uniform
		}
		start[i] = ohist[i][len(ohist[i])-1]
	}
	o, err := m.StartOverlap(ctx, over, start, specs)
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		got, err := o.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[s]) {
			t.Fatalf("step %d: overlapped tokens %v, serial %v", s, got, want[s])
		}
	}
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range over {
		if over[i].Len() != serial[i].Len() {
			t.Fatalf("after Stop cache %d holds %d, serial %d", i, over[i].Len(), serial[i].Len())
		}
	}
}
