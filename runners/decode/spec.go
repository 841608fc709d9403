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
// After each sampled token the generation looks for the earlier place in
// the prompt and the output so far that ends with the longest run of the
// history's last tokens (the latest of equally long ones) and drafts the k
// tokens that followed it: an answer that copies a file keeps matching the
// place it copies from, however often its lines recur elsewhere.
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
// measured of drafting (acceptance by match length), the step it drafts
// into, the verification in progress and its counts.
//
// How many tokens to draft is chosen per step by expected tokens per unit
// of time of the whole step: with acceptance a (per drafted token, given
// the ones before it were accepted) a draft of k yields 1 + a + … + a^k
// tokens, and the other members of the step (Bo sequences, Po positions
// in the generation's last step) yield G = Bo + (Po − Bo)·(the batch's
// acceptance); the step takes T(Po + 1 + k), from batchCost's line
// through the measured times of steps of about that many positions. The k that maximizes (G + tokens)/T is
// drafted when that beats a plain step's (G + 1)/T(Po + 1) by a margin
// (specMargin's, shared by the step's expected tokens); otherwise the
// step is plain, and that match length is probed with one drafted token
// after 1, 2, 4 … 64 plain steps, so that a workload drafting cannot help
// pays almost nothing. Alone, G is 0 and T the generation's own steps.
//
// A probe costs an extra position and saves a step when its token is
// accepted: where a position costs most of a step (a compute-bound
// backend: 0.76–0.85 of one on MLX's CPU device with SmolLM2's Q4) the
// schedule's ~20 probes of an open chat answer of 200 tokens cost 5 %. So
// the probes' net cost (positions less accepted tokens, in plain steps)
// is held within specProbeBudget of the generation's steps (plus one
// step's worth to begin with; the first probe always goes): past it the
// step stays plain and the class's schedule waits. Accepted probes pay
// for themselves and never hold one back. (A draft model's probes are
// bounded by what keeping the draft in step costs: draftPlan.)
type speculator struct {
	v     verifier
	vocab int
	max   int      // the most tokens drafted (--speculative-tokens)
	d     *drafter // draft mode: the draft model (nil: prompt lookup)
	force bool     // Options.specForce

	// ok and fail: decayed counts of drafted tokens accepted and of
	// verifications that ended in a rejection, by match class (matchClass:
	// 1–5; 0: a draft model's drafts).
	ok, fail [matchClasses]float64
	// wait and gap: the plain steps left before that class is probed
	// again, and the current gap.
	wait, gap [matchClasses]int
	// bc: the step times the generation's drafts are weighed against: its
	// batch's (verifying in a batch) or its own.
	bc  *batchCost
	own batchCost
	// last: the last step the generation was in, and its own positions in
	// it (the others' are what the next step is expected to hold).
	last    stepStat
	lastOwn int
	// step: a plain step's seconds per sequence, and cost: an extra
	// position's cost in those units, as the last plan saw them (logged;
	// a draft model's costs are weighed against step).
	step, cost float64

	on    bool        // a verification's rows are being consumed
	pend  bool        // draft is held for the step in flight to check its first token (hold)
	base  int         // the drafts the verification's rows start after (settle: 1)
	n     int         // the match class of its draft (0: a draft model's)
	draft []int32     // the verification in progress: its drafted tokens
	rows  [][]float32 // the logits after the fed token and each draft
	all   [][]float32 // every row of the forward (rows is its tail)
	q     [][]float32 // sampled drafts: each one's draft distribution (nil: point masses)
	row   int         // the row the last sampled token came from
	buf   []float32   // rows' storage
	feed  []int32

	accepted, rejected int
	steps              int // draft mode: decisions made (see propose)
	inFlight           int // drafts whose first token an overlapped step checked (settle)

	// at indexes the history lookup searches: each token's positions,
	// in order, for the first indexed tokens (see index).
	at      map[int32][]int32
	indexed int
	first   int32 // history[0] and history[indexed-1] when indexed
	lastIdx int32

	// looks: the steps the generation asked for a draft (propose);
	// probeDebt: what its probes cost beyond what they saved, in plain
	// steps (see speculator); probing: the verification in progress is
	// a probe; held: probes the budget held back (tests).
	looks     int
	probeDebt float64
	probing   bool
	held      int
}

