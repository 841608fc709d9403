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
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Deferred grammars: a model that reasons before it answers (gpt-oss's
// harmony analysis channel, Qwen3's <think>…</think>) must be free to
// reason, and constrained only once its answer begins, as vLLM and
// llama.cpp's server do. A deferPlan says how: a grammar at the start of
// the output, one after each free segment closes, and one forced when the
// reasoning budget is spent. Each grammar is a grammar.Choice whose
// head-only alternatives open a free segment (the reasoning; for harmony
// in tool_choice "auto" also the final answer and preambles) and whose
// other alternatives are the constrained answer with its header.
//
// Harmony (the prompt ends with "<|start|>assistant"):
//
//	start:  <|channel|>analysis<|message|>                            → free reasoning until <|end|>
//	        <|channel|>final<|message|>{document}                     (response_format; or
//	        <|channel|>final <|constrain|>json<|message|>{document}    with the content type)
//	        <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}
//	                                                                  (an offered tool; named: that one)
//	next:   an answer alternative, after "<|start|>assistant" (tool_choice
//	        "auto" without response_format: the analysis again too)
//	capped: "<|end|><|start|>assistant" then an answer alternative (no more reasoning)
//
// then an end token (<|return|>, <|call|>). Inside a header, plain tokens
// with '<' or '|' are masked when the vocabulary has harmony's control
// tokens, so a header is spelled with them, as the model was trained.
// Qwen3 (the prompt may itself open <think>):
//
//	start:  <think>                 → free reasoning until </think>
//	        the answer              (no reasoning: constrained at once)
//	next:   the answer (after </think>; white space first allowed)
//	capped: "</think>\n\n" then the answer
//
// In a reasoning segment end tokens and control tokens other than the
// closer are masked: the answer always comes (max_tokens still caps the
// whole generation, in which case it is cut off, finish_reason "length").
type deferPlan struct {
	start, next, capped *grammar.Grammar
	heads               map[string]segment // free segments by the head that opens them
	closer              []byte             // ends a free segment
	headerEnd           []byte             // harmony: "<|message|>" ends a header (nil: no header masking)
}

// segment is an unconstrained stretch of the output.
type segment struct {
	reasoning bool // counts against the reasoning budget (max_reasoning_tokens)
	final     bool // may end the generation (end tokens allowed)
}

// deferVocab is what a deferred constraint needs of the vocabulary beyond
// the grammar's trie, computed once per model.
type deferVocab struct {
	special   []int32  // control tokens (left out of the trie), end tokens included
	headerBan []uint64 // plain tokens with '<' or '|' (nil: not harmony, or its control tokens are not special)
}

// deferredConstraint runs a deferPlan for one generation.
type deferredConstraint struct {
	p       *deferPlan
	v       *grammar.Vocab
	dv      *deferVocab
	bytesOf func(int32) []byte
	budget  int // reasoning tokens before the close is forced (0: no bound)

	seg      *segment // in a free segment
	used     int      // reasoning tokens so far
	buf      []byte   // free: the tail of the segment, for the closer
	acc      []byte   // constrained: the bytes since the grammar began (up to maxHead)
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
		d.seg = &segment{reasoning: true}
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
		if !(d.seg.reasoning && d.budget > 0 && d.used >= d.budget && d.p.capped != nil) {
			if d.ban == nil {
				for _, id := range d.dv.special {
					if !bytes.Equal(d.bytesOf(id), d.p.closer) {
						d.ban = append(d.ban, id)
					}
				}
			}
			for _, id := range d.ban {
				if int(id) < len(logits) && !(d.seg.final && d.v.IsEOS(id)) {
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
		if d.seg.reasoning {
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

// Harmony's control strings.
const (
	harmonyStart     = "<|start|>assistant"
	harmonyAnalysis  = "<|channel|>analysis<|message|>"
	harmonyFinal     = "<|channel|>final<|message|>"
	harmonyFinalJSON = "<|channel|>final <|constrain|>json<|message|>" // as gpt-oss may write it for a response format
	harmonyPreamble  = "<|channel|>commentary<|message|>"
	harmonyEnd       = "<|end|>"
	harmonyHeaderEnd = "<|message|>"
)

// harmonyCallHead is the header of a call of name, as the harmony format
// writes it (recipient in the channel, then the content type).
func harmonyCallHead(name string) string {
	return "<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>"
}

// harmonyName reports whether name can stand in a harmony header
// (recipient functions.NAME, which ends at white space or a control token).
func harmonyName(name string) bool {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return name != ""
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
		harmony := g.family() == chat.Harmony
		for _, s := range harmonyControls() {
			harmony = harmony && have[s]
		}
		if harmony {
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

func harmonyControls() []string {
	return []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"}
}

// deferred returns the deferred constraint of req (ok false: req is not
// one; the caller goes on as for any model).
func (g *Grammars) deferred(req *openai.GenRequest) (c Constraint, ok bool, err error) {
	if !req.Chat {
		return nil, false, nil
	}
	fam := g.family()
	rt, _ := g.Text.(ReasoningText)
	harmony := fam == chat.Harmony
	think := !harmony && rt != nil && rt.ThinkTags()
	tools, forced, err := forcedTools(req)
	if err != nil {
		return nil, false, err
	}
	rf := req.ResponseFormat
	structured := rf != nil && rf.Type != "text"
	strictAuto := false
	if toolsOffered(req) && forced == "" {
		for _, t := range req.Tools {
			strictAuto = strictAuto || t.Function.Strict != nil && *t.Function.Strict
		}
	}
	capped := req.MaxReasoningTokens > 0
	switch {
	case harmony && (forced != "" || structured || strictAuto || capped):
	case think && (forced != "" || structured):
	case capped && think:
		return nil, false, openai.Errorf("max_reasoning_tokens", "max_reasoning_tokens applies to this model only with response_format or tool_choice \"required\" or a named function")
	case capped:
		return nil, false, openai.Errorf("max_reasoning_tokens", "max_reasoning_tokens: this model does not reason before its answer")
	default:
		return nil, false, nil
	}
	if req.ContinueFinal {
		if harmony || capped {
			return nil, false, openai.Errorf("continue_final_message", "a continued final message cannot be constrained after reasoning on this model; leave out continue_final_message, or response_format, tool_choice and max_reasoning_tokens")
		}
		return nil, false, nil // Qwen3: constrained from the first token, as for any model
	}
	v, err := g.vocabulary()
	if err != nil {
		return nil, false, fmt.Errorf("grammar vocabulary: %w", err)
	}
	var p *deferPlan
	if harmony {
		p, err = g.harmonyPlan(req, tools, forced != "", structured)
	} else if p, err = g.thinkPlan(req, tools, forced); err != nil {
		// the answer's grammar alone names the field at fault
		if _, ferr := g.grammarFor(req); ferr != nil {
			return nil, false, ferr
		}
	}
	if err != nil {
		return nil, false, err
	}
	return &deferredConstraint{p: p, v: v, dv: g.deferVocabulary(v), bytesOf: g.Text.TokenBytes, budget: req.MaxReasoningTokens}, true, nil
}

// forcedTools returns the tools a forced tool_choice allows ("required":
// all, "function": the named one) and the mode ("" when not forced).
func forcedTools(req *openai.GenRequest) ([]openai.Tool, string, error) {
	tc := req.ToolChoice
	if len(req.Tools) == 0 || tc == nil || (tc.Mode != "required" && tc.Mode != "function") {
		return req.Tools, "", nil
	}
	if tc.Mode == "required" {
		return req.Tools, tc.Mode, nil
	}
	var tools []openai.Tool
	for _, t := range req.Tools {
		if t.Function.Name == tc.Name {
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

// plan compiles the three grammars of a plan from its answer
// alternatives (each head without prefix) and free heads; again: the
// reasoning may be resumed after a free segment closes.
func (g *Grammars) plan(free map[string]segment, answer []grammar.Alt, startPrefix, nextPrefix, capPrefix string, again, space bool, closer, headerEnd string) (*deferPlan, error) {
	p := &deferPlan{heads: map[string]segment{}, closer: []byte(closer)}
	if headerEnd != "" {
		p.headerEnd = []byte(headerEnd)
	}
	build := func(prefix string, withReasoning bool) (*grammar.Grammar, error) {
		var alts []grammar.Alt
		for h, s := range free {
			if s.reasoning && !withReasoning {
				continue
			}
			alts = append(alts, grammar.Alt{Head: prefix + h})
			p.heads[prefix+h] = s
		}
		for _, a := range answer {
			a.Head = prefix + a.Head
			alts = append(alts, a)
		}
		slices.SortStableFunc(alts, func(a, b grammar.Alt) int { return strings.Compare(a.Head, b.Head) }) // a stable cache key
		return g.choice(alts, space)
	}
	var err error
	if p.start, err = build(startPrefix, true); err != nil {
		return nil, err
	}
	if p.next, err = build(nextPrefix, again); err != nil {
		return nil, err
	}
	if p.capped, err = build(capPrefix, false); err != nil {
		return nil, err
	}
	return p, nil
}

// harmonyPlan: see deferPlan.
func (g *Grammars) harmonyPlan(req *openai.GenRequest, tools []openai.Tool, forced, structured bool) (*deferPlan, error) {
	free := map[string]segment{harmonyAnalysis: {reasoning: true}}
	var answer []grammar.Alt
	if forced || toolsOffered(req) {
		for i, t := range tools {
			if !harmonyName(t.Function.Name) {
				return nil, openai.Errorf(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name %q: a constrained harmony call needs a name of letters, digits, '_', '-' and '.'", i, t.Function.Name)
			}
			a := grammar.Alt{Head: harmonyCallHead(t.Function.Name), Schema: t.Function.Parameters, Object: len(t.Function.Parameters) == 0}
			if a.Object {
				a.Schema = nil
			} else if _, err := grammar.Compile(a.Schema); err != nil {
				strict := t.Function.Strict != nil && *t.Function.Strict
				if forced || strict {
					return nil, openai.Errorf(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d]: its schema cannot be enforced: %v", i, err)
				}
				free[a.Head] = segment{final: true} // not strict: a free call, parsed (it ends with <|call|>)
				continue
			}
			answer = append(answer, a)
		}
	}
	switch rf := req.ResponseFormat; {
	case structured && rf.Type == "json_schema":
		if _, err := grammar.Compile(rf.JSONSchema.Schema); err != nil {
			return nil, openai.Errorf("response_format.json_schema.schema", "response_format.json_schema.schema: %v", err)
		}
		for _, h := range []string{harmonyFinal, harmonyFinalJSON} {
			answer = append(answer, grammar.Alt{Head: h, Schema: rf.JSONSchema.Schema})
		}
	case structured:
		for _, h := range []string{harmonyFinal, harmonyFinalJSON} {
			answer = append(answer, grammar.Alt{Head: h, Object: true})
		}
	case !forced:
		free[harmonyFinal] = segment{final: true}
		free[harmonyPreamble] = segment{}
	}
	// With a constrained answer, the reasoning is one analysis message
	// (then the answer's header is forced); in "auto" the model may go
	// back to analysis after a preamble or a free call.
	again := !forced && !structured
	start := "" // the prompt ends with "<|start|>assistant"
	if !req.AddGenerationPrompt {
		start = harmonyStart // it ends after the last message: the model opens its own
	}
	p, err := g.plan(free, answer, start, harmonyStart, harmonyEnd+harmonyStart, again, false, harmonyEnd, harmonyHeaderEnd)
	if err != nil {
		return nil, openai.Errorf("tools", "the answer's grammar: %v", err) // its parts compiled alone above
	}
	return p, nil
}

// thinkPlan: see deferPlan.
func (g *Grammars) thinkPlan(req *openai.GenRequest, tools []openai.Tool, forced string) (*deferPlan, error) {
	var body grammar.Alt
	if forced != "" || toolsOffered(req) {
		parallel := (forced == "" || forced == "required") && (req.ParallelToolCalls == nil || *req.ParallelToolCalls)
		body.Tools, body.Format = toolDefs(tools), CallFormat(g.family(), parallel)
	}
	if rf := req.ResponseFormat; forced == "" && rf.Type == "json_schema" {
		body.Schema = rf.JSONSchema.Schema
	} else if forced == "" {
		body.Object = true
	}
	p := &deferPlan{heads: map[string]segment{"<think>": {reasoning: true}}, closer: []byte("</think>")}
	var err error
	// at the start: reasoning, or the answer at once
	if p.start, err = g.choice([]grammar.Alt{{Head: "<think>"}, body}, true); err == nil {
		// after </think>: the answer
		if p.next, err = g.choice([]grammar.Alt{body}, true); err == nil {
			// at the budget the reasoning is closed first
			body.Head = "</think>\n\n"
			p.capped, err = g.choice([]grammar.Alt{body}, true)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the answer after the reasoning: %w", err) // grammarFor compiled the same schemas
	}
	return p, nil
}
