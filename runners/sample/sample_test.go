package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func logitsOf(probs ...float64) []float32 {
	l := make([]float32, len(probs))
	for i, p := range probs {
		l[i] = float32(math.Log(p))
	}
	return l
}

func TestGreedyAndPenalty(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name    string
		p       Params
		logits  []float32
		history []int32
		want    int32
	}{
		{"argmax", Params{}, []float32{0.1, 3, -1, 2.9}, nil, 1},
		{"ties → lowest id", Params{}, []float32{1, 5, 5, 5}, nil, 1},
		{"NaN never wins", Params{}, []float32{nan, -1, nan, -2}, nil, 1},
		{"all -Inf", Params{}, []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, nil, 0},
		// HF: positive logits divided by the penalty, negative multiplied
		{"penalty divides positive", Params{RepetitionPenalty: 2}, []float32{2, 1.5}, []int32{0}, 1},
		{"penalty multiplies negative", Params{RepetitionPenalty: 2}, []float32{-0.5, -0.8}, []int32{0}, 1},
		{"penalty once per id", Params{RepetitionPenalty: 2}, []float32{4, 1.5}, []int32{0, 0, 0}, 0},
		{"penalty < 1 favours history", Params{RepetitionPenalty: 0.5}, []float32{1, 1.5}, []int32{0}, 0},
		{"penalty 1 is off", Params{RepetitionPenalty: 1}, []float32{2, 1.5}, []int32{0}, 0},
		{"out-of-range history ignored", Params{RepetitionPenalty: 2}, []float32{2, 1.5}, []int32{-1, 7}, 0},
		{"top-k 1 is greedy at any temperature", Params{Temperature: 5, TopK: 1, Seed: 3}, []float32{0.1, 3, -1, 2.9}, nil, 1},
		{"min-p 1 keeps only the best", Params{Temperature: 1, MinP: 1, Seed: 4}, []float32{0.1, 3, -1, 2.9}, nil, 1},
	}
	for _, c := range cases {
		s := New(c.p)
		for range 20 {
			if got := s.Sample(c.logits, c.history); got != c.want {
				t.Fatalf("%s: got %d, want %d", c.name, got, c.want)
			}
		}
	}
}

func TestPenaltyDoesNotModifyInput(t *testing.T) {
	l := []float32{2, 1.5}
	New(Params{RepetitionPenalty: 2}).Sample(l, []int32{0})
	if l[0] != 2 {
		t.Errorf("caller's logits changed: %v", l)
	}
}

// allowedSet draws n tokens and returns how often each id came out.
func counts(s *Sampler, logits []float32, n int) map[int32]int {
	c := map[int32]int{}
	for range n {
		c[s.Sample(logits, nil)]++
	}
	return c
}

