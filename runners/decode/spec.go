package decode

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/sample"
)

// Speculative decoding by prompt lookup (and the verification a draft
// model's drafts share: see draft.go).
//
// After each sampled token the generation looks for the latest earlier
// occurrence of the history's last n tokens (n from 3 down to 1) in the
// prompt and the output so far and drafts the k tokens that followed it.
// The token and its draft go through the model in one forward, which
// returns the logits after each of them: the batch's step, shared with the
// other generations' (the batcher runs every member's chunk in one
// engine.Model.ForwardBatchAllInto; see batch.go), or, without a batch or
// a model that can, a forward of the generation's own
// (engine.Model.ForwardAllInto). Those rows then go, in order, through exactly the pipeline of plain
// decoding (constraint mask, sampler with its penalties and bias,
// logprobs, stop check), one sampled token per row: while the sampled
// token equals the drafted one the next row is already computed; at the
// first that differs (or after the last row: the bonus token) the cache
// is truncated past the rejected drafts and decoding goes on from the
// sampled token.
//
// Every emitted token is thus sampled from the target's distribution given
// the tokens before it, with the same sampler calls in the same order as
// without speculation: greedy output is identical, and at temperature > 0
// so is the distribution (for a point-mass draft, "sample x from the
// target, accept the draft if x equals it, else emit x" is the rejection
// rule: accept with probability p(t), otherwise a draw from p without t,
// renormalized), and a seeded request gives the same text. Speculation
// only changes how many forwards the tokens take (and how many tokens to
// draft is decided by a measured cost model: see speculator).

// Speculation modes (--speculative).
const (
	SpecOff          = "off"
	SpecPromptLookup = "prompt-lookup"
	SpecDraft        = "draft"
)

// DefaultSpecTokens is the most tokens drafted per step when
// --speculative-tokens is not given.
const DefaultSpecTokens = 8

// maxSpecTokens bounds --speculative-tokens (one verification is one
// forward of k+1 positions).
const maxSpecTokens = 64

// CheckSpeculative validates a speculation mode and its maximum draft
// length (0: the default): the runner's flags and the cluster file.
func CheckSpeculative(mode string, tokens int) error {
	switch mode {
	case "", SpecOff, SpecPromptLookup, SpecDraft:
	default:
		return fmt.Errorf("speculative mode %q: want %q, %q or %q", mode, SpecOff, SpecPromptLookup, SpecDraft)
	}
	if tokens < 0 || tokens > maxSpecTokens {
		return fmt.Errorf("speculative tokens %d: want 1 to %d (0: %d)", tokens, maxSpecTokens, DefaultSpecTokens)
	}
	return nil
}

// verifier is the model method speculation needs (engine.Model has it).
type verifier interface {
	ForwardAllInto(ctx context.Context, c engine.KVCache, tokens []int32, dst []float32) ([][]float32, error)
}

// specRefusal says why a model cannot speculate ("" when it can): it must
// verify several tokens in one forward and pick from their logits.
//
// Every cache can go back after a verification: a sliding layer's ring
// keeps RingSlack positions before the window of the length a step began
// at, so it still holds the window of any position the step's tokens
// reach (CanTruncate); a hybrid (Gated DeltaNet) cache goes back to the
// state where the verification began (its mark), and the generation feeds
// the accepted tokens again with its next forward (speculator.verify's
// pre).
func specRefusal(m Model) string {
	if _, ok := m.(PickingModel); ok {
		return "a pipeline's logits live on its last stage, which picks one token per step: drafts cannot be verified there yet"
	}
	if _, ok := m.(verifier); !ok {
		return "the model cannot verify several tokens in one forward"
	}
	return ""
}

