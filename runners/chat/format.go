package chat

import (
	"bytes"
	"strings"
	"unicode"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Format is how a model writes what is not plain answer text: tool calls
// (Hermes/Qwen <tool_call>, Llama 3.x JSON, Mistral [TOOL_CALLS],
// gpt-oss's harmony channels) and reasoning (<think>…</think>, harmony's
// analysis channel). Each format is one file of this package
// (hermes.go, llama3.go, mistral.go, harmony.go, think.go) and knows, in
// one place, how to offer tools in the prompt, the grammar of its calls
// (forced, lazy, and deferred past its reasoning), how to parse its
// output whole or streamed, and the control tokens it spells. A model's
// format is picked once, at load (Detect).
type Format interface {
	// String names the format in logs ("hermes", "llama3", "mistral",
	// "harmony", "think+hermes").
	String() string
	// RenderTools renders msgs through t with tools offered (where the
	// template takes no tools, as the format's own convention asks).
	RenderTools(t *Template, msgs []Message, tools []ToolDef, addGenerationPrompt bool) (string, error)
	// Calls is the grammar shape of an answer that is only tool calls
	// (tool_choice "required" or a named function); parallel: more than
	// one. Harmony's calls are constrained by its Plan instead.
	Calls(parallel bool) grammar.CallFormat
	// Lazy is the grammar shape of one call the model opens in a free
	// answer (tool_choice "auto") and what opens it; ok false: such calls
	// are parsed, never constrained.
	Lazy() (f grammar.CallFormat, t Trigger, ok bool)
	// Plan is how a constrained answer of a model that reasons first waits
	// for its reasoning (nil: constrain from the first token, as for any
	// model). Errors that blame a request field are *FieldError.
	Plan(a Answer) (*Plan, error)
	// Start reads the end of a rendered prompt: where the output begins.
	Start(promptTail string) Start
	// NewParser parses one generation; calls: tools were offered, so
	// calls are tool calls (else they are answer text).
	NewParser(calls bool, s Start) Parser
	// Controls are the control tokens the format's constrained headers
	// are spelled with (nil: none); a grammar that writes a header masks
	// plain tokens that could spell them instead.
	Controls() []string
}

// unplanned is embedded by the formats whose constrained answer starts at
// the output's first token and whose calls are spelled in plain text: no
// Plan, nothing to read in the prompt's tail, no control tokens.
type unplanned struct{}

func (unplanned) Plan(Answer) (*Plan, error) { return nil, nil }
func (unplanned) Start(string) Start         { return Start{} }
func (unplanned) Controls() []string         { return nil }

// templateTools is embedded by the formats that offer tools only through the
// template's own tools section.
type templateTools struct{}

func (templateTools) RenderTools(t *Template, msgs []Message, tools []ToolDef, agp bool) (string, error) {
	return t.renderTools(msgs, tools, agp)
}

// Detect picks t's format from its source (nil: the generic Hermes
// prompt): harmony's <|channel|> headers; else the tool-call syntax its
// tools section writes (a template that takes no tools gets the generic
// Hermes prompt, so it is Hermes), wrapped in Think when the template
// reasons in <think>…</think>.
func Detect(t *Template) Format {
	if t == nil {
		return Hermes
	}
	if strings.Contains(t.src, "<|channel|>") {
		return Harmony
	}
	var f Format = Hermes
	switch {
	case !t.nativeTools():
	case strings.Contains(t.src, mistralTag):
		f = Mistral
	case strings.Contains(t.src, hermesOpen):
	case strings.Contains(t.src, pythonTag), strings.Contains(t.src, "<|start_header_id|>"):
		f = Llama3
	}
	if t.thinkTags() {
		return Think(f)
	}
	return f
}

// Start is where a generation's output begins.
type Start struct {
	// Reasoning: the prompt ends inside the reasoning (a template that
	// opens <think> itself), so the output starts as reasoning.
	Reasoning bool
}

// EventKind says what an Event carries.
type EventKind int

// Event kinds.
const (
	Content   EventKind = iota // Text is more answer
	Reasoning                  // Text is more reasoning
	Call                       // a fragment of tool call Index
)

// Event is one piece of a parsed generation: answer text, reasoning
// text, or a fragment of a tool call: its Name on the call's first event,
// then pieces of its arguments text (Args), which concatenate to the
// call's arguments.
type Event struct {
	Kind  EventKind
	Text  string
	Index int
	Name  string
	Args  string
}

// Parser parses one generation as it is decoded, in arbitrary pieces
// (control tokens rendered as text); its events are the same however the
// output is split.
type Parser interface {
	// Add parses more output (done: the last of it) and returns the
	// events it completes.
	Add(s string, done bool) []Event
}

// Trigger says where a lazily constrained call begins in a free answer.
type Trigger struct {
	// Marker opens a call: its grammar starts after it. "": the answer
	// is a call when its first non-space byte is '{' (the grammar starts
	// there).
	Marker string
	// Open and Close delimit a reasoning before the answer ("": none),
	// where a marker opens no call: an output that opens (after white
	// space) with Open, or whose prompt opened it (Start.Reasoning), is
	// watched only after Close. The request's parser is what splits the
	// reasoning off; the scan only skips it.
	Open, Close string
}

// TriggerScan watches a free answer's bytes, as they are generated, for
// its Trigger.
type TriggerScan struct {
	t       Trigger
	skip    int    // skipStart, skipIn, skipOff
	pre     []byte // skipStart, skipIn: what was held
	buf     []byte
	decided bool // Marker "": the first non-space byte was seen
}

const (
	skipStart = iota // nothing but white space yet
	skipIn           // inside the reasoning
	skipOff          // in the answer
)

// NewScan watches an output that begins at s.
func (t Trigger) NewScan(s Start) *TriggerScan {
	ts := &TriggerScan{t: t, skip: skipOff}
	switch {
	case t.Open == "":
	case s.Reasoning:
		ts.skip = skipIn
	default:
		ts.skip = skipStart
	}
	return ts
}

// Feed takes the next token's bytes; fired: a call begins, and rest is
// what of it was generated already (the call grammar starts there).
// After the call, Feed goes on watching the rest of the answer.
func (s *TriggerScan) Feed(b []byte) (rest []byte, fired bool) {
	if s.skip != skipOff {
		if b = s.skipReasoning(b); b == nil {
			return nil, false
		}
	}
	s.buf = append(s.buf, b...)
	if s.t.Marker == "" {
		if s.decided {
			return nil, false
		}
		t := bytes.TrimLeft(s.buf, " \t\r\n")
		if len(t) == 0 {
			return nil, false
		}
		s.decided = true
		rest = append(rest, t...)
		s.buf = s.buf[:0]
		return rest, rest[0] == '{'
	}
	i := bytes.Index(s.buf, []byte(s.t.Marker))
	if i < 0 {
		if k := len(s.t.Marker) - 1; len(s.buf) > k {
			s.buf = append(s.buf[:0], s.buf[len(s.buf)-k:]...)
		}
		return nil, false
	}
	rest = append(rest, s.buf[i+len(s.t.Marker):]...)
	s.buf = s.buf[:0]
	return rest, true
}

// skipReasoning holds b while it may be reasoning; it returns the answer
// bytes once the reasoning is over (nil: none yet).
func (s *TriggerScan) skipReasoning(b []byte) []byte {
	s.pre = append(s.pre, b...)
	if s.skip == skipStart {
		t := bytes.TrimLeftFunc(s.pre, unicode.IsSpace)
		switch {
		case bytes.HasPrefix(t, []byte(s.t.Open)):
			s.skip, s.pre = skipIn, append(s.pre[:0], t[len(s.t.Open):]...)
		case bytes.HasPrefix([]byte(s.t.Open), t):
			return nil // "" or a prefix of the opener: wait
		default:
			s.skip = skipOff // no reasoning: all of it is answer
			out := s.pre
			s.pre = nil
			return out
		}
	}
	i := bytes.Index(s.pre, []byte(s.t.Close))
	if i < 0 {
		if k := len(s.t.Close) - 1; len(s.pre) > k {
			s.pre = append(s.pre[:0], s.pre[len(s.pre)-k:]...)
		}
		return nil
	}
	out := s.pre[i+len(s.t.Close):]
	s.skip, s.pre = skipOff, nil
	if len(out) == 0 {
		return nil
	}
	return out
}

// Answer is what a request asks of a constrained answer.
type Answer struct {
	Tools    []ToolDef // the tools a call may use (nil: no calls)
	Forced   bool      // the answer is calls (tool_choice "required" or named)
	Parallel bool      // more than one call allowed
	Schema   []byte    // response_format json_schema
	Object   bool      // response_format json_object
	// AtStart: the prompt ends after the last message with no generation
	// prompt (the model opens its own turn).
	AtStart       bool
	ContinueFinal bool // the final message is continued
	Capped        bool // max_reasoning_tokens is set
}

func (a Answer) structured() bool { return a.Schema != nil || a.Object }

// strict reports whether a free answer offers a strict tool.
func (a Answer) strict() bool {
	for _, t := range a.Tools {
		if t.Strict {
			return true
		}
	}
	return false
}

// Plan is how the answer of a model that reasons first is constrained
// (runners/decode runs it): a grammar at the start of the output (its
// Free heads open an unconstrained segment), one after each free segment
// closes (Closer), and one forced when the reasoning budget is spent.
// Each grammar is a grammar.Choice of the Free heads and the Answer
// alternatives, every head behind that grammar's prefix.
type Plan struct {
	Free                               map[string]Segment
	Answer                             []grammar.Alt
	StartPrefix, NextPrefix, CapPrefix string
	Again                              bool   // reasoning may resume after a free segment
	Space                              bool   // white space allowed around the answer
	Closer                             string // ends a free segment
	HeaderEnd                          string // ends a header ("": no header masking)
	// Field is blamed when the grammars do not compile ("": the
	// answer's own grammar names the field).
	Field string
}

// Segment is an unconstrained stretch of the output.
type Segment struct {
	Reasoning bool // counts against the reasoning budget
	Final     bool // may end the generation
}

// FieldError is an error that blames a request field.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Msg }

// parsedCall is one tool call read from generated text: Arguments is JSON
// text (an object).
type parsedCall struct {
	Name, Arguments string
}

// plain passes the output through as answer text.
type plain struct{}

func (plain) Add(s string, _ bool) []Event {
	if s == "" {
		return nil
	}
	return []Event{{Kind: Content, Text: s}}
}
