package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// ToolText is a Text that can offer tools to the model and knows how its
// family writes calls; tokText is one. Tools need it.
type ToolText interface {
	// RenderTools is Render with tools offered (through the template when
	// it takes them, else the generic prompt).
	RenderTools(msgs []openai.ChatMessage, tools []openai.Tool, addGenerationPrompt, continueFinal bool) (string, error)
	ToolFamily() chat.Family
	// IsSpecial reports control tokens, which constrained output never
	// contains (but where a call format spells one).
	IsSpecial(id int32) bool
}

func (t *tokText) RenderTools(msgs []openai.ChatMessage, tools []openai.Tool, agp, continueFinal bool) (string, error) {
	if t.tmpl == nil {
		return "", errors.New("this model has no chat template; use /v1/completions")
	}
	defs := make([]chat.ToolDef, len(tools))
	for i, tl := range tools {
		defs[i] = chat.ToolDef{Name: tl.Function.Name, Description: tl.Function.Description, Parameters: tl.Function.Parameters}
	}
	return renderChatWith(func(m []chat.Message, agp bool) (string, error) { return t.tmpl.RenderTools(m, defs, agp) },
		ChatMessages(msgs), agp, continueFinal)
}

func (t *tokText) ToolFamily() chat.Family {
	if t.tmpl == nil {
		return chat.Hermes
	}
	return t.tmpl.ToolFamily()
}

func (t *tokText) IsSpecial(id int32) bool { return t.tok.IsSpecial(id) }

// toolsOffered reports whether req's tools are shown to the model and its
// output parsed for calls: tools given and tool_choice not "none".
func toolsOffered(req *openai.GenRequest) bool {
	return req.Chat && len(req.Tools) > 0 && (req.ToolChoice == nil || req.ToolChoice.Mode != "none")
}

// CallFormat is the grammar of family f's calls.
func CallFormat(f chat.Family, parallel bool) grammar.CallFormat {
	switch f {
	case chat.Llama:
		return grammar.CallFormat{ArgsKey: "parameters"} // one call per answer
	case chat.Mistral:
		return grammar.CallFormat{List: true, ListPrefix: "[TOOL_CALLS]", ArgsKey: "arguments", Parallel: parallel}
	}
	return grammar.CallFormat{Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Separator: "\n", ArgsKey: "arguments", Parallel: parallel}
}

// Grammars makes Options.NewConstraint for a model: response_format
// json_object / json_schema, and tool_choice "required" or a named
// function, become grammar constraints over the model's vocabulary (built
// on first use). For a model that reasons first (gpt-oss's harmony,
// Qwen3's <think>) the constraint is deferred until the answer begins
// (defer.go).
type Grammars struct {
	Text Text

	once  sync.Once
	vocab *grammar.Vocab
	err   error

	dvOnce sync.Once
	dv     *deferVocab

	mu    sync.Mutex
	cache map[string]*grammar.Grammar // compiled grammars (and their shared masks) by request shape
	order []string
}

// maxGrammars bounds the compiled grammars kept: an agent sends the same
// tools and formats turn after turn.
const maxGrammars = 8

// compiled returns the grammar for key, building it on a miss (errors are
// not cached).
func (g *Grammars) compiled(key string, build func() (*grammar.Grammar, error)) (*grammar.Grammar, error) {
	g.mu.Lock()
	gr, ok := g.cache[key]
	g.mu.Unlock()
	if ok {
		return gr, nil
	}
	gr, err := build()
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cache == nil {
		g.cache = map[string]*grammar.Grammar{}
	}
	if _, ok := g.cache[key]; !ok {
		if len(g.order) >= maxGrammars {
			delete(g.cache, g.order[0])
			g.order = g.order[1:]
		}
		g.order = append(g.order, key)
	}
	g.cache[key] = gr
	return gr, nil
}

// cacheKey identifies a grammar by what it is compiled from.
func cacheKey(kind string, f grammar.CallFormat, tools []grammar.Tool, schema []byte) string {
	b, _ := json.Marshal(struct {
		Kind   string
		F      grammar.CallFormat
		Tools  []grammar.Tool
		Schema []byte
	}{kind, f, tools, schema})
	return string(b)
}