// setupSpec turns speculation on as the Options ask, or logs why not.
func (s *Server) setupSpec(o Options) {
	if err := CheckSpeculative(o.Speculative, o.SpecTokens); err != nil {
		s.log.Error("speculative decoding off", "model", o.Name, "err", err)
		return
	}
	if o.Speculative == "" || o.Speculative == SpecOff {
		return
	}
	why := specRefusal(o.Model)
	if why == "" && o.Speculative == SpecDraft && o.Draft == nil {
		why = "mode draft without a draft model (--draft)"
	}
	if why != "" {
		s.log.Warn("speculative decoding off for this model", "model", o.Name, "mode", o.Speculative, "reason", why)
		return
	}
	s.specMax = cmp.Or(o.SpecTokens, DefaultSpecTokens)
	if o.Speculative == SpecDraft {
		s.draftPool = newKVPool(o.CacheEntries, o.CacheTokens, o.Draft.NewCache)
		s.draftVocab = draftVocab(s.info, o.Draft.Info(), o.Text)
	}
}

// newSpec is req's speculator (with its drafter in draft mode: sampling
// its drafts for an unseeded request at temperature > 0 whose Picker can
// verify them).
func (s *Server) newSpec(req *gen.Request, picker *Picker) *speculator {
	sp := newSpeculator(s.o.Model.(verifier), s.info.Vocab, s.specMax)
	sp.force = s.o.specForce
	if s.draftPool != nil {
		sp.d = &drafter{m: s.o.Draft, vocab: s.draftVocab, maxP: s.o.Draft.Info().MaxPositions, pool: s.draftPool, chunk: s.o.PrefillChunk}
		if _, ok := picker.sampler.(DraftSampler); ok && req.Sampling.Temperature > 0 && !req.Sampling.SeedSet {
			sp.d.sampler = draftSampler(req.Sampling)
		}
	}
	return sp
}

// draftSampler samples a draft model's tokens for a request: its
// temperature, top-k, top-p, min-p and logit bias, fresh randomness of its
// own; no penalties (any distribution is a valid draft: the rule keeps the
// target's, and one closer to the target's is kept more often).
func draftSampler(p gen.Sampling) DraftSampler {
	return sample.New(sample.Params{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
		LogitBias: p.LogitBias, RandomSeed: true})
}

// propose is sp.propose with the generation aside from the batch while a
// draft model drafts (the batch does not wait for its next step).
func (s *Server) propose(ctx context.Context, mem *member, sp *speculator, history []int32, limit int) ([]int32, error) {
	switch {
	case mem != nil && sp.d != nil && s.batchVerify(mem):
		// The batch waits a while for this member's verification (its
		// drafts come within a few draft steps, batched with the other
		// members' drafting: see drafter.draft).
		mem.drafting(true)
		defer mem.drafting(false)
	case mem != nil && sp.d != nil:
		mem.aside()
		defer mem.back()
	}
	return sp.propose(ctx, history, limit)
}

// pick picks from logits with p: a row of sampled drafts by speculative
// sampling's rule (Picker.PickDraft), any other as Pick (sp may be nil).
func (sp *speculator) pick(p *Picker, logits []float32) (Picked, error) {
	if sp != nil && sp.on && sp.q != nil && sp.row < len(sp.draft) {
		return p.PickDraft(logits, sp.draft[sp.row], sp.q[sp.row])
	}
	return p.Pick(logits)
}

