package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Deferred grammars: a model that reasons before it answers (gpt-oss's
// harmony analysis channel, Qwen3's <think>…</think>) must be free to
// reason, and constrained only once its answer begins, as vLLM and
// llama.cpp's server do. Its chat format's chat.Plan says how (harmony.go
// and think.go of runners/chat spell each out): a grammar at the start of
// the output, one after each free segment closes, and one forced when the
// reasoning budget is spent. Each grammar is a grammar.Choice whose
// head-only alternatives open a free segment (the reasoning; for harmony
// in tool_choice "auto" also the final answer and preambles) and whose
// other alternatives are the constrained answer with its header. Inside
// a header, plain tokens that could spell the format's control tokens are
// masked when the vocabulary has them all, so a header is spelled with
// them, as the model was trained.
//
// In a reasoning segment end tokens and control tokens other than the
// closer are masked: the answer always comes (max_tokens still caps the
// whole generation, in which case it is cut off, finish_reason "length").
type deferPlan struct {
	start, next, capped *grammar.Grammar
	heads               map[string]chat.Segment // free segments by the head that opens them
	closer              []byte                  // ends a free segment
	headerEnd           []byte                  // ends a header (nil: no header masking)
}

// deferVocab is what a deferred constraint needs of the vocabulary beyond
// the grammar's trie, computed once per model.
type deferVocab struct {
	special   []int32  // control tokens (left out of the trie), end tokens included
	headerBan []uint64 // plain tokens with '<' or '|' (nil: the format has no control tokens, or they are not all special)
}

// deferredConstraint runs a deferPlan for one generation.
type deferredConstraint struct {
	p       *deferPlan
	v       *grammar.Vocab
	dv      *deferVocab
	bytesOf func(int32) []byte
	budget  int // reasoning tokens before the close is forced (0: no bound)

	seg      *chat.Segment // in a free segment
	used     int           // reasoning tokens so far
	buf      []byte        // free: the tail of the segment, for the closer
	acc      []byte        // constrained: the bytes since the grammar began (up to maxHead)
	inner    *maskConstraint
	inHeader bool
	started  bool
	open     bool    // the prompt opened the reasoning (Qwen3's <think>): start in it
	ban      []int32 // control and end tokens other than the closer: masked in a free segment
}

// maxHead bounds the bytes kept to recognise a head.
const maxHead = 512

func (d *deferredConstraint) begin(g *grammar.Grammar, pre []byte) error {
	c := grammar.NewConstraint(g, d.v)
	if err := c.AdvanceBytes(pre); err != nil {
		return fmt.Errorf("the answer after the reasoning: %w", err)
	}
	d.seg, d.buf = nil, d.buf[:0]
	d.acc = append(d.acc[:0], pre...)
	d.inHeader = d.p.headerEnd != nil && d.dv.headerBan != nil && !bytes.Contains(d.acc, d.p.headerEnd)
	d.inner = newMaskConstraint(c, d.v)
	d.enterFree(c)
	return nil
}

// enterFree leaves the grammar when it has just matched a head that opens
// a free segment.
func (d *deferredConstraint) enterFree(c *grammar.Constraint) {
	seg, ok := d.p.heads[string(bytes.TrimLeft(d.acc, " \t\r\n"))]
	if !ok || !c.CanEnd() {
		return
	}
	d.inner.Close()
	d.inner, d.inHeader = nil, false
	d.seg = &seg
}

func (d *deferredConstraint) init() error {
	if d.started {
		return nil
	}
	d.started = true
	if d.open {
		d.seg = &chat.Segment{Reasoning: true}
		return nil
	}
	return d.begin(d.p.start, nil)
}

// Mask implements Constraint.
func (d *deferredConstraint) Mask(logits []float32) error {
	if err := d.init(); err != nil {
		return err
	}
	ninf := float32(math.Inf(-1))
	if d.seg != nil {
		if !(d.seg.Reasoning && d.budget > 0 && d.used >= d.budget && d.p.capped != nil) {
			if d.ban == nil {
				for _, id := range d.dv.special {
					if !bytes.Equal(d.bytesOf(id), d.p.closer) {
						d.ban = append(d.ban, id)
					}
				}
			}
			for _, id := range d.ban {
				if int(id) < len(logits) && !(d.seg.Final && d.v.IsEOS(id)) {
					logits[id] = ninf
				}
			}
			return nil
		}
		if err := d.begin(d.p.capped, nil); err != nil { // the budget is spent: close and answer
			return err
		}
	}
	if err := d.inner.Mask(logits); err != nil {
		return err
	}
	if d.inHeader {
		any := false
		for i := range logits {
			if d.dv.headerBan[i>>6]&(1<<(i&63)) != 0 {
				logits[i] = ninf
			} else if logits[i] != ninf {
				any = true
			}
		}
		if !any {
			return errors.New("the grammar allows no token here")
		}
	}
	return nil
}

// Accept implements Constraint.
func (d *deferredConstraint) Accept(tok int32) error {
	if err := d.init(); err != nil {
		return err
	}
	if d.seg != nil {
		if d.v.IsEOS(tok) {
			return nil
		}
		if d.seg.Reasoning {
			d.used++
		}
		d.buf = append(d.buf, d.bytesOf(tok)...)
		i := bytes.Index(d.buf, d.p.closer)
		if i < 0 {
			if k := len(d.p.closer) - 1; len(d.buf) > k {
				d.buf = append(d.buf[:0], d.buf[len(d.buf)-k:]...)
			}
			return nil
		}
		rest := append([]byte(nil), d.buf[i+len(d.p.closer):]...)
		return d.begin(d.p.next, rest)
	}
	if err := d.inner.Accept(tok); err != nil {
		return err
	}
	if d.inner.Done() || len(d.acc) >= maxHead {
		return nil
	}
	d.acc = append(d.acc, d.bytesOf(tok)...)
	if d.inHeader && bytes.Contains(d.acc, d.p.headerEnd) {
		d.inHeader = false
	}
	d.enterFree(d.inner.c)
	return nil
}

// Done implements Constraint.
func (d *deferredConstraint) Done() bool { return d.inner != nil && d.inner.Done() }

// Close stops a mask computation in flight.
func (d *deferredConstraint) Close() {
	if d.inner != nil {
		d.inner.Close()
	}
}

// deferVocabulary computes the deferVocab once.
func (g *Grammars) deferVocabulary(v *grammar.Vocab) *deferVocab {
	g.dvOnce.Do(func() {
		dv := &deferVocab{}
		have := map[string]bool{}
		for id := int32(0); int(id) < v.Size(); id++ {
			if v.TokenBytes(id) != nil {
				continue
			}
			if b := g.Text.TokenBytes(id); len(b) > 0 || v.IsEOS(id) {
				dv.special = append(dv.special, id)
				have[string(b)] = true
			}
		}
		ctrl := g.chatFormat().Controls()
		all := len(ctrl) > 0
		for _, s := range ctrl {
			all = all && have[s]
		}
		if all {
			dv.headerBan = make([]uint64, v.MaskWords())
			for id := int32(0); int(id) < v.Size(); id++ {
				if b := v.TokenBytes(id); b != nil && bytes.ContainsAny(b, "<|") {
					dv.headerBan[id>>6] |= 1 << (id & 63)
				}
			}
		}
		g.dv = dv
	})
	return g.dv
}

// deferred returns the deferred constraint of req (ok false: req is not
// one; the caller goes on as for any model).
func (g *Grammars) deferred(req *gen.Request, st chat.Start) (c Constraint, ok bool, err error) {
	if !req.Chat {
		return nil, false, nil
	}
	tools, forced, err := forcedTools(req)
	if err != nil {
		return nil, false, err
	}
	a := chat.Answer{Forced: forced != "", Parallel: forced != "function" && (req.ParallelToolCalls == nil || *req.ParallelToolCalls),
		AtStart: !req.AddGenerationPrompt, ContinueFinal: req.ContinueFinal, Capped: req.MaxReasoningTokens > 0}
	if forced != "" || toolsOffered(req) {
		a.Tools = chatTools(tools)
	}
	switch rf := req.ResponseFormat; {
	case rf == nil || rf.Type == "text":
	case rf.Type == "json_schema":
		a.Schema = rf.Schema
		if a.Schema == nil {
			a.Schema = []byte{}
		}
	default:
		a.Object = true
	}
	cp, err := g.chatFormat().Plan(a)
	var fe *chat.FieldError
	switch {
	case errors.As(err, &fe):
		return nil, false, openai.Errorf(fe.Field, "%s", fe.Msg)
	case err != nil:
		return nil, false, err
	case cp == nil && a.Capped:
		return nil, false, openai.Errorf("max_reasoning_tokens", "max_reasoning_tokens: this model does not reason before its answer")
	case cp == nil:
		return nil, false, nil
	}
	v, err := g.vocabulary()
	if err != nil {
		return nil, false, fmt.Errorf("grammar vocabulary: %w", err)
	}
	p, err := g.plan(cp)
	if err != nil {
		if cp.Field != "" {
			return nil, false, openai.Errorf(cp.Field, "the answer's grammar: %v", err) // its parts compiled alone
		}
		// the answer's grammar alone names the field at fault
		if _, ferr := g.grammarFor(req); ferr != nil {
			return nil, false, ferr
		}
		return nil, false, fmt.Errorf("the answer after the reasoning: %w", err)
	}
	return &deferredConstraint{p: p, v: v, dv: g.deferVocabulary(v), bytesOf: g.Text.TokenBytes, budget: req.MaxReasoningTokens, open: st.Reasoning}, true, nil
}

// forcedTools returns the tools a forced tool_choice allows ("required":
// all, "function": the named one) and the mode ("" when not forced).
func forcedTools(req *gen.Request) ([]gen.Tool, string, error) {
	tc := req.ToolChoice
	if len(req.Tools) == 0 || tc == nil || (tc.Mode != "required" && tc.Mode != "function") {
		return req.Tools, "", nil
	}
	if tc.Mode == "required" {
		return req.Tools, tc.Mode, nil
	}
	var tools []gen.Tool
	for _, t := range req.Tools {
		if t.Name == tc.Name {
			tools = append(tools, t)
		}
	}
	if len(tools) == 0 {
		return nil, "", openai.Errorf("tool_choice", "tool_choice names function %q, which is not in tools", tc.Name)
	}
	return tools, tc.Mode, nil
}

// choice compiles (cached) a grammar.Choice.
func (g *Grammars) choice(alts []grammar.Alt, space bool) (*grammar.Grammar, error) {
	key, _ := json.Marshal(struct {
		Alts  []grammar.Alt
		Space bool
	}{alts, space})
	return g.compiled("choice"+string(key), func() (*grammar.Grammar, error) { return grammar.Choice(alts, space) })
}

// plan compiles the three grammars of a format's plan.
func (g *Grammars) plan(cp *chat.Plan) (*deferPlan, error) {
	p := &deferPlan{heads: map[string]chat.Segment{}, closer: []byte(cp.Closer)}
	if cp.HeaderEnd != "" {
		p.headerEnd = []byte(cp.HeaderEnd)
	}
	build := func(prefix string, withReasoning bool) (*grammar.Grammar, error) {
		var alts []grammar.Alt
		for h, s := range cp.Free {
			if s.Reasoning && !withReasoning {
				continue
			}
			alts = append(alts, grammar.Alt{Head: prefix + h})
			p.heads[prefix+h] = s
		}
		for _, a := range cp.Answer {
			a.Head = prefix + a.Head
			alts = append(alts, a)
		}
		slices.SortStableFunc(alts, func(a, b grammar.Alt) int { return strings.Compare(a.Head, b.Head) }) // a stable cache key
		return g.choice(alts, cp.Space)
	}
	var err error
	if p.start, err = build(cp.StartPrefix, true); err != nil {
		return nil, err
	}
	if p.next, err = build(cp.NextPrefix, cp.Again); err != nil {
		return nil, err
	}
	if p.capped, err = build(cp.CapPrefix, false); err != nil {
		return nil, err
	}
	return p, nil
}