// Match classes: a prompt-lookup draft's acceptance is learnt by how long
// a run of the history's last tokens its source place ends with.
const (
	matchClasses = 6
	maxMatch     = 32 // a longer run counts as this long
)

// matchClass is the class of a match of n tokens: 1, 2, 3, 4–7 or 8 and
// more.
func matchClass(n int) int {
	switch {
	case n >= 8:
		return 5
	case n >= 4:
		return 4
	default:
		return n
	}
}

// Priors (newSpeculator): acceptance 1/2 in every class; batchCost's
// costPrior until two step sizes are measured.
const (
	specDecay  = 0.8  // weight of the past in the acceptance counts, per verification
	specAlpha  = 0.25 // weight of a new timing in the moving averages
	specMargin = 1.05 // expected speed-up a draft must promise (alone; in a batch the tokens' share)
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
	// specProbeBudget: the share of a generation's steps its probes may
	// cost beyond what their accepted tokens saved; specProbeStart: what
	// they may cost before that (in plain steps).
	specProbeBudget = 0.01
	specProbeStart  = 1.0
)

func newSpeculator(v verifier, vocab, max int) *speculator {
	sp := &speculator{v: v, vocab: vocab, max: max, cost: costPrior, last: stepStat{seqs: 1, positions: 1}, lastOwn: 1}
	sp.bc = &sp.own
	for n := range sp.ok {
		sp.ok[n], sp.fail[n] = 1, 1
	}
	return sp
}

// active reports whether a verification's rows are being consumed.
func (sp *speculator) active() bool { return sp.on }

// pending reports whether a draft is held (hold).
func (sp *speculator) pending() bool { return sp.pend }

// hold keeps the draft just proposed for the step already in flight (an
// overlapped step fed with the token the draft follows) to check its
// first token: settle is called with that step's token. The counts and
// the learning are those of a verification of the whole draft from that
// token on.
func (sp *speculator) hold() {
	sp.pend = true
	if sp.probing && len(sp.draft) == 1 {
		// A probe checked this way costs no position and saves no
		// step (no row follows its token): outside the probes' budget.
		sp.probeDebt -= max(sp.cost, 0)
		sp.probing = false
	}
}

// settle checks the held draft's first token against tok, the token the
// step after the draft's place picked. It returns true when tok is that
// token and more drafts follow: the caller verifies them after tok (feed
// and rows start at the second draft); otherwise the verification ends
// here (end), as a serial one whose first row picked tok would.
func (sp *speculator) settle(tok int32) bool {
	sp.pend, sp.on, sp.row = false, true, 0
	sp.inFlight++
	if len(sp.draft) > 0 && tok == sp.draft[0] {
		sp.accepted++
		sp.row = 1
		if len(sp.draft) > 1 {
			sp.base = 1
			return true
		}
	}
	sp.end()
	return false
}

// next is called with the token sampled from the current row: when it is
// the drafted one (already in the cache) it returns the next row.
func (sp *speculator) next(tok int32) ([]float32, bool) {
	if sp.row < len(sp.draft) && tok == sp.draft[sp.row] {
		sp.accepted++
		sp.row++
		return sp.rows[sp.row-sp.base], true
	}
	return nil, false
}

// end closes the verification in progress: the drafts past the current
// row were rejected (the caller truncates the cache); the acceptance of
// its n-gram length learns from it. A held draft (the generation ended
// before its check) counts as a verification with nothing accepted.
func (sp *speculator) end() {
	if sp.pend {
		sp.pend, sp.on, sp.row = false, true, 0
	}
	if !sp.on {
		return
	}
	if len(sp.draft) == 0 { // a catch-up forward (see verify): nothing drafted
		sp.on, sp.rows, sp.row, sp.base = false, sp.rows[:0], 0, 0
		return
	}
	k, ok := len(sp.draft), sp.row
	if sp.probing {
		sp.probeDebt -= float64(ok) // each accepted token saved a step
		sp.probing = false
	}
	sp.rejected += k - ok
	sp.bc.verified(k, ok)
	sp.ok[sp.n] = specDecay*sp.ok[sp.n] + float64(ok)
	sp.fail[sp.n] *= specDecay
	if ok < k {
		sp.fail[sp.n]++
	}
	clear(sp.rows)
	sp.on, sp.rows, sp.draft, sp.row, sp.q, sp.base = false, sp.rows[:0], sp.draft[:0], 0, nil, 0
}

