package decode

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// ToolText is a Text that can offer tools to the model and knows its
// chat format (how it writes calls and reasoning); tokText is one. Tools
// and reasoning need it: a Text that is not one is plain Hermes.
type ToolText interface {
	// RenderTools is Render with tools offered (as the format offers
	// them).
	RenderTools(msgs []gen.Message, tools []gen.Tool, addGenerationPrompt, continueFinal bool) (string, error)
	// Format is the model's chat format, detected once at load.
	Format() chat.Format
	// IsSpecial reports control tokens, which constrained output never
	// contains (but where a call format spells one).
	IsSpecial(id int32) bool
}

func (t *tokText) RenderTools(msgs []gen.Message, tools []gen.Tool, agp, continueFinal bool) (string, error) {
	if t.tmpl == nil {
		return "", errors.New("this model has no chat template; use /v1/completions")
	}
	defs := chatTools(tools)
	return renderChat(func(m []chat.Message, agp bool) (string, error) { return t.format.RenderTools(t.tmpl, m, defs, agp) },
		chatMessages(msgs), agp, continueFinal)
}

func (t *tokText) Format() chat.Format     { return t.format }
func (t *tokText) IsSpecial(id int32) bool { return t.tok.IsSpecial(id) }

// formatOf is text's chat format.
func formatOf(text Text) chat.Format {
	if tt, ok := text.(ToolText); ok {
		return tt.Format()
	}
	return chat.Hermes
}

// chatTools are the API's tools as the chat format takes them.
func chatTools(tools []gen.Tool) []chat.ToolDef {
	defs := make([]chat.ToolDef, len(tools))
	for i, tl := range tools {
		defs[i] = chat.ToolDef{Name: tl.Name, Description: tl.Description, Parameters: tl.Parameters, Strict: tl.Strict}
	}
	return defs
}

// toolsOffered reports whether req's tools are shown to the model and its
// output parsed for calls: tools given and tool_choice not "none".
func toolsOffered(req *gen.Request) bool {
	return req.Chat && len(req.Tools) > 0 && (req.ToolChoice == nil || req.ToolChoice.Mode != "none")
}

// Grammars makes Options.NewConstraint for a model: response_format
// json_object / json_schema, and tool_choice "required" or a named
// function, become grammar constraints over the model's vocabulary (built
// on first use). For a model that reasons first (gpt-oss's harmony,
// Qwen3's <think>) the constraint is deferred until the answer begins
// (defer.go).
type Grammars struct {
	Text Text

	once    sync.Once
	vocab   *grammar.Vocab
	err     error
	fmtOnce sync.Once
	format  chat.Format // the Text's

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

// chatFormat is the model's chat format.
func (g *Grammars) chatFormat() chat.Format {
	g.fmtOnce.Do(func() { g.format = formatOf(g.Text) })
	return g.format
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

// NewConstraint implements Options.NewConstraint: st is where the
// output begins (inside the reasoning, when the prompt opened it).
func (g *Grammars) NewConstraint(req *gen.Request, st chat.Start) (Constraint, error) {
	if c, ok, err := g.deferred(req, st); ok || err != nil {
		return c, err
	}
	gr, err := g.grammarFor(req)
	if err != nil {
		return nil, err
	}
	if gr == nil && toolsOffered(req) {
		return g.lazyCalls(req, st)
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

// lazyCalls is tool_choice "auto": the model writes freely, but once it
// opens a tool call (its format's trigger), the call is constrained to an
// offered tool with schema-valid arguments until it is complete. A tool
// whose schema the grammar cannot take is then left unconstrained, unless
// it asks for strict, which is a 400.
func (g *Grammars) lazyCalls(req *gen.Request, st chat.Start) (Constraint, error) {
	f, trig, ok := g.chatFormat().Lazy()
	if !ok {
		return nil, nil // calls are parsed; a strict tool is constrained by the format's Plan (defer.go)
	}
	gt := toolDefs(req.Tools)
	gr, err := g.compiled(cacheKey("lazy", f, gt, nil), func() (*grammar.Grammar, error) { return grammar.ToolCalls(gt, f) })
	if err != nil {
		for i, t := range req.Tools {
			if t.Strict {
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
	single := req.ParallelToolCalls != nil && !*req.ParallelToolCalls
	return &lazyConstraint{g: gr, v: v, bytesOf: g.Text.TokenBytes, scan: trig.NewScan(st), single: single}, nil
}

// lazyConstraint constrains only the tool calls of a free answer: it
// watches the generated bytes for the format's trigger, then applies the
// call grammar until the call is complete, then lets the model write
// freely again (with parallel_tool_calls false, the answer ends there).
type lazyConstraint struct {
	g       *grammar.Grammar
	v       *grammar.Vocab
	bytesOf func(int32) []byte
	scan    *chat.TriggerScan
	inner   *maskConstraint
	single  bool // parallel_tool_calls false: the answer ends with its first call
	done    bool
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
			l.done = l.single
		}
		return nil
	}
	if l.v.IsEOS(tok) {
		return nil
	}
	rest, fired := l.scan.Feed(l.bytesOf(tok))
	if !fired {
		return nil
	}
	c := grammar.NewConstraint(l.g, l.v)
	if c.AdvanceBytes(rest) != nil {
		return nil // already off the grammar: leave it to the parser
	}
	l.inner = newMaskConstraint(c, l.v)
	return nil
}

func (l *lazyConstraint) Done() bool { return l.done }

// Close stops a mask computation in flight.
func (l *lazyConstraint) Close() {
	if l.inner != nil {
		l.inner.Close()
	}
}

func (g *Grammars) grammarFor(req *gen.Request) (*grammar.Grammar, error) {
	tools, forced, err := forcedTools(req)
	if err != nil {
		return nil, err
	}
	rf := req.ResponseFormat
	structured := rf != nil && rf.Type != "text"
	if structured && toolsOffered(req) && forced == "" {
		// auto: a call of an offered tool, or the final answer in the format.
		var schema []byte
		if rf.Type == "json_schema" {
			schema = rf.Schema
		}
		gt, f := toolDefs(req.Tools), g.chatFormat().Calls(req.ParallelToolCalls == nil || *req.ParallelToolCalls)
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
		parallel := forced == "required" && (req.ParallelToolCalls == nil || *req.ParallelToolCalls)
		gt, f := toolDefs(tools), g.chatFormat().Calls(parallel)
		gr, err := g.compiled(cacheKey("calls", f, gt, nil), func() (*grammar.Grammar, error) { return grammar.ToolCalls(gt, f) })
		if err != nil {
			return nil, openai.Errorf("tools", "tools: %v", err)
		}
		return gr, nil
	case structured && rf.Type == "json_object":
		return g.compiled("json_object", func() (*grammar.Grammar, error) { return grammar.AnyJSONObject(), nil })
	case structured && rf.Type == "json_schema":
		gr, err := g.compiled(cacheKey("schema", grammar.CallFormat{}, nil, rf.Schema), func() (*grammar.Grammar, error) {
			return grammar.Compile(rf.Schema)
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

func newCallID() string { return openai.NewID(nil, "call_") }

func toolDefs(tools []gen.Tool) []grammar.Tool {
	gt := make([]grammar.Tool, len(tools))
	for i, t := range tools {
		gt[i] = grammar.Tool{Name: t.Name, Parameters: t.Parameters}
	}
	return gt
}
