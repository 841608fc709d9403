package chat

import (
	"fmt"
	"strings"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Harmony is gpt-oss's response format: the model writes messages of the
// form
//
//	<|channel|>analysis<|message|>…reasoning…<|end|>
//	<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
//	<|start|>assistant<|channel|>final<|message|>…answer…<|return|>
//
// (the prompt ends with "<|start|>assistant", so the first message's
// header starts at <|channel|>). Its parser splits such a generation
// (special tokens rendered as text) into reasoning (the analysis channel:
// OpenAI's reasoning_content, as vLLM and llama.cpp return it), content
// (the final channel) and tool calls (messages addressed
// to=functions.NAME, each emitted whole when its message ends). When no
// tools were offered, a call the model writes anyway is answer text (as
// vLLM returns such a message's body as content).
var Harmony Format = harmony{}

type harmony struct{}

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

var harmonyTokens = []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}

func (harmony) String() string { return "harmony" }

func (harmony) RenderTools(t *Template, msgs []Message, tools []ToolDef, agp bool) (string, error) {
	return t.renderTools(msgs, tools, agp)
}

// Calls is not used: every constrained harmony answer has a Plan.
func (harmony) Calls(bool) grammar.CallFormat { return grammar.CallFormat{} }

// Lazy: calls in "auto" are parsed; a strict tool is constrained by the
// Plan.
func (harmony) Lazy() (grammar.CallFormat, Trigger, bool) {
	return grammar.CallFormat{}, Trigger{}, false
}

func (harmony) Start(string) Start { return Start{} }

// Controls: a header is spelled with these (when the vocabulary has them
// all as control tokens, the plain tokens that could spell them are
// masked inside a constrained header).
func (harmony) Controls() []string {
	return []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"}
}

func (harmony) NewParser(calls bool, _ Start) Parser { return &harmonyParser{calls: calls} }

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

// Plan: a harmony answer is constrained past the analysis channel:
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
// then an end token (<|return|>, <|call|>). In "auto" without
// response_format the final answer and preambles are free too, and a
// plan is made only for a strict tool or a reasoning budget.
func (harmony) Plan(a Answer) (*Plan, error) {
	if !(a.Forced || a.structured() || a.strict() || a.Capped) {
		return nil, nil
	}
	if a.ContinueFinal {
		return nil, &FieldError{"continue_final_message", "a continued final message cannot be constrained after reasoning on this model; leave out continue_final_message, or response_format, tool_choice and max_reasoning_tokens"}
	}
	free := map[string]Segment{harmonyAnalysis: {Reasoning: true}}
	var answer []grammar.Alt
	for i, t := range a.Tools {
		if !harmonyName(t.Name) {
			return nil, &FieldError{fmt.Sprintf("tools[%d].function.name", i), fmt.Sprintf("tools[%d].function.name %q: a constrained harmony call needs a name of letters, digits, '_', '-' and '.'", i, t.Name)}
		}
		alt := grammar.Alt{Head: harmonyCallHead(t.Name), Schema: t.Parameters, Object: len(t.Parameters) == 0}
		if alt.Object {
			alt.Schema = nil
		} else if _, err := grammar.Compile(alt.Schema); err != nil {
			if a.Forced || t.Strict {
				return nil, &FieldError{fmt.Sprintf("tools[%d].function.parameters", i), fmt.Sprintf("tools[%d]: its schema cannot be enforced: %v", i, err)}
			}
			free[alt.Head] = Segment{Final: true} // not strict: a free call, parsed (it ends with <|call|>)
			continue
		}
		answer = append(answer, alt)
	}
	switch {
	case a.Schema != nil:
		if _, err := grammar.Compile(a.Schema); err != nil {
			return nil, &FieldError{"response_format.json_schema.schema", fmt.Sprintf("response_format.json_schema.schema: %v", err)}
		}
		for _, h := range []string{harmonyFinal, harmonyFinalJSON} {
			answer = append(answer, grammar.Alt{Head: h, Schema: a.Schema})
		}
	case a.Object:
		for _, h := range []string{harmonyFinal, harmonyFinalJSON} {
			answer = append(answer, grammar.Alt{Head: h, Object: true})
		}
	case !a.Forced:
		free[harmonyFinal] = Segment{Final: true}
		free[harmonyPreamble] = Segment{}
	}
	p := &Plan{Free: free, Answer: answer, NextPrefix: harmonyStart, CapPrefix: harmonyEnd + harmonyStart,
		// With a constrained answer, the reasoning is one analysis message
		// (then the answer's header is forced); in "auto" the model may go
		// back to analysis after a preamble or a free call.
		Again:  !a.Forced && !a.structured(),
		Closer: harmonyEnd, HeaderEnd: harmonyHeaderEnd, Field: "tools"}
	if a.AtStart {
		p.StartPrefix = harmonyStart // the prompt ends after the last message: the model opens its own
	}
	return p, nil
}