// observe records how long a forward of rows positions of this
// generation alone took (1: a plain step).
func (sp *speculator) observe(rows int, d time.Duration) {
	sp.record(stepStat{took: d, seqs: 1, positions: rows}, rows)
}

// record is observe of a step's stat.
func (sp *speculator) record(st stepStat, rows int) {
	sp.own.observe(st)
	sp.last, sp.lastOwn = st, rows
	sp.plainStep()
}

// observePlain records a plain step of a generation that verifies on its
// own: waited is the step's time as the generation saw it, in a batch
// (mem) its forward's stat. In a batch the generation's verifications
// step aside into forwards of their own (Server.batchVerify false), so
// its plain step is what that step's forward spent on it, its share of
// the batch's positions — not the wait for the batch, which made an
// extra verified position look almost free and drafted where it could
// not pay.
//
// An overlapped step is counted untimed (see overlapRun.step).
func (sp *speculator) observePlain(b stepStat, batched bool, waited time.Duration) {
	st := stepStat{took: waited, seqs: 1, positions: 1, wall: waited}
	switch {
	case b.untimed:
		st = stepStat{seqs: 1, positions: 1, untimed: true}
	case batched && b.took > 0:
		st.took = b.took / time.Duration(max(b.positions, b.seqs, 1))
	}
	sp.record(st, 1)
}

// observeBatch records the batch step the generation was in, own of its
// positions (its verification's chunk, or 1); the batcher measured its
// time (batchCost).
func (sp *speculator) observeBatch(st stepStat, own int) {
	sp.last, sp.lastOwn = st, own
	sp.plainStep()
}

// plainStep sets step from the generation's cost model: a plain step of
// its last step's sequences, per sequence.
func (sp *speculator) plainStep() {
	B := max(sp.last.seqs, 1)
	if t, _, ok := sp.bc.line(B, 0); ok {
		sp.step = t / float64(B)
	}
}

// plan is how many of avail tokens to draft after a match of class n, or
// with the draft model (n 0); 0: a plain step. A draft model's k tokens
// cost k draft forwards more (measured: drafter.step).
func (sp *speculator) plan(n, avail int) int {
	if sp.force {
		return avail
	}
	best := sp.best(n, avail)
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
	// A prompt-lookup probe's extra position, in plain steps (a draft
	// model's probes have their own bound: draftPlan).
	if sp.d == nil {
		if sp.probeDebt > specProbeStart+specProbeBudget*float64(sp.looks) {
			sp.held++
			return 0 // over budget: the class waits for the next match
		}
		sp.probeDebt += max(sp.cost, 0)
		sp.probing = true
	}
	sp.gap[n] = min(64, max(1, 2*sp.gap[n]))
	sp.wait[n] = sp.gap[n]
	return 1 // a probe
}

