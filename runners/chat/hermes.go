package chat

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Hermes is the <tool_call> format of Qwen2.5, Qwen3 and Hermes models,
// and of the generic prompt offered to a template that takes no tools:
//
//	<tool_call>
//	{"name": "get_weather", "arguments": {"city": "Paris"}}
//	</tool_call>
//
// one block per call, after or between answer text. A call streams its
// name as soon as it is read, then its arguments as they are generated.
var Hermes Format = hermes{}

type hermes struct{ unplanned }

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
)

func (hermes) String() string { return "hermes" }

// RenderTools: a template that takes tools renders them itself; else the
// generic Hermes prompt offers them, and a history of calls and results
// is rewritten in the same convention even when no tools are offered now
// (none given, or tool_choice "none"), so the model still sees what it
// called.
func (hermes) RenderTools(t *Template, msgs []Message, tools []ToolDef, agp bool) (string, error) {
	if t.nativeTools() || (len(tools) == 0 && !toolHistory(msgs)) {
		return t.renderTools(msgs, tools, agp)
	}
	gm, err := genericToolMessages(msgs, tools)
	if err != nil {
		return "", err
	}
	return t.Render(gm, agp)
}

func (hermes) Calls(parallel bool) grammar.CallFormat {
	return grammar.CallFormat{Prefix: hermesOpen + "\n", Suffix: "\n" + hermesClose, Separator: "\n", ArgsKey: "arguments", Parallel: parallel}
}

func (hermes) Lazy() (grammar.CallFormat, Trigger, bool) {
	return grammar.CallFormat{Suffix: "\n" + hermesClose, ArgsKey: "arguments"}, Trigger{Marker: hermesOpen}, true
}

func (hermes) NewParser(calls bool, _ Start) Parser {
	if !calls {
		return plain{}
	}
	return &hermesParser{}
}

// genericToolPrompt is the system prompt offering tools to a model whose
// template does not take them: the Hermes convention (the one Qwen2.5 and
// Hermes models are trained on), short enough for a small model to
// follow. %s is the tools, one JSON object per line.
const genericToolPrompt = "You are a function calling AI model. You may call one or more functions to assist with the user query. " +
	"Don't make assumptions about what values to plug into functions. Here are the available tools:\n<tools>\n%s\n</tools>\n\n" +
	"For each function call, return a JSON object with the function name and arguments within <tool_call></tool_call> tags:\n" +
	"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"

// toolHistory reports whether msgs hold a tool call or a tool result.
func toolHistory(msgs []Message) bool {
	for _, m := range msgs {
		if len(m.ToolCalls) > 0 || m.Role == "tool" {
			return true
		}
	}
	return false
}

// genericToolMessages rewrites a conversation for a template without tool
// support: genericToolPrompt (before any system text) as the system
// message when tools are offered; an assistant turn's calls appended to
// its content as <tool_call> blocks; a tool result as a user turn holding
// <tool_response>…</tool_response> (as Qwen2.5's template renders it).
func genericToolMessages(msgs []Message, tools []ToolDef) ([]Message, error) {
	out := make([]Message, 0, len(msgs)+1)
	rest := msgs
	if len(tools) > 0 {
		sys, err := genericToolSystem(tools)
		if err != nil {
			return nil, err
		}
		if len(msgs) > 0 && msgs[0].Role == "system" {
			sys = msgs[0].Content + "\n\n" + sys
			rest = msgs[1:]
		}
		out = append(out, Message{Role: "system", Content: sys})
	}
	for _, m := range rest {
		switch {
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			var b strings.Builder
			b.WriteString(m.Content)
			for _, c := range m.ToolCalls {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				args := json.RawMessage(c.Arguments)
				if !json.Valid(args) {
					q, _ := marshalNoEscape(c.Arguments)
					args = q
				}
				call, err := marshalNoEscape(struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				}{c.Name, args})
				if err != nil {
					return nil, err
				}
				b.WriteString(hermesOpen + "\n" + string(call) + "\n" + hermesClose)
			}
			out = append(out, Message{Role: "assistant", Content: b.String()})
		case m.Role == "tool":
			out = append(out, Message{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
		default:
			out = append(out, Message{Role: m.Role, Content: m.Content})
		}
	}
	return out, nil
}

// genericToolSystem is genericToolPrompt offering tools, one JSON object
// a line.
func genericToolSystem(tools []ToolDef) (string, error) {
	var lines []string
	for _, td := range tools {
		type function struct {
			Name        string          `json:"name"`
			Description string          `json:"description,omitempty"`
			Parameters  json.RawMessage `json:"parameters,omitempty"`
		}
		b, err := marshalNoEscape(struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}{"function", function{td.Name, td.Description, td.Parameters}})
		if err != nil {
			return "", fmt.Errorf("chat: tool %q: %w", td.Name, err)
		}
		lines = append(lines, string(b))
	}
	return fmt.Sprintf(genericToolPrompt, strings.Join(lines, "\n")), nil
}