// harmonyParser parses one generation incrementally; it starts inside a
// message header (after "<|start|>assistant").
type harmonyParser struct {
	calls  bool   // tools were offered: calls are tool calls
	buf    string // undecided text: a possible special token's start
	inBody bool   // in a message body (after <|message|>)
	header string // the current message's header text
	kind   harmonyKind
	name   string
	args   strings.Builder // a tool call's arguments so far
	n      int             // calls emitted
}

type harmonyKind int

const (
	harmonyContent harmonyKind = iota
	harmonyReasoning
	harmonyCall
)

func (p *harmonyParser) Add(s string, done bool) []Event {
	p.buf += s
	var out []Event
	for p.buf != "" {
		i := strings.Index(p.buf, "<|")
		if i < 0 {
			// A trailing "<" may begin a special token.
			keep := 0
			if strings.HasSuffix(p.buf, "<") {
				keep = 1
			}
			out = p.text(out, p.buf[:len(p.buf)-keep])
			p.buf = p.buf[len(p.buf)-keep:]
			break
		}
		if i > 0 {
			out = p.text(out, p.buf[:i])
			p.buf = p.buf[i:]
		}
		tok, partial := matchToken(p.buf)
		if partial {
			break // wait for the rest of a possible special token
		}
		if tok == "" {
			// "<|" that starts no special token: plain text.
			out = p.text(out, "<|")
			p.buf = p.buf[2:]
			continue
		}
		p.buf = p.buf[len(tok):]
		out = p.special(out, tok)
	}
	if done {
		// undecided text is text, and an unterminated tool call is
		// reported as it stands
		out = p.text(out, p.buf)
		p.buf = ""
		if p.inBody && p.kind == harmonyCall {
			out = p.call(out)
			p.inBody = false
		}
	}
	return out
}

// matchToken reports the special token buf starts with, or partial when buf
// is a proper prefix of one (more text may complete it).
func matchToken(buf string) (tok string, partial bool) {
	for _, t := range harmonyTokens {
		if strings.HasPrefix(buf, t) {
			return t, false
		}
		if strings.HasPrefix(t, buf) {
			partial = true
		}
	}
	return "", partial
}

func (p *harmonyParser) text(out []Event, s string) []Event {
	if s == "" {
		return out
	}
	if !p.inBody {
		p.header += s
		return out
	}
	if p.kind == harmonyCall {
		p.args.WriteString(s)
		return out
	}
	k := Content
	if p.kind == harmonyReasoning {
		k = Reasoning
	}
	if n := len(out); n > 0 && out[n-1].Kind == k {
		out[n-1].Text += s
		return out
	}
	return append(out, Event{Kind: k, Text: s})
}

// call emits the call whose message ends: a tool call, or its arguments
// as answer text when no tools were offered.
func (p *harmonyParser) call(out []Event) []Event {
	if !p.calls {
		if p.args.Len() == 0 {
			return out
		}
		return append(out, Event{Kind: Content, Text: p.args.String()})
	}
	out = callEvents(out, p.n, []parsedCall{{Name: p.name, Arguments: p.args.String()}})
	p.n++
	return out
}

func (p *harmonyParser) special(out []Event, tok string) []Event {
	switch tok {
	case "<|start|>":
		p.inBody, p.header = false, ""
	case "<|channel|>", "<|constrain|>":
		if !p.inBody {
			p.header += " " + tok + " "
		}
	case "<|message|>":
		p.inBody = true
		p.kind, p.name = headerKind(p.header)
		p.args.Reset()
	case "<|end|>", "<|return|>", "<|call|>":
		if p.inBody && p.kind == harmonyCall {
			out = p.call(out)
		}
		p.inBody, p.header = false, ""
	}
	return out
}

// headerKind reads a message header ("assistant <|channel|> commentary
// to=functions.get_weather <|constrain|> json"): a recipient
// functions.NAME makes a tool call; else the analysis channel is
// reasoning and any other (final, commentary) is content.
func headerKind(h string) (harmonyKind, string) {
	channel := ""
	fields := strings.Fields(h)
	for i, f := range fields {
		if name, ok := strings.CutPrefix(f, "to=functions."); ok {
			return harmonyCall, name
		}
		if f == "<|channel|>" && i+1 < len(fields) {
			channel = fields[i+1]
		}
	}
	if channel == "analysis" {
		return harmonyReasoning, ""
	}
	return harmonyContent, ""
}