func TestFiltersTable(t *testing.T) {
	probs := logitsOf(0.5, 0.3, 0.15, 0.05)
	cases := []struct {
		name string
		p    Params
		l    []float32
		want []int32 // the ids that may come out (all of them must)
	}{
		{"top-p 0.7", Params{Temperature: 1, TopP: 0.7}, probs, []int32{0, 1}},
		{"top-p 0.85", Params{Temperature: 1, TopP: 0.85}, probs, []int32{0, 1, 2}},
		{"top-p 0.4 keeps one", Params{Temperature: 1, TopP: 0.4}, probs, []int32{0}},
		{"top-p 1 is off", Params{Temperature: 1, TopP: 1}, probs, []int32{0, 1, 2, 3}},
		{"min-p 0.25", Params{Temperature: 1, MinP: 0.25}, probs, []int32{0, 1, 2}},
		{"min-p 0.7", Params{Temperature: 1, MinP: 0.7}, probs, []int32{0}},
		{"top-k 2", Params{Temperature: 1, TopK: 2}, probs, []int32{0, 1}},
		{"top-k keeps ties with the k-th", Params{Temperature: 1, TopK: 2}, []float32{3, 2, 2, 1}, []int32{0, 1, 2}},
		{"top-k then top-p renormalizes", Params{Temperature: 1, TopK: 3, TopP: 0.55}, probs, []int32{0, 1}},
		{"-Inf never drawn", Params{Temperature: 1}, []float32{0, float32(math.Inf(-1)), 0}, []int32{0, 2}},
	}
	for _, c := range cases {
		got := counts(New(Params{Temperature: c.p.Temperature, TopP: c.p.TopP, TopK: c.p.TopK, MinP: c.p.MinP, Seed: 11}), c.l, 4000)
		var ids []int32
		for id := range got {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, c.want) {
			t.Errorf("%s: drew %v, want exactly %v", c.name, got, c.want)
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 500)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	p := Params{Temperature: 0.9, TopP: 0.95, TopK: 50, MinP: 0.01, RepetitionPenalty: 1.1, Seed: 42}
	run := func(p Params) []int32 {
		s := New(p)
		var hist []int32
		for range 300 {
			hist = append(hist, s.Sample(logits, hist))
		}
		return hist
	}
	a, b := run(p), run(p)
	if !slices.Equal(a, b) {
		t.Fatal("same seed gave different tokens")
	}
	p.Seed = 43
	if slices.Equal(a, run(p)) {
		t.Fatal("different seeds gave identical 300-token streams")
	}
}

// TestNeverEmitsExcluded checks, against an independent full-sort reference,
// that top-k / top-p / min-p never emit an excluded id and that the kept
// ids come out at their renormalized probabilities.
func TestNeverEmitsExcluded(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const vocab = 1000
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	type ref struct {
		p      Params
		allow  map[int32]float64
		params string
	}
	reference := func(p Params) map[int32]float64 {
		ids := make([]int32, vocab)
		for i := range ids {
			ids[i] = int32(i)
		}
		slices.SortFunc(ids, func(a, b int32) int {
			if logits[a] != logits[b] {
				if logits[a] > logits[b] {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
		if p.TopK > 0 {
			ids = ids[:p.TopK] // random normals: no ties
		}
		pr := make([]float64, len(ids))
		sum := 0.0
		for i, id := range ids {
			pr[i] = math.Exp(float64(logits[id]-logits[ids[0]]) / p.Temperature)
			sum += pr[i]
		}
		for i := range pr {
			pr[i] /= sum
		}
		n := len(ids)
		if p.TopP > 0 {
			cum := 0.0
			for i := range ids {
				if cum >= p.TopP {
					n = i
					break
				}
				cum += pr[i]
			}
		}
		if p.MinP > 0 {
			for i := 1; i < n; i++ {
				if pr[i] < p.MinP*pr[0] {
					n = i
					break
				}
			}
		}
		out := map[int32]float64{}
		total := 0.0
		for i := range n {
			total += pr[i]
		}
		for i := range n {
			out[ids[i]] = pr[i] / total
		}
		return out
	}
	for _, p := range []Params{
		{Temperature: 1, TopK: 10, Seed: 1},
		{Temperature: 0.7, TopP: 0.9, Seed: 2},
		{Temperature: 1.3, TopK: 40, TopP: 0.8, Seed: 3},
		{Temperature: 1, MinP: 0.05, Seed: 4},
	} {
		allow := reference(p)
		s := New(p)
		const draws = 10000
		got := map[int32]int{}
		for range draws {
			id := s.Sample(logits, nil)
			if _, ok := allow[id]; !ok {
				t.Fatalf("%+v: emitted excluded id %d", p, id)
			}
			got[id]++
		}
		for id, q := range allow {
			// 6 standard deviations of a binomial: a wrong distribution fails,
			// chance essentially never does
			want, sd := q*draws, math.Sqrt(q*(1-q)*draws)
			if math.Abs(float64(got[id])-want) > 6*sd+1 {
				t.Errorf("%+v: id %d drawn %d times, want %.0f ± %.0f", p, id, got[id], want, 6*sd)
			}
		}
	}
}

func TestKthLargest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 1 + rng.IntN(60)
		c := make([]cand, n)
		vals := make([]float64, n)
		for i := range c {
			v := float64(rng.IntN(10)) // many ties
			c[i] = cand{id: int32(i), l: v}
			vals[i] = v
		}
		slices.Sort(vals)
		slices.Reverse(vals)
		k := 1 + rng.IntN(n)
		if got := kthLargest(c, k); got != vals[k-1] {
			t.Fatalf("trial %d: kthLargest(k=%d) = %v, want %v (%v)", trial, k, got, vals[k-1], vals)
		}
	}
}

func TestStopMatcher(t *testing.T) {
	type step struct {
		in      string
		emit    string
		stopped bool
	}
	cases := []struct {
		name  string
		stops []string
		steps []step
		flush string
	}{
		{"across tokens", []string{"</s>", "\n\nUser:"}, []step{
			{"Hello", "Hello", false}, {" wor", " wor", false}, {"ld<", "ld", false},
			{"/s", "", false}, {">more", "", true}, {"again", "", true}}, ""},
		{"false start released", []string{"</s>"}, []step{{"a<", "a", false}, {"b", "<b", false}}, ""},
		{"held tail flushed at end", []string{"</s>"}, []step{{"x</", "x", false}}, "</"},
		{"earliest stop wins", []string{"ab", "b"}, []step{{"xab", "x", true}}, ""},
		{"stop inside one token", []string{"STOP"}, []step{{"abcSTOPdef", "abc", true}}, ""},
		{"multi-byte stop", []string{"日本"}, []step{{"x日", "x", false}, {"本y", "", true}}, ""},
		{"newline stop", []string{"\n\n"}, []step{{"a\n", "a", false}, {"b\n", "\nb", false}, {"\nc", "", true}}, ""},
		{"no stops passes through", nil, []step{{"a</s>", "a</s>", false}}, ""},
		{"empty stop ignored", []string{""}, []step{{"abc", "abc", false}}, ""},
		{"longest possible prefix held", []string{"aab"}, []step{{"xaa", "x", false}, {"a", "a", false}, {"b", "", true}}, ""},
	}
	for _, c := range cases {
		m := NewStopMatcher(c.stops)
		for i, s := range c.steps {
			emit, stopped := m.Push(s.in)
			if emit != s.emit || stopped != s.stopped {
				t.Errorf("%s step %d Push(%q) = %q, %v; want %q, %v", c.name, i, s.in, emit, stopped, s.emit, s.stopped)
			}
		}
		if got := m.Flush(); got != c.flush {
			t.Errorf("%s: Flush = %q, want %q", c.name, got, c.flush)
		}
	}
}

// TestStopMatcherRandomSplits: however the text is cut into pieces, the
// emitted text is the text up to the first stop sequence.
func TestStopMatcherRandomSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	alphabet := []string{"a", "b", "<", "/", "s", ">", "\n", "é", "日"}
	stops := []string{"</s>", "\n\n", "bab", "日é"}
	for trial := range 2000 {
		var sb strings.Builder
		for range rng.IntN(30) {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		text := sb.String()
		want, wantStop := text, false
		first := -1
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
				first = i
			}
		}
		if first >= 0 {
			want, wantStop = text[:first], true
		}
		m := NewStopMatcher(stops)
		var got strings.Builder
		stopped := false
		for rest := text; rest != ""; {
			n := 1 + rng.IntN(len(rest))
			e, st := m.Push(rest[:n])
			got.WriteString(e)
			stopped = stopped || st
			rest = rest[n:]
		}
		got.WriteString(m.Flush())
		if got.String() != want || stopped != wantStop {
			t.Fatalf("trial %d text %q: got %q stopped=%v, want %q stopped=%v", trial, text, got.String(), stopped, want, wantStop)
		}
	}
}

func BenchmarkSampleTopP(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, 49152)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	hist := make([]int32, 2048)
	for i := range hist {
		hist[i] = int32(rng.IntN(len(logits)))
	}
	for _, p := range []Params{
		{Temperature: 0.7, TopP: 0.9, RepetitionPenalty: 1.1},
		{Temperature: 0.7, TopK: 40, TopP: 0.9},
		{},
	} {
		name := "greedy"
		if p.Temperature > 0 {
			name = "topp"
			if p.TopK > 0 {
				name = "topk+topp"
			}
		}
		b.Run(name, func(b *testing.B) {
			s := New(p)
			b.SetBytes(int64(4 * len(logits)))
			b.ReportAllocs()
			for b.Loop() {
				s.Sample(logits, hist)
			}
		})
	}
}

