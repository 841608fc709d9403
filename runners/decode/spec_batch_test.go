package decode

import (
	"bufio"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
	reqs := specRequests()
	body := func(name string, extra map[string]any) map[string]any {
		b := map[string]any{}
		for k, v := range reqs[name] {
			b[k] = v
		}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	cases := []map[string]any{
		body("greedy", nil),
		body("grammar", nil),
		body("seeded", nil),
		body("tool call", nil),
		body("penalties", map[string]any{"x_exo_speculative": false}),
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
				got := make([]string, len(cases))
				var wg sync.WaitGroup
				for i, c := range cases {
					wg.Add(1)
					go func() {
						defer wg.Done()
						a, err := answer(s.url, c)
						if err != nil {
							t.Errorf("%s, case %d: %v", mode, i, err)
						}
						got[i] = a
					}()
				}
				wg.Wait()
				if t.Failed() {
					t.FailNow()
				}
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

// TestBatchCost: the batch's measure of a verified position: unmeasured
// until a plain step of the batch's size and a verifying one; then what a
// step of P positions and B sequences takes beyond B's plain step, per
// extra position, over one sequence's share of it; a plain step is asked
// for (plainDue) while the size has none and every batchRemeasure steps.
func TestBatchCost(t *testing.T) {
	var c batchCost
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	if _, _, ok := c.at(4); ok || c.plainDue() {
		t.Fatal("a fresh measure claims a cost or asks for a plain step")
	}
	c.observe(stepStat{took: ms(50), seqs: 4, positions: 12}) // no plain step of 4 yet
	if _, _, ok := c.at(4); ok || !c.plainDue() {
		t.Fatal("without a plain step of the size: want no cost and a plain step asked for")
	}
	c.observe(stepStat{took: ms(40), seqs: 4, positions: 4})
	if c.plainDue() {
		t.Fatal("a plain step was measured: none is due")
	}
	c.observe(stepStat{took: ms(60), seqs: 4, positions: 12}) // 8 extra positions add half a step
	step, cost, ok := c.at(4)
	if !ok || math.Abs(step-0.010) > 1e-12 || math.Abs(cost-4*0.5/8) > 1e-12 {
		t.Fatalf("at(4) = %v, %v, %v; want 10 ms a sequence and cost 0.25", step, cost, ok)
	}
	if _, _, ok := c.at(3); ok {
		t.Fatal("a cost for a batch size never measured plain")
	}
	for range batchRemeasure - 2 {
		c.observe(stepStat{took: ms(60), seqs: 4, positions: 12})
	}
	if c.plainDue() {
		t.Fatalf("a plain step asked for before %d verifying steps", batchRemeasure)
	}
	c.observe(stepStat{took: ms(60), seqs: 4, positions: 12})
	if !c.plainDue() {
		t.Fatalf("no plain step asked for after %d verifying steps", batchRemeasure)
	}
}
