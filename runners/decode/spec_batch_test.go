package decode

import (
	"bufio"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue is the value of the sample named exactly name (with its
// labels, if any) in the server's /metrics exposition.
func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// TestSpeculativeBatchSharesForwards: speculation lives in the batcher.
// On every architecture family of the tiny models, five requests decoded
// together (four speculating — greedy with logprobs, a grammar, a seeded
// temperature-1 one, a forced tool call — and one that turns speculation
// off, with penalties)
// each give the answer they give alone, on the speculating runner and on
// a runner without speculation; and the batch verified drafts in the same
// forward as other members' steps (exo_speculative_shared_steps_total
// counts such steps; exo_decode_batch_sequences_max shows all four
// stepped together). The first batch waits for all five (batchQuorum) and
// every batch for all its joined members (a long batchGather), so that
// they share steps whatever the machine's load: no timing is asserted.
// With a draft model (the llama, sliding gemma3 and hybrid qwen3_next
// families) too; how many generations' draft steps batched together is
// logged.
func TestSpeculativeBatchSharesForwards(t *testing.T) {
	cases := []map[string]any{
		specBody("greedy", nil),
		specBody("grammar", nil),
		specBody("seeded", nil),
		specBody("tool call", nil),
		specBody("penalties", map[string]any{"x_exo_speculative": false}),
	}
	drafts := map[string]bool{"llama": true, "gemma3": true, "qwen3_next": true}
	for _, fam := range specFamilies() {
		t.Run(fam.name, func(t *testing.T) {
			dir := fam.dir(t)
			grammar := func(text Text, o *Options) {
				g := &Grammars{Text: text}
				o.NewConstraint, o.AcceptTools = g.NewConstraint, true
			}
			plain := serveTinyDir(t, dir, grammar)
			want := make([]string, len(cases))
			for i, c := range cases {
				want[i] = answerOf(t, plain.url, c)
			}
			modes := []string{SpecPromptLookup}
			if drafts[fam.name] {
				modes = append(modes, SpecDraft)
			}
			for _, mode := range modes {
				s := serveTinyDir(t, dir, func(text Text, o *Options) {
					grammar(text, o)
					o.Speculative, o.SpecTokens, o.specForce = mode, 4, true
					o.MaxBatch, o.batchGather, o.batchQuorum = len(cases), time.Minute, len(cases)
					if mode == SpecDraft {
						o.Draft = loadDraft(t, fam.draft(t), o.Model, text)
					}
				})
				got := answerAll(t, s.url, cases)
				for i := range cases {
					if got[i] != want[i] {
						t.Fatalf("%s, case %d: batched speculative answer\n%s\nplain\n%s", mode, i, got[i], want[i])
					}
				}
				if n := metricValue(t, s.url, "exo_decode_batch_sequences_max"); n != float64(len(cases)) {
					t.Fatalf("%s: at most %v sequences decoded together, want %d", mode, n, len(cases))
				}
				shared := metricValue(t, s.url, "exo_speculative_shared_steps_total")
				steps := metricValue(t, s.url, "exo_speculative_batch_positions_count")
				accepted := metricValue(t, s.url, `exo_speculative_tokens_total{outcome="accepted"}`)
				if shared == 0 || accepted == 0 {
					t.Fatalf("%s: %v steps verified drafts beside another sequence's step (%v verifying steps), %v drafted tokens kept: "+
						"the requests did not share verifying forwards", mode, shared, steps, accepted)
				}
				// Alone on the same runner: the same answers again.
				for i, c := range cases {
					if a := answerOf(t, s.url, c); a != want[i] {
						t.Fatalf("%s, case %d alone: speculative answer\n%s\nplain\n%s", mode, i, a, want[i])
					}
				}
				t.Logf("%s: %v of %v verifying steps shared; %v drafted tokens kept; draft steps batched up to %d",
					mode, shared, steps, accepted, s.srv.draftMost.Load())
			}
		})
	}
}

// TestBatchCost: the batch's step times: an extra position's cost comes
// from consecutive steps of different sizes, so a load that triples while
// they run, and a spike, leave it where it is; it is the cost around the
// size asked about, not far from it; a size's time is the median of its
// steps; steps an idle moment apart are not paired; a plain step is asked
// for (plainDue) while the batch's size has none and every batchRemeasure
// steps; the batch's acceptance starts at a half and follows its members'.
func TestBatchCost(t *testing.T) {
	var c batchCost
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	near := func(what string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got-want) > tol*math.Abs(want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	if _, _, ok := c.line(4, 8); ok || c.plainDue() {
		t.Fatal("a fresh measure claims a time or asks for a plain step")
	}
	c.observe(stepStat{took: ms(60), seqs: 4, positions: 12}) // no plain step of 4 yet
	if !c.plainDue() {
		t.Fatal("without a plain step of the size: want a plain step asked for")
	}
	// Nothing paired: costPrior of a position's average.
	t0, slope, _ := c.line(13, 0)
	near("unpaired: T(13)", t0, 0.060/(1-costPrior/13), 1e-9)
	near("unpaired: slope", slope, costPrior/13*t0, 1e-9)

	// A step of P positions takes load·(10 + 5P) ms. First 4 positions
	// for a while, then the load triples and 6 for a while (their
	// medians, 30 and 120 ms, would read 45 ms a position, not 5 times
	// the load), then the two alternating while the load triples again,
	// with a spike.
	f := func(P int) float64 { return 10 + 5*float64(P) }
	var d batchCost
	for i := range 10 {
		d.observe(stepStat{took: ms(f(4) * float64(1+2*(i/9))), seqs: 4, positions: 4})
	}
	for range 10 {
		d.observe(stepStat{took: ms(3 * f(6)), seqs: 4, positions: 6})
	}
	t0, slope, _ = d.line(4, 2)
	near("slope at 4, sizes measured at different loads", slope/t0, 5/f(4), 0.05)
	for i := range 40 {
		P := 4 + 2*(i%2)
		load := 3 + 6*float64(i)/40
		if i == 17 {
			load *= 10
		}
		d.observe(stepStat{took: ms(load * f(P)), seqs: 4, positions: P})
	}
	t0, slope, _ = d.line(4, 2)
	near("slope at 4 under a tripling load", slope/t0, 5/f(4), 0.1)
	// Far sizes with another cost (8 ms a position) do not move it.
	g := func(P int) float64 { return 10 + 8*float64(P) }
	for i := range 20 {
		d.observe(stepStat{took: ms(g(30 + 2*(i%2))), seqs: 4, positions: 30 + 2*(i%2)})
	}
	t0b, slopeb, _ := d.line(4, 2)
	near("slope at 4 with far sizes measured", slopeb/t0b, 5/f(4), 0.1)
	_, slope30, _ := d.line(30, 2)
	near("slope at 30", slope30, 0.008, 0.01)
	// A size's time: its median.
	var m batchCost
	for _, x := range []float64{40, 41, 400, 39, 40} {
		m.observe(stepStat{took: ms(x), seqs: 4, positions: 4})
	}
	t0, _, _ = m.line(4, 4)
	near("T(4) with a spike", t0, 0.040, 1e-9)
	// line's answers are kept until the next step is observed.
	for range 4 {
		m.observe(stepStat{took: ms(400), seqs: 4, positions: 4})
	}
	t0, _, _ = m.line(4, 4)
	near("T(4) after slow steps", t0, 0.400, 1e-9)
	// Equal times: the floor.
	var flat batchCost
	for P := 1; P <= 8; P++ {
		flat.observe(stepStat{took: ms(100), seqs: 1, positions: P})
	}
	t0, slope, _ = flat.line(4, 4)
	near("equal times: slope", slope, costSlopeFloor*t0/4, 1e-9)
	// Steps an idle moment apart are not paired.
	clock := time.Unix(1000, 0)
	idle := batchCost{now: func() time.Time { return clock }}
	idle.observe(stepStat{took: ms(10), seqs: 1, positions: 1})
	clock = clock.Add(costPairGap + 50*time.Millisecond)
	idle.observe(stepStat{took: ms(10), seqs: 1, positions: 2})
	if idle.np != 0 {
		t.Errorf("steps %v apart paired", costPairGap+50*time.Millisecond)
	}

	c.observe(stepStat{took: ms(40), seqs: 4, positions: 4})
	if c.plainDue() {
		t.Fatal("a plain step was measured: none is due")
	}
	for range batchRemeasure - 1 {
		c.observe(stepStat{took: ms(60), seqs: 4, positions: 12})
	}
	if c.plainDue() {
		t.Fatalf("a plain step asked for before %d verifying steps", batchRemeasure)
	}
	c.observe(stepStat{took: ms(60), seqs: 4, positions: 12})
	if !c.plainDue() {
		t.Fatalf("no plain step asked for after %d verifying steps", batchRemeasure)
	}
	if a := c.acceptance(); a != 0.5 {
		t.Fatalf("prior acceptance %v", a)
	}
	c.verified(4, 3)
	if a, want := c.acceptance(), (batchDecay*1+3)/(batchDecay*2+4); math.Abs(a-want) > 1e-12 {
		t.Fatalf("acceptance %v, want %v", a, want)
	}
}
