package decode

import (
	"context"
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Speculative decoding by prompt lookup.
//
// After each sampled token the generation looks for the latest earlier
// occurrence of the history's last n tokens (n from 3 down to 1) in the
// prompt and the output so far and drafts the k tokens that followed it.
// The token and its draft go through the model in one forward
// (engine.Model.ForwardAllInto), which returns the logits after each of
// them. Those rows then go, in order, through exactly the pipeline of plain
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
// only changes how many forwards the tokens take.

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
	case "", SpecOff, SpecPromptLookup:
	case SpecDraft:
		return fmt.Errorf("speculative mode %q (a draft model) is not supported yet; use %q or %q", mode, SpecPromptLookup, SpecOff)
	default:
		return fmt.Errorf("speculative mode %q: want %q or %q", mode, SpecOff, SpecPromptLookup)
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

// specRefusal says why a model cannot speculate ("" when it can): its
// caches must go back to any position after a verification.
func specRefusal(m Model) string {
	if _, ok := m.(verifier); !ok {
		return "the model cannot verify several tokens in one forward"
	}
	info := m.Info()
	if info.Recurrent != nil {
		return "recurrent (Gated DeltaNet) layers keep one state and cannot roll back rejected drafts"
	}
	if info.Windows != nil {
		return "sliding-window layers' ring caches cannot always roll back rejected drafts"
	}
	return ""
}

// speculator is one generation's prompt-lookup state: its adaptive draft
// length, the verification in progress and its counts.
type speculator struct {
	v     verifier
	vocab int
	max   int // the most tokens drafted (--speculative-tokens)
	k     int // the current draft length: shrinks when drafts are rejected
	// misses counts verifications in a row that accepted nothing; after
	// two, drafting pauses for pause steps (doubling up to 64), so that a
	// workload speculation cannot help runs plain steps.
	misses, pause int

	on    bool        // a verification's rows are being consumed
	draft []int32     // the verification in progress: its drafted tokens
	rows  [][]float32 // the logits after the fed token and each draft
	row   int         // the row the last sampled token came from
	buf   []float32   // rows' storage
	feed  []int32

	accepted, rejected int
}

func newSpeculator(v verifier, vocab, max int) *speculator {
	return &speculator{v: v, vocab: vocab, max: max, k: max}
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
// row were rejected (the caller truncates the cache), and the next draft
// length is adapted to how many were accepted.
func (sp *speculator) end() {
	if !sp.on {
		return
	}
	n, ok := len(sp.draft), sp.row
	sp.rejected += n - ok
	switch {
	case ok == n:
		sp.k = min(sp.max, sp.k+2)
		sp.misses = 0
	case ok == 0:
		sp.k = max(1, sp.k/2)
		sp.misses++
		if sp.misses >= 2 {
			sp.pause = min(64, 1<<min(sp.misses-2, 6))
		}
	default:
		sp.k = max(1, ok+1)
		sp.misses = 0
	}
	clear(sp.rows)
	sp.on, sp.rows, sp.draft, sp.row = false, sp.rows[:0], sp.draft[:0], 0
}

// propose drafts at most limit tokens to follow history (whose last token
// is the one about to be fed): what followed the latest earlier
// occurrence of its last n tokens, for the longest n ≤ 3 that occurs.
func (sp *speculator) propose(history []int32, limit int) []int32 {
	if sp.pause > 0 {
		sp.pause--
		return nil
	}
	k := min(sp.k, limit)
	if k <= 0 {
		return nil
	}
	L := len(history)
	for n := min(3, L-1); n >= 1; n-- {
		suffix := history[L-n:]
		for i := L - n - 1; i >= 0; i-- {
			if history[i] != suffix[0] || !equal32(history[i:i+n], suffix) {
				continue
			}
			from := i + n
			sp.draft = append(sp.draft[:0], history[from:min(from+k, L)]...)
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

// verify feeds tok and the proposed draft in one forward and returns the
// logits after tok (row 0); the rows after the drafts follow through next.
func (sp *speculator) verify(ctx context.Context, c engine.KVCache, tok int32) ([]float32, error) {
	sp.feed = append(append(sp.feed[:0], tok), sp.draft...)
	n := len(sp.feed)
	if cap(sp.buf) < n*sp.vocab {
		sp.buf = make([]float32, 0, (sp.max+1)*sp.vocab)
	}
	if _, err := sp.v.ForwardAllInto(ctx, c, sp.feed, sp.buf[:0]); err != nil {
		sp.draft = sp.draft[:0]
		return nil, err
	}
	// The model's row headers are its scratch (another generation's step
	// may reuse them): the rows are read from buf, which is this
	// generation's own.
	sp.rows = sp.rows[:0]
	for i := range n {
		sp.rows = append(sp.rows, sp.buf[i*sp.vocab:(i+1)*sp.vocab:(i+1)*sp.vocab])
	}
	sp.on, sp.row = true, 0
	return sp.rows[0], nil
}