// best is the draft length (≤ avail) that maximizes the expected tokens
// per second of the step the generation drafts into (see speculator);
// 0 when none beats a plain step by the margin or nothing is measured.
func (sp *speculator) best(n, avail int) int {
	Bo := max(sp.last.seqs-1, 0)
	Po := max(sp.last.positions-sp.lastOwn, Bo)
	P0 := Po + 1
	T0, slope, ok := sp.bc.line(P0, 1)
	if !ok {
		return 0
	}
	if t, _, ok := sp.bc.line(Bo+1, 0); ok {
		sp.step = t / float64(Bo+1)
	}
	sp.cost = slope / (T0 / float64(Bo+1))
	G := float64(Bo)
	if Po > Bo {
		G += float64(Po-Bo) * sp.bc.acceptance()
	}
	margin := specMargin
	dstep := 0.0 // a draft forward's seconds
	if sp.d != nil {
		margin = specDraftMargin
		dstep = sp.dcost() * sp.step
	}
	a := sp.ok[n] / (sp.ok[n] + sp.fail[n])
	best, bestV := 0, (G+1)/T0*(1+(margin-1)/(G+1))
	e, p := 1.0, 1.0
	for k := 1; k <= avail; k++ {
		p *= a
		e += p
		// The step of P0 + k positions, from the line through the
		// sizes around P0 … P0 + k.
		if k > 1 {
			if _, slope, ok = sp.bc.line(P0, k); !ok {
				break
			}
		}
		if v := (G + e) / (T0 + (slope+dstep)*float64(k)); v > bestV {
			best, bestV = k, v
		}
	}
	return best
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
	sp.looks++
	sp.probing = false // end closed the last verification
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

// lookup is propose by prompt lookup: the place before the history's
// last token that ends with the longest run of its last tokens (up to
// maxMatch; the latest of equally long ones), and what followed it.
// It looks only where the last token occurred (index), latest first.
func (sp *speculator) lookup(history []int32, limit int) []int32 {
	limit = min(limit, sp.max)
	from, n := sp.match(history)
	if from < 0 {
		return nil
	}
	cl := matchClass(n)
	k := sp.plan(cl, min(limit, len(history)-from))
	if k == 0 {
		return nil
	}
	sp.n = cl
	sp.draft = append(sp.draft[:0], history[from:from+k]...)
	return sp.draft
}

// match is lookup's search: where the draft begins (after the place that
// ends with the longest run of the history's last tokens, the latest of
// equally long ones) and the run's length (up to maxMatch); -1 when the
// last token did not occur before.
func (sp *speculator) match(history []int32) (from, n int) {
	L := len(history)
	if L < 2 {
		return -1, 0
	}
	sp.index(history[:L-1])
	from = -1
	pos := sp.at[history[L-1]]
	for j := len(pos) - 1; j >= 0; j-- {
		i := int(pos[j])
		m := 1
		for m < maxMatch && m <= i && history[i-m] == history[L-1-m] {
			m++
		}
		if m > n {
			from, n = i+1, m
			if m == maxMatch {
				break
			}
		}
	}
	return from, n
}

// index brings sp.at up to h, the history before its last token. The
// history of a generation only grows between lookups (generate's), so
// only its new tokens are indexed; one that is shorter, or whose first
// or last indexed token differs, is indexed anew.
func (sp *speculator) index(h []int32) {
	if sp.at == nil || len(h) < sp.indexed || (sp.indexed > 0 && (h[0] != sp.first || h[sp.indexed-1] != sp.lastIdx)) {
		if sp.at == nil {
			sp.at = map[int32][]int32{}
		}
		for k, v := range sp.at {
			sp.at[k] = v[:0]
		}
		sp.indexed = 0
	}
	for i := sp.indexed; i < len(h); i++ {
		sp.at[h[i]] = append(sp.at[h[i]], int32(i))
	}
	sp.indexed = len(h)
	if len(h) > 0 {
		sp.first, sp.lastIdx = h[0], h[len(h)-1]
	}
}

// verify feeds tok and the proposed draft (none: a catch-up forward) in
// one forward of their own and returns the logits after tok (row 0); the
// rows after the drafts follow through next. pre are tokens the cache
// lacks before tok (a hybrid cache's rollback went back to where the last
// verification began: the tokens it kept are fed again). It records the
// forward's time (observe).
// (Server.verifyBatched does the same in a batch's forward.)
func (sp *speculator) verify(ctx context.Context, c engine.KVCache, pre []int32, tok int32) ([]float32, error) {
	feed := sp.feedFor(pre, tok)
	n := len(feed)
	if cap(sp.buf) < n*sp.vocab {
		sp.buf = make([]float32, 0, (sp.max+1+len(pre))*sp.vocab)
	}
	t0 := time.Now()
	if _, err := sp.v.ForwardAllInto(ctx, c, feed, sp.buf[:0]); err != nil {
		sp.draft = sp.draft[:0]
		return nil, err
	}
	sp.observe(n, time.Since(t0)) // the forward alone (see observePlain)
	// The model's row headers are its scratch (another generation's step
	// may reuse them): the rows are read from buf, which is this
	// generation's own.
	return sp.begin(sp.buf[:n*sp.vocab], len(pre)), nil
}

// feedFor is the chunk a verification feeds: pre, tok and the draft.
func (sp *speculator) feedFor(pre []int32, tok int32) []int32 {
	sp.feed = append(append(append(sp.feed[:0], pre...), tok), sp.draft[sp.base:]...)
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
	sp.on, sp.row = true, sp.base
	return sp.rows[0]
}