// speculator is one generation's prompt-lookup state: what it has
// measured of drafting (acceptance by n-gram length, the cost of a
// verification against a plain step), the verification in progress and
// its counts.
//
// How many tokens to draft is chosen per step by expected tokens per unit
// of time: with acceptance a (per drafted token, given the ones before it
// were accepted) a draft of k yields 1 + a + … + a^k tokens for a forward
// that costs 1 + c·k plain steps, c the measured cost of an extra position
// (close to 0 where a step is bound by reading the weights, larger on a
// compute-bound cpu). The k that maximizes the ratio is drafted when the
// ratio is above 1 with a margin; otherwise the step is plain, and that
// n-gram length is probed with one drafted token after 1, 2, 4 … 64 plain
// steps, so that a workload drafting cannot help pays almost nothing.
type speculator struct {
	v     verifier
	vocab int
	max   int      // the most tokens drafted (--speculative-tokens)
	d     *drafter // draft mode: the draft model (nil: prompt lookup)
	force bool     // Options.specForce

	// ok and fail: decayed counts of drafted tokens accepted and of
	// verifications that ended in a rejection, by n-gram length (1–3;
	// 0: a draft model's drafts).
	ok, fail [4]float64
	// wait and gap: the plain steps left before that length is probed
	// again, and the current gap.
	wait, gap [4]int
	// step: a plain step's seconds, per sequence of its batch (its batch
	// size's plain step over that size; moving average; 0: unmeasured).
	step float64
	// stepB: a plain batch step's seconds by batch size (moving averages;
	// 0: unmeasured). Alone, stepB[1] is step.
	stepB []float64
	// cost: an extra verified position's cost, in plain steps per
	// sequence: what it adds to its batch's step, over the step's share
	// of one sequence (alone, over a plain step). Every member of a batch
	// waits for the positions any of them verifies, so a draft of k pays
	// when it yields more than the k·cost plain steps' worth it costs.
	cost float64
	// bc: the batch's cost model, when the generation verifies in a
	// batch (nil: alone); once it can tell, it sets step and cost.
	bc *batchCost

	on    bool        // a verification's rows are being consumed
	n     int         // the n-gram length its draft matched (0: a draft model's)
	draft []int32     // the verification in progress: its drafted tokens
	rows  [][]float32 // the logits after the fed token and each draft
	all   [][]float32 // every row of the forward (rows is its tail)
	q     [][]float32 // sampled drafts: each one's draft distribution (nil: point masses)
	row   int         // the row the last sampled token came from
	buf   []float32   // rows' storage
	feed  []int32

	accepted, rejected int
	steps              int // draft mode: decisions made (see propose)
}

// Priors (newSpeculator): acceptance 1/2 at every length, an extra
// position a quarter of a step; measurements replace them within a few
// steps.
const (
	specDecay  = 0.8  // weight of the past in the acceptance counts, per verification
	specAlpha  = 0.25 // weight of a new timing in the moving averages
	specMargin = 1.05 // expected speed-up a draft must promise
	// specRemeasure: with a draft model, every so many steps is plain.
	specRemeasure = 32
	// specDraftCatchup bounds what feeding the draft the tokens of plain
	// steps may cost, per token in plain steps, for a generation whose
	// drafts do not pay to go on probing (a compute-bound backend's
	// draft prefill costs about the draft's share of the target's work).
	specDraftCatchup = 0.03
	// specDraftMargin is specMargin for a draft model's drafts: drafting
	// also pays for keeping the draft's cache in step after plain steps,
	// which the cost model does not count.
	specDraftMargin = 1.15
)

func newSpeculator(v verifier, vocab, max int) *speculator {
	sp := &speculator{v: v, vocab: vocab, max: max, cost: 0.25}
	for n := range sp.ok {
		sp.ok[n], sp.fail[n] = 1, 1
	}
	return sp
}

// active reports whether a verification's rows are being consumed.
func (sp *speculator) active() bool { return sp.on }

// next is called with the token sampled from the current row: when it is
// the drafted one (already in the cache) it returns the next row.
func (sp *speculator) next(tok int32) ([]float32, bool) {
	if sp.row < len(sp.draft) && tok == sp.draft[sp.row] {
		sp.accepted++
		sp.row++
		return sp.rows[sp.row], true
	}
	return nil, false
}

// end closes the verification in progress: the drafts past the current
// row were rejected (the caller truncates the cache); the acceptance of
// its n-gram length learns from it.
func (sp *speculator) end() {
	if !sp.on {
		return
	}
	if len(sp.draft) == 0 { // a catch-up forward (see verify): nothing drafted
		sp.on, sp.rows, sp.row = false, sp.rows[:0], 0
		return
	}
	k, ok := len(sp.draft), sp.row
	sp.rejected += k - ok
	sp.ok[sp.n] = specDecay*sp.ok[sp.n] + float64(ok)
	sp.fail[sp.n] *= specDecay
	if ok < k {
		sp.fail[sp.n]++
	}
	clear(sp.rows)
	sp.on, sp.rows, sp.draft, sp.row, sp.q = false, sp.rows[:0], sp.draft[:0], 0, nil
}