func (g *Grammars) vocabulary() (*grammar.Vocab, error) {
	g.once.Do(func() {
		var special func(int32) bool
		if tt, ok := g.Text.(ToolText); ok {
			special = tt.IsSpecial
		}
		g.vocab, g.err = grammar.NewVocab(g.Text.VocabSize(), g.Text.TokenBytes, special, g.Text.EOS())
	})
	return g.vocab, g.err
}

// Warm builds the vocabulary trie now (a fraction of a second for a
// 150k vocabulary) rather than on the first constrained request.
func (g *Grammars) Warm() error {
	v, err := g.vocabulary()
	if err == nil {
		g.deferVocabulary(v) // the control tokens a deferred grammar masks
	}
	return err
}

// NewConstraint implements Options.NewConstraint.
func (g *Grammars) NewConstraint(req *openai.GenRequest) (Constraint, error) {
	if c, ok, err := g.deferred(req); ok || err != nil {
		return c, err
	}
	gr, err := g.grammarFor(req)
	if err != nil {
		return nil, err
	}
	if gr == nil && toolsOffered(req) {
		return g.lazyCalls(req)
	}
	if gr == nil {
		return nil, nil
	}
	v, err := g.vocabulary()
	if err != nil {
		return nil, fmt.Errorf("grammar vocabulary: %w", err)
	}
	return newMaskConstraint(grammar.NewConstraint(gr, v), v), nil
}

func (g *Grammars) family() chat.Family {
	if tt, ok := g.Text.(ToolText); ok {
		return tt.ToolFamily()
	}
	return chat.Hermes
}

// lazyCalls is tool_choice "auto": the model writes freely, but once it
// opens a tool call (its family's marker), the call is constrained to an
// offered tool with schema-valid arguments until it is complete. A tool
// whose schema the grammar cannot take is then left unconstrained, unless
// it asks for strict, which is a 400.
func (g *Grammars) lazyCalls(req *openai.GenRequest) (Constraint, error) {
	fam := g.family()
	if fam == chat.Harmony {
		return nil, nil // calls are parsed; a strict tool is constrained by the deferred plan (defer.go)
	}
	var f grammar.CallFormat
	marker := ""
	switch fam {
	case chat.Llama:
		f = grammar.CallFormat{ArgsKey: "parameters"}
	case chat.Mistral:
		f, marker = grammar.CallFormat{List: true, ArgsKey: "arguments", Parallel: true}, "[TOOL_CALLS]"
	default:
		f, marker = grammar.CallFormat{Suffix: "\n</tool_call>", ArgsKey: "arguments"}, "<tool_call>"
	}
	gt := toolDefs(req.Tools)
	gr, err := g.compiled(cacheKey("lazy", f, gt, nil), func() (*grammar.Grammar, error) { return grammar.ToolCalls(gt, f) })
	if err != nil {
		for i, t := range req.Tools {
			if t.Function.Strict != nil && *t.Function.Strict {
				if _, e := grammar.ToolCalls(gt[i:i+1], f); e != nil {
					return nil, openai.Errorf(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d] is strict but its schema cannot be enforced: %v", i, e)
				}
			}
		}
		return nil, nil // not strict: calls are parsed, not constrained
	}
	v, err := g.vocabulary()
	if err != nil {
		return nil, fmt.Errorf("grammar vocabulary: %w", err)
	}
	return &lazyConstraint{g: gr, v: v, bytesOf: g.Text.TokenBytes, marker: marker}, nil
}

// lazyConstraint constrains only the tool calls of a free answer: it
// watches the generated bytes for the family's marker (Llama: a first
// non-space byte '{'), then applies the call grammar until the call is
// complete, then lets the model write freely again.
type lazyConstraint struct {
	g       *grammar.Grammar
	v       *grammar.Vocab
	bytesOf func(int32) []byte
	marker  string
	buf     []byte
	decided bool // Llama: the first non-space byte was seen
	inner   *maskConstraint
	// think: the model reasons in <think>…</think> first (Qwen3); a
	// marker inside the reasoning is not a call, so only the answer text
	// is watched.
	think *chat.ThinkParser
}

func (l *lazyConstraint) Mask(logits []float32) error {
	if l.inner == nil {
		return nil
	}
	return l.inner.Mask(logits)
}

