package chat

import (
	"strings"
	"unicode"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Models whose template is Qwen3's reason before answering inside
// <think>…</think> at the start of their output (the template strips it
// from past turns and reads message.reasoning_content instead).
// Their parser splits such a generation, fed in arbitrary pieces, into
// reasoning (OpenAI's reasoning_content, as vLLM's qwen3 reasoning parser
// returns it) and answer text, the same however it is split:
//
//   - output that opens (after white space) with <think>, or any output
//     when the prompt already opened it (Open): up to </think> is
//     reasoning, without the newlines around it (as the template writes
//     it back); the answer after it loses its leading white space;
//   - a generation that ends inside the reasoning (a length limit) is all
//     reasoning;
//   - output that does not open with <think> is all answer, unchanged.
//
// Think is the format of a model that reasons in <think>…</think>
// before an answer whose tool calls are written in calls' format
// (Qwen3: Think(Hermes)).
func Think(calls Format) Format { return think{calls} }

type think struct{ calls Format }

func (f think) String() string { return "think+" + f.calls.String() }

func (f think) RenderTools(t *Template, msgs []Message, tools []ToolDef, agp bool) (string, error) {
	return f.calls.RenderTools(t, msgs, tools, agp)
}

func (f think) Calls(parallel bool) grammar.CallFormat { return f.calls.Calls(parallel) }

func (f think) Lazy() (grammar.CallFormat, Trigger, bool) {
	cf, t, ok := f.calls.Lazy()
	t.Open, t.Close = thinkOpen, thinkClose
	return cf, t, ok
}

func (f think) Controls() []string { return f.calls.Controls() }

// Start: the template opened <think> itself (its generation prompt ends
// with it), so the output starts as reasoning.
func (think) Start(promptTail string) Start {
	return Start{Reasoning: strings.HasSuffix(strings.TrimRightFunc(promptTail, unicode.IsSpace), thinkOpen)}
}

func (f think) NewParser(calls bool, s Start) Parser {
	return &thinkParser{split: thinkSplit{Open: s.Reasoning}, answer: f.calls.NewParser(calls, Start{})}
}

// Plan: the answer is constrained after the reasoning:
//
//	start:  <think>                 → free reasoning until </think>
//	        the answer              (no reasoning: constrained at once)
//	next:   the answer (after </think>; white space first allowed)
//	capped: "</think>\n\n" then the answer
//
// A continued final message is constrained from its first token, as for
// any model.
func (f think) Plan(a Answer) (*Plan, error) {
	if !a.Forced && !a.structured() {
		if a.Capped {
			return nil, &FieldError{"max_reasoning_tokens", "max_reasoning_tokens applies to this model only with response_format or tool_choice \"required\" or a named function"}
		}
		return nil, nil
	}
	if a.ContinueFinal {
		if a.Capped {
			return nil, &FieldError{"continue_final_message", "a continued final message cannot be constrained after reasoning on this model; leave out continue_final_message, or response_format, tool_choice and max_reasoning_tokens"}
		}
		return nil, nil
	}
	var body grammar.Alt
	if len(a.Tools) > 0 {
		body.Tools, body.Format = grammarTools(a.Tools), f.calls.Calls(a.Parallel)
	}
	switch {
	case a.Forced:
	case a.Schema != nil:
		body.Schema = a.Schema
	default:
		body.Object = true
	}
	return &Plan{Free: map[string]Segment{thinkOpen: {Reasoning: true}}, Answer: []grammar.Alt{body},
		CapPrefix: thinkClose + "\n\n", Space: true, Closer: thinkClose}, nil
}

// grammarTools are tools as the grammar takes them.
func grammarTools(tools []ToolDef) []grammar.Tool {
	gt := make([]grammar.Tool, len(tools))
	for i, t := range tools {
		gt[i] = grammar.Tool{Name: t.Name, Parameters: t.Parameters}
	}
	return gt
}

// thinkParser splits the reasoning off, then parses the answer for calls.
type thinkParser struct {
	split  thinkSplit
	answer Parser
}

func (p *thinkParser) Add(s string, done bool) []Event {
	r, c := p.split.Feed(s)
	if done {
		fr, fc := p.split.Flush()
		r, c = r+fr, c+fc
	}
	var ev []Event
	if r != "" {
		ev = append(ev, Event{Kind: Reasoning, Text: r})
	}
	if c != "" || done {
		ev = append(ev, p.answer.Add(c, done)...)
	}
	return ev
}

type thinkSplit struct {
	// Open: the prompt ends inside <think> (the template opened it), so
	// the output starts as reasoning.
	Open bool

	state   int    // thinkStart, thinkIn, thinkAfter, thinkPlain
	buf     string // undecided text
	started bool   // thinkIn: reasoning text has been emitted
}

const (
	thinkStart = iota // nothing but white space yet
	thinkIn           // inside <think>
	thinkAfter        // after </think>, before the answer's first non-space
	thinkPlain        // answer text, passed through
)

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

// thinkTags reports whether the template is of a model that reasons in
// <think>…</think> and takes that reasoning back as reasoning_content
// (Qwen3's templates).
func (t *Template) thinkTags() bool {
	return strings.Contains(t.src, thinkOpen) && strings.Contains(t.src, "reasoning_content")
}

// Feed parses more output and returns the reasoning and answer text it
// completes (reasoning always comes first in the output).
func (p *thinkSplit) Feed(s string) (reasoning, content string) {
	p.buf += s
	var r, c strings.Builder
	for {
		switch p.state {
		case thinkStart:
			if p.Open {
				p.state = thinkIn
				continue
			}
			t := strings.TrimLeftFunc(p.buf, unicode.IsSpace)
			switch {
			case strings.HasPrefix(t, thinkOpen):
				p.buf, p.state = t[len(thinkOpen):], thinkIn
				continue
			case strings.HasPrefix(thinkOpen, t):
				return r.String(), c.String() // "" or a prefix of <think>: wait
			}
			p.state = thinkPlain
			continue
		case thinkIn:
			if !p.started {
				p.buf = strings.TrimLeft(p.buf, "\n")
			}
			if i := strings.Index(p.buf, thinkClose); i >= 0 {
				r.WriteString(strings.TrimRight(p.buf[:i], "\n"))
				p.buf, p.state = p.buf[i+len(thinkClose):], thinkAfter
				continue
			}
			// Hold back a possible start of </think> and trailing newlines
			// (they end the reasoning if </think> follows).
			keep := heldPrefix(p.buf, thinkClose)
			body := p.buf[:len(p.buf)-keep]
			emit := strings.TrimRight(body, "\n")
			r.WriteString(emit)
			if emit != "" {
				p.started = true
			}
			p.buf = p.buf[len(emit):]
			return r.String(), c.String()
		case thinkAfter:
			p.buf = strings.TrimLeftFunc(p.buf, unicode.IsSpace)
			if p.buf == "" {
				return r.String(), c.String()
			}
			p.state = thinkPlain
			continue
		default: // thinkPlain
			c.WriteString(p.buf)
			p.buf = ""
			return r.String(), c.String()
		}
	}
}

// Flush ends the generation: what was held back is reasoning inside an
// unfinished <think>, and answer text otherwise.
func (p *thinkSplit) Flush() (reasoning, content string) {
	b := p.buf
	p.buf = ""
	switch p.state {
	case thinkIn:
		return strings.TrimRight(b, "\n"), ""
	case thinkAfter:
		return "", ""
	}
	return "", b
}