// observe records how long a forward of rows positions of this
// generation alone took (1: a plain step).
func (sp *speculator) observe(rows int, d time.Duration) {
	sp.observeStep(stepStat{took: d, seqs: 1, positions: rows})
}

// observeStep records how long a batch step of st.seqs sequences and
// st.positions positions took (as many as sequences: a plain step).
// Plain steps are averaged per batch size; a step with more positions
// measures the cost of one against its size's plain step.
func (sp *speculator) observeStep(st stepStat) {
	t, B, P := st.took.Seconds(), max(st.seqs, 1), st.positions
	if len(sp.stepB) <= B {
		sp.stepB = append(sp.stepB, make([]float64, B+1-len(sp.stepB))...)
	}
	plain := &sp.stepB[B]
	if P <= B {
		if *plain == 0 {
			*plain = t
		} else {
			*plain += specAlpha * (t - *plain)
		}
		sp.step = *plain / float64(B)
		return
	}
	if *plain > 0 {
		sp.step = *plain / float64(B)
		c := min(max(float64(B)*(t / *plain - 1)/float64(P-B), 0), 2)
		sp.cost += specAlpha * (c - sp.cost)
	}
}

// observeBatch is observeStep for a step of the generation's batch: the
// batch's measure (over all its members' steps: batchCost) replaces the
// generation's own once it has one.
func (sp *speculator) observeBatch(st stepStat) {
	sp.observeStep(st)
	if sp.bc == nil {
		return
	}
	if step, c, ok := sp.bc.at(max(st.seqs, 1)); ok {
		sp.step, sp.cost = step, c
	}
}

// plan is how many of avail tokens to draft after an n-gram match of
// length n, or with the draft model (n 0); 0: a plain step. A draft
// model's k tokens cost k draft forwards more, each measured in plain
// steps (dcost).
func (sp *speculator) plan(n, avail int) int {
	if sp.force {
		return avail
	}
	a := sp.ok[n] / (sp.ok[n] + sp.fail[n])
	best, bestV := 0, specMargin
	if sp.d != nil {
		bestV = specDraftMargin
	}
	e, p := 1.0, 1.0
	per := sp.cost + sp.dcost()
	for k := 1; k <= avail; k++ {
		p *= a
		e += p
		if v := e / (1 + per*float64(k)); v > bestV {
			best, bestV = k, v
		}
	}
	if best > 0 {
		sp.gap[n], sp.wait[n] = 0, 0
		return best
	}
	if avail == 0 {
		return 0
	}
	if sp.wait[n] > 0 {
		sp.wait[n]--
		return 0
	}
	sp.gap[n] = min(64, max(1, 2*sp.gap[n]))
	sp.wait[n] = sp.gap[n]
	return 1 // a probe
}

// draftPlan is plan for a draft model's drafts (0: a plain step). When
// drafting does not pay and keeping the draft in step with the plain steps
// to probe it costs more per token than specDraftCatchup, the generation
// drafts no more (a probe could not find what it costs).
func (sp *speculator) draftPlan(limit int) int {
	if sp.d.off || sp.d.err != nil {
		return 0
	}
	k := sp.plan(0, limit)
	if probe := k == 1 && sp.gap[0] > 0; probe && !sp.force && sp.catchup() > specDraftCatchup {
		sp.d.off = true
		return 0
	}
	return k
}

// catchup is what feeding the draft one token of the history costs (its
// prefill), in plain target steps (0: unmeasured).
func (sp *speculator) catchup() float64 {
	if sp.d == nil || sp.d.catch == 0 || sp.step == 0 {
		return 0
	}
	return sp.d.catch / sp.step
}

// dcost is a draft forward's cost in plain target steps (0 without a
// draft model).
func (sp *speculator) dcost() float64 {
	switch {
	case sp.d == nil:
		return 0
	case sp.d.step > 0 && sp.step > 0:
		return min(sp.d.step/sp.step, 4)
	default:
		return draftCostPrior
	}
}

