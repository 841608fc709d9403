package testmodel

import (
	"context"
	"math"
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

// CheckOverlapFeatures is CheckSampledOverlap for rows that also ask for
// logprobs (with and without top alternatives), are constrained by a
// mask that depends on the row's last token (SampleSpec.Mask and Accept:
// a grammar's shape) and end after their own number of steps
// (SampleSpec.Steps: the next steps leave them out). Serially, each step
// runs ForwardBatch over the rows still going, masks their logits on the
// host, picks with each row's Sampler and computes sample.Logprobs from
// the raw logits; the overlap must give the same tokens, logprobs within
// tol, the same top ids, leave a finished row out of the next step
// (Caches) with its cache as the serial one, and after Stop every cache
// as the serial one. Row i asks for logprobs when i is even (top 5 when
// i%4 == 0), is masked when i is odd, and ends after steps-2i steps (row
// 0 and the last row: not bounded; a lone row after steps-2, and the
// calls past it must fail).
func CheckOverlapFeatures(t testing.TB, m *engine.Model, ps []sample.Params, steps int, tol float64) {
	t.Helper()
	ctx := context.Background()
	n := len(ps)
	V := m.Info().Vocab
	bound := make([]int, n)
	for i := range bound {
		if i > 0 && i < n-1 {
			bound[i] = max(1, steps-2*i)
		}
		if n == 1 {
			bound[i] = steps - 2 // Next's last two calls find no step to queue, then none in flight
		}
	}
	going := func(i, s int) bool { return bound[i] == 0 || s < bound[i] }
	allowed := func(last, id int32) bool { return (id+last)%3 != 0 }
	mk := func() ([]engine.KVCache, [][]int32) {
		cs := make([]engine.KVCache, n)
		hist := make([][]int32, n)
		for i := range cs {
			p := make([]int32, 5+3*i)
			for j := range p {
				p[j] = int32(1 + (7*j+11*i)%(V-1))
			}
			cs[i] = m.NewCache()
			if _, err := m.Forward(ctx, cs[i], p[:len(p)-1]); err != nil {
				t.Fatal(err)
			}
			hist[i] = p
		}
		return cs, hist
	}
	type lp struct {
		c   float64
		top []sample.TokenLogprob
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
	var wantLP [][]lp
	wantLen := make([]int, n)
	for s := range steps {
		if n == 1 && s >= bound[0] {
			break
		}
		var rows []int
		var cs []engine.KVCache
		var in []int32
		for i := range n {
			if going(i, s) {
				rows, cs, in = append(rows, i), append(cs, serial[i]), append(in, toks[i])
			}
		}
		out, err := m.ForwardBatch(ctx, cs, in)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		var got []int32
		var lps []lp
		for k, i := range rows {
			r := slices.Clone(out[k])
			if i%2 == 1 {
				for id := range r {
					if !allowed(toks[i], int32(id)) {
						r[id] = float32(math.Inf(-1))
					}
				}
			}
			toks[i] = samplers[i].Sample(r, hist[i])
			hist[i] = append(hist[i], toks[i])
			got = append(got, toks[i])
			var l lp
			if i%2 == 0 {
				top := 0
				if i%4 == 0 {
					top = 5
				}
				l.c, l.top = sample.Logprobs(out[k], toks[i], top)
			}
			lps = append(lps, l)
			if !going(i, s+1) {
				wantLen[i] = serial[i].Len()
			}
		}
		want, wantLP = append(want, got), append(wantLP, lps)
	}
	over, ohist := mk()
	defer func() {
		for _, c := range over {
			c.Free()
		}
	}()
	specs := make([]engine.SampleSpec, n)
	start := make([]int32, n)
	last := make([]int32, n)
	for i, p := range ps {
		draws := sample.New(p)
		specs[i] = engine.SampleSpec{Params: p, History: ohist[i], Steps: bound[i], Logprobs: i%2 == 0}
		if i%4 == 0 {
			specs[i].Top = 5
		}
		if p.Temperature > 0 {
			specs[i].Uniform = draws.Uniform
		}
		start[i] = ohist[i][len(ohist[i])-1]
		last[i] = start[i]
		if i%2 == 1 {
			specs[i].Mask = func(dst []float32) error {
				for id := range dst {
					if !allowed(last[i], int32(id)) {
						dst[id] = float32(math.Inf(-1))
					}
				}
				return nil
			}
			specs[i].Accept = func(tok int32) error { last[i] = tok; return nil }
		}
	}
	o, err := m.StartOverlap(ctx, over, start, specs)
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		rows := slices.Clone(o.Caches())
		if n == 1 && s >= bound[0] {
			if len(rows) != 0 {
				t.Fatalf("step %d: a row in flight after its last step", s)
			}
			if _, err := o.Next(ctx); err == nil {
				t.Fatal("Next with no step in flight did not fail")
			}
			continue
		}
		got, err := o.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want[s]) {
			t.Fatalf("step %d: overlapped tokens %v, serial %v", s, got, want[s])
		}
		k := 0
		for i := range n {
			if !going(i, s) {
				if slices.Contains(rows, over[i]) {
					t.Fatalf("step %d: row %d is in flight after its last step", s, i)
				}
				continue
			}
			if rows[k] != over[i] {
				t.Fatalf("step %d: the step's row %d is not row %d's cache", s, k, i)
			}
			if i%2 == 0 {
				c, top := o.Logprob(k)
				w := wantLP[s][k]
				if math.Abs(c-w.c) > tol || len(top) != len(w.top) {
					t.Fatalf("step %d row %d: logprob %v with %d top, serial %v with %d", s, i, c, len(top), w.c, len(w.top))
				}
				for j := range top {
					if top[j].ID != w.top[j].ID || math.Abs(top[j].Logprob-w.top[j].Logprob) > tol {
						t.Fatalf("step %d row %d: top %v, serial %v", s, i, top, w.top)
					}
				}
			}
			if !going(i, s+1) && over[i].Len() != wantLen[i] {
				t.Fatalf("row %d ended after step %d holding %d, serial %d", i, s, over[i].Len(), wantLen[i])
			}
			k++
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