// hermesParser streams <tool_call> blocks: text passes through except
// what might be the start of <tool_call>, which is held back until it is
// known; a block that is not a call stays text (nothing is dropped).
type hermesParser struct {
	pending string // text not yet emitted
	out     textOut
	calls   int

	inCall   bool
	body     string // the call's text after <tool_call>
	named    bool   // its name went out; args streaming from argStart
	argSent  int    // bytes of body sent as arguments
	argDone  bool   // the arguments value is complete
	scan     jsonScan
	buffered bool // not the usual shape: parse it whole at </tool_call>
	cur      int  // index of the call in progress
}

func (s *hermesParser) Add(text string, done bool) []Event {
	var ev []Event
	s.pending += text
	for {
		var again bool
		ev, again = s.step(ev)
		if !again {
			break
		}
	}
	if done {
		if s.inCall {
			ev = s.endCall(ev, false)
		}
		ev = s.out.end(s.out.text(ev, s.pending))
		s.pending = ""
	}
	return ev
}

// step consumes what it can of pending; again: call it once more.
func (s *hermesParser) step(ev []Event) ([]Event, bool) {
	if !s.inCall {
		if i := strings.Index(s.pending, hermesOpen); i >= 0 {
			ev = s.out.text(ev, s.pending[:i])
			s.pending = s.pending[i+len(hermesOpen):]
			s.inCall, s.body, s.named, s.argSent, s.argDone, s.buffered = true, "", false, 0, false, false
			s.scan = jsonScan{}
			s.cur = -1
			return ev, true
		}
		k := heldPrefix(s.pending, hermesOpen)
		ev = s.out.text(ev, s.pending[:len(s.pending)-k])
		s.pending = s.pending[len(s.pending)-k:]
		return ev, false
	}
	s.body += s.pending
	s.pending = ""
	if j := strings.Index(s.body, hermesClose); j >= 0 {
		rest := s.body[j+len(hermesClose):]
		s.body = s.body[:j]
		ev = s.advanceCall(ev)
		ev = s.endCall(ev, true)
		s.pending = rest
		return ev, true
	}
	return s.advanceCall(ev), false
}

// advanceCall streams what the body now holds of the call in progress
// (short of what may begin </tool_call>).
func (s *hermesParser) advanceCall(ev []Event) []Event {
	if s.buffered {
		return ev
	}
	body := s.body[:len(s.body)-heldPrefix(s.body, hermesClose)]
	if !s.named {
		name, start, st := callHead(body, "arguments")
		switch st {
		case headMore:
			return ev
		case headBad:
			s.buffered = true
			return ev
		}
		s.named, s.argSent = true, start
		s.cur = s.calls
		s.calls++
		ev = append(ev, Event{Kind: Call, Index: s.cur, Name: name})
		if body[start] != '{' {
			s.buffered = true // arguments as a string: sent whole at the end
			return ev
		}
	}
	if s.argDone {
		return ev
	}
	from := s.argSent
	for i := from; i < len(body); i++ {
		if s.scan.feed(body[i]) {
			s.argSent, s.argDone = i+1, true
			break
		}
		s.argSent = i + 1
	}
	if s.argSent > from {
		ev = append(ev, Event{Kind: Call, Index: s.cur, Args: body[from:s.argSent]})
	}
	return ev
}

// endCall finishes the call in progress at </tool_call> (closed) or at
// the end of the output.
func (s *hermesParser) endCall(ev []Event, closed bool) []Event {
	c, ok := parseCallObject(s.body, "arguments")
	switch {
	case s.named && s.buffered:
		args := "{}"
		if ok {
			args = c.Arguments
		}
		ev = append(ev, Event{Kind: Call, Index: s.cur, Args: args})
	case s.named:
		// streamed already (a call cut short stays as far as it got)
	case ok:
		ev = callEvents(ev, s.calls, []parsedCall{c})
		s.calls++
	default:
		t := hermesOpen + s.body
		if closed {
			t += hermesClose
		}
		ev = s.out.text(ev, t)
	}
	s.inCall, s.body = false, ""
	return ev
}