// TestVerifyKeepsTheTargetDistribution: speculative sampling's rule gives
// tokens distributed as the target p (temperature, top-k and a logit bias
// applied) whatever the draft's q, including a q that puts mass where p
// has none and one equal to p (every draft kept); each frequency within
// 5 standard deviations of p over 200,000 draws.
func TestVerifyKeepsTheTargetDistribution(t *testing.T) {
	logits := []float32{2, 1, 0.5, 0, -1, 3}
	params := Params{Temperature: 0.8, TopK: 5, LogitBias: map[int32]float32{4: 1.5}, Seed: 3}
	target := New(params)
	l := target.Adjust(logits, nil)
	c := target.candidates(l)
	p := make([]float64, len(logits))
	total := 0.0
	for _, x := range c {
		total += x.l
	}
	for _, x := range c {
		p[x.id] = x.l / total
	}
	if p[3] != 0 {
		t.Fatalf("top-k kept token 3: %v", p)
	}
	same := make([]float32, len(p))
	for i := range p {
		same[i] = float32(p[i])
	}
	for _, q := range [][]float32{
		{0.1, 0.1, 0.1, 0.4, 0.2, 0.1}, // mass on 3, which p never draws
		{0.9, 0.02, 0.02, 0.02, 0.02, 0.02},
		same,
	} {
		const n = 200000
		v := New(Params{Temperature: 0.8, TopK: 5, LogitBias: params.LogitBias, Seed: 9})
		draft := rand.New(rand.NewPCG(1, 2))
		got := make([]int, len(p))
		kept := 0
		for range n {
			u, d := draft.Float64(), int32(0)
			for i, x := range q {
				if u -= float64(x); u < 0 {
					d = int32(i)
					break
				}
			}
			tok, ok := v.Verify(logits, nil, d, q)
			if ok != (tok == d) {
				t.Fatalf("kept %v for token %d, draft %d", ok, tok, d)
			}
			if ok {
				kept++
			}
			got[tok]++
		}
		for i := range p {
			sd := math.Sqrt(n * p[i] * (1 - p[i]))
			if d := math.Abs(float64(got[i]) - n*p[i]); d > 5*sd+1e-9 {
				t.Errorf("q %v: token %d drawn %d times, want %.0f ± %.0f", q, i, got[i], n*p[i], 5*sd)
			}
		}
		want := 0.0 // the kept share: Σ min(p, q)
		for i := range p {
			want += math.Min(p[i], float64(q[i]))
		}
		if share := float64(kept) / n; math.Abs(share-want) > 0.01 {
			t.Errorf("q %v: kept %.3f of drafts, want Σ min(p, q) = %.3f", q, share, want)
		}
	}
}