func (l *lazyConstraint) Accept(tok int32) error {
	if l.inner != nil {
		if err := l.inner.Accept(tok); err != nil {
			l.inner.Close()
			l.inner = nil
			return nil // e.g. an end token the mask allowed: generation ends anyway
		}
		if l.inner.c.CanEnd() {
			l.inner.Close()
			l.inner = nil
		}
		return nil
	}
	if l.v.IsEOS(tok) {
		return nil
	}
	b := l.bytesOf(tok)
	if l.think != nil {
		_, answer := l.think.Feed(string(b))
		b = []byte(answer)
	}
	l.buf = append(l.buf, b...)
	var rest []byte
	switch {
	case l.marker == "":
		if l.decided {
			return nil
		}
		t := bytes.TrimLeft(l.buf, " \t\r\n")
		if len(t) == 0 {
			return nil
		}
		l.decided = true
		if t[0] != '{' {
			return nil
		}
		rest = t
	default:
		i := bytes.Index(l.buf, []byte(l.marker))
		if i < 0 {
			if k := len(l.marker) - 1; len(l.buf) > k {
				l.buf = append(l.buf[:0], l.buf[len(l.buf)-k:]...)
			}
			return nil
		}
		rest = l.buf[i+len(l.marker):]
	}
	c := grammar.NewConstraint(l.g, l.v)
	l.buf = l.buf[:0]
	if c.AdvanceBytes(rest) != nil {
		return nil // already off the grammar: leave it to the parser
	}
	l.inner = newMaskConstraint(c, l.v)
	return nil
}

func (l *lazyConstraint) Done() bool { return false }

// Close stops a mask computation in flight.
func (l *lazyConstraint) Close() {
	if l.inner != nil {
		l.inner.Close()
	}
}

func (g *Grammars) grammarFor(req *openai.GenRequest) (*grammar.Grammar, error) {
	forced := ""
	if tc := req.ToolChoice; len(req.Tools) > 0 && tc != nil && (tc.Mode == "required" || tc.Mode == "function") {
		forced = tc.Mode
	}
	rf := req.ResponseFormat
	structured := rf != nil && rf.Type != "text"
	if structured && toolsOffered(req) && forced == "" {
		// auto: a call of an offered tool, or the final answer in the format.
		var schema []byte
		if rf.Type == "json_schema" {
			schema = rf.JSONSchema.Schema
		}
		gt, f := toolDefs(req.Tools), CallFormat(g.family(), req.ParallelToolCalls == nil || *req.ParallelToolCalls)
		if schema == nil {
			schema = []byte{} // json_object: distinct from json_schema in the key
		}
		gr, err := g.compiled(cacheKey("or", f, gt, schema), func() (*grammar.Grammar, error) {
			if len(schema) == 0 {
				return grammar.ToolCallsOr(gt, f, nil)
			}
			return grammar.ToolCallsOr(gt, f, schema)
		})
		if err != nil {
			return nil, openai.Errorf("response_format", "tools with response_format: %v", err)
		}
		return gr, nil
	}
	switch {
	case forced != "":
		tools := req.Tools
		if forced == "function" {
			tools = nil
			for _, t := range req.Tools {
				if t.Function.Name == req.ToolChoice.Name {
					tools = append(tools, t)
				}
			}
			if len(tools) == 0 {
				return nil, openai.Errorf("tool_choice", "tool_choice names function %q, which is not in tools", req.ToolChoice.Name)
			}
		}
		parallel := forced == "required" && (req.ParallelToolCalls == nil || *req.ParallelToolCalls)
		gt, f := toolDefs(tools), CallFormat(g.family(), parallel)
		gr, err := g.compiled(cacheKey("calls", f, gt, nil), func() (*grammar.Grammar, error) { return grammar.ToolCalls(gt, f) })
		if err != nil {
			return nil, openai.Errorf("tools", "tools: %v", err)
		}
		return gr, nil
	case structured && rf.Type == "json_object":
		return g.compiled("json_object", func() (*grammar.Grammar, error) { return grammar.AnyJSONObject(), nil })
	case structured && rf.Type == "json_schema":
		gr, err := g.compiled(cacheKey("schema", grammar.CallFormat{}, nil, rf.JSONSchema.Schema), func() (*grammar.Grammar, error) {
			return grammar.Compile(rf.JSONSchema.Schema)
		})
		if err != nil {
			return nil, openai.Errorf("response_format.json_schema.schema", "response_format.json_schema.schema: %v", err)
		}
		return gr, nil
	}
	return nil, nil
}