// propose drafts at most limit tokens to follow history (whose last token
// is the one about to be fed): the draft model's (draft mode), else what
// followed the latest earlier occurrence of its last n tokens, for the
// longest n ≤ 3 that occurs; as many as plan says pay. A draft model that
// fails drafts no more in this generation (the error is returned once, to
// be logged; decoding goes on without drafts).
func (sp *speculator) propose(ctx context.Context, history []int32, limit int) ([]int32, error) {
	limit = min(limit, sp.max)
	if limit <= 0 {
		return nil, nil
	}
	if sp.bc != nil && !sp.force && sp.bc.plainDue() {
		return nil, nil // the batch measures a plain step (batchCost)
	}
	if sp.d != nil {
		// The cost model weighs a draft forward against a plain step
		// (first measured on the prompt's last token): every
		// specRemeasure-th step is plain to keep that measured (a
		// generation that drafts every step would not).
		sp.steps++
		if sp.steps%specRemeasure == 0 && !sp.force {
			return nil, nil
		}
		k := sp.draftPlan(limit)
		if k == 0 {
			return nil, nil
		}
		d, err := sp.d.draft(ctx, history, k)
		sp.n = 0
		sp.draft = append(sp.draft[:0], d...)
		sp.q = nil
		if sp.d.sampler != nil {
			sp.q = sp.d.q[:len(d)]
		}
		if len(d) == 0 {
			return nil, err
		}
		return sp.draft, nil
	}
	return sp.lookup(history, limit), nil
}

// lookup is propose by prompt lookup.
func (sp *speculator) lookup(history []int32, limit int) []int32 {
	limit = min(limit, sp.max)
	L := len(history)
	for n := min(3, L-1); n >= 1; n-- {
		suffix := history[L-n:]
		for i := L - n - 1; i >= 0; i-- {
			if history[i] != suffix[0] || !equal32(history[i:i+n], suffix) {
				continue
			}
			from := i + n
			k := sp.plan(n, min(limit, L-from))
			if k == 0 {
				return nil
			}
			sp.n = n
			sp.draft = append(sp.draft[:0], history[from:from+k]...)
			return sp.draft
		}
	}
	return nil
}

func equal32(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// verify feeds tok and the proposed draft (none: a catch-up forward) in
// one forward of their own and returns the logits after tok (row 0); the
// rows after the drafts follow through next. pre are tokens the cache
// lacks before tok (a hybrid cache's rollback went back to where the last
// verification began: the tokens it kept are fed again).
// (Server.verifyBatched does the same in a batch's forward.)
func (sp *speculator) verify(ctx context.Context, c engine.KVCache, pre []int32, tok int32) ([]float32, error) {
	feed := sp.feedFor(pre, tok)
	n := len(feed)
	if cap(sp.buf) < n*sp.vocab {
		sp.buf = make([]float32, 0, (sp.max+1+len(pre))*sp.vocab)
	}
	if _, err := sp.v.ForwardAllInto(ctx, c, feed, sp.buf[:0]); err != nil {
		sp.draft = sp.draft[:0]
		return nil, err
	}
	// The model's row headers are its scratch (another generation's step
	// may reuse them): the rows are read from buf, which is this
	// generation's own.
	return sp.begin(sp.buf[:n*sp.vocab], len(pre)), nil
}

// feedFor is the chunk a verification feeds: pre, tok and the draft.
func (sp *speculator) feedFor(pre []int32, tok int32) []int32 {
	sp.feed = append(append(append(sp.feed[:0], pre...), tok), sp.draft...)
	return sp.feed
}

// begin starts consuming a verification's rows, flat holding the logits
// after each token of feedFor's chunk (storage the generation owns until
// its next step), and returns the row after tok (pre tokens before it).
func (sp *speculator) begin(flat []float32, pre int) []float32 {
	sp.all = sp.all[:0]
	for i := range len(sp.feed) {
		sp.all = append(sp.all, flat[i*sp.vocab:(i+1)*sp.vocab:(i+1)*sp.vocab])
	}
	sp.rows = sp.all[pre:]
	sp.on, sp.row = true, 0
	return sp.rows[0]
}