// maskConstraint applies a grammar.Constraint to logits. After each
// Accept it starts computing the next step's mask on another goroutine,
// so that the mask is made while the backend computes the step's logits.
type maskConstraint struct {
	c    *grammar.Constraint
	v    *grammar.Vocab
	mask []uint64
	next chan struct{} // closed when mask holds the next step's mask; nil: compute on demand
}

func newMaskConstraint(c *grammar.Constraint, v *grammar.Vocab) *maskConstraint {
	m := &maskConstraint{c: c, v: v, mask: make([]uint64, v.MaskWords())}
	m.prefetch()
	return m
}

func (m *maskConstraint) prefetch() {
	done := make(chan struct{})
	m.next = done
	go func() {
		defer close(done)
		m.c.Mask(m.mask)
	}()
}

// Mask implements Constraint.
func (m *maskConstraint) Mask(logits []float32) error {
	if m.next == nil {
		m.c.Mask(m.mask)
	} else {
		<-m.next
		m.next = nil
	}
	ninf := float32(math.Inf(-1))
	any := false
	for i := range logits {
		if i >= m.v.Size() || m.mask[i>>6]&(1<<(i&63)) == 0 {
			logits[i] = ninf
		} else {
			any = true
		}
	}
	if !any {
		return errors.New("the grammar allows no token here")
	}
	return nil
}

// Accept implements Constraint.
func (m *maskConstraint) Accept(tok int32) error {
	if m.next != nil { // Accept without Mask: drop the prefetched mask
		<-m.next
		m.next = nil
	}
	if err := m.c.Accept(tok); err != nil {
		return err
	}
	if !m.c.Done() {
		m.prefetch()
	}
	return nil
}

// Done implements Constraint.
func (m *maskConstraint) Done() bool { return m.c.Done() }

// Close waits for a prefetch in flight (the generation ended early).
func (m *maskConstraint) Close() {
	if m.next != nil {
		<-m.next
		m.next = nil
	}
}

// toolEmitter parses tool calls out of the text a generation emits and
// forwards text and calls (with fresh call ids) to the request's emitter.
type toolEmitter struct {
	openai.Emitter
	calls openai.ToolCallEmitter // nil: the API cannot take calls
	ts    *chat.ToolStream
}

func newToolEmitter(em openai.Emitter, f chat.Family) *toolEmitter {
	te := &toolEmitter{Emitter: em, ts: chat.NewToolStream(f)}
	te.calls, _ = em.(openai.ToolCallEmitter)
	return te
}

// Text implements openai.Emitter.
func (t *toolEmitter) Text(s string, lp *openai.TokenLogprob) error {
	return t.forward(t.ts.Push(s), lp)
}

// finish flushes what the parser held back; it returns the number of
// tool calls made.
func (t *toolEmitter) finish() (int, error) {
	err := t.forward(t.ts.Finish(), nil)
	return t.ts.Calls(), err
}

func (t *toolEmitter) forward(ev []chat.ToolEvent, lp *openai.TokenLogprob) error {
	for _, e := range ev {
		if e.Index < 0 {
			if err := t.Emitter.Text(e.Text, lp); err != nil {
				return err
			}
			lp = nil
			continue
		}
		if t.calls == nil {
			return errors.New("this API cannot return tool calls")
		}
		id := ""
		if e.Name != "" {
			id = newCallID()
		}
		if err := t.calls.ToolCall(e.Index, id, e.Name, e.Args); err != nil {
			return err
		}
	}
	if lp != nil {
		return t.Emitter.Text("", lp)
	}
	return nil
}

func newCallID() string { return openai.NewID(nil, "call_") }

func toolDefs(tools []openai.Tool) []grammar.Tool {
	gt := make([]grammar.Tool, len(tools))
	for i, t := range tools {
		gt[i] = grammar.Tool{Name: t.Function.Name, Parameters: t.Function.Parameters}
	}
	return gt
}
