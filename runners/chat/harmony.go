package chat

import "strings"

// Harmony is gpt-oss's response format: the model writes messages of the
// form
//
//	<|channel|>analysis<|message|>…reasoning…<|end|>
//	<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
//	<|start|>assistant<|channel|>final<|message|>…answer…<|return|>
//
// (the prompt ends with "<|start|>assistant", so the first message's header
// starts at <|channel|>). HarmonyParser splits such a generation, fed in
// arbitrary pieces as it is decoded (special tokens rendered as text), into
// reasoning (the analysis channel: OpenAI's reasoning_content, as vLLM and
// llama.cpp return it), content (the final channel) and tool calls
// (messages addressed to=functions.NAME). It is the seam the API layer
// plugs into for models whose chat template is harmony; it holds no HTTP.

// HarmonyKind says what a HarmonyEvent carries.
type HarmonyKind int

// Event kinds.
const (
	HarmonyReasoning HarmonyKind = iota + 1 // Text is more reasoning
	HarmonyContent                          // Text is more answer
	HarmonyToolCall                         // Name and Text (the arguments) of a complete call
)

// HarmonyEvent is one piece of a parsed generation.
type HarmonyEvent struct {
	Kind HarmonyKind
	Text string
	Name string // tool calls: the function name
}

// HarmonyParser parses one generation incrementally. The zero value is
// ready; it starts inside a message header (after "<|start|>assistant").
type HarmonyParser struct {
	buf    string // undecided text: a possible special token's start
	inBody bool   // in a message body (after <|message|>)
	header string // the current message's header text
	kind   HarmonyKind
	name   string
	args   strings.Builder // a tool call's arguments so far
}

var harmonyTokens = []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}

// Feed parses more generated text and returns the events it completes.
func (p *HarmonyParser) Feed(s string) []HarmonyEvent {
	p.buf += s
	var out []HarmonyEvent
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

// Flush ends the generation: undecided text is text, and an unterminated
// tool call is reported as it stands.
func (p *HarmonyParser) Flush() []HarmonyEvent {
	out := p.text(nil, p.buf)
	p.buf = ""
	if p.inBody && p.kind == HarmonyToolCall {
		out = append(out, HarmonyEvent{Kind: HarmonyToolCall, Name: p.name, Text: p.args.String()})
		p.inBody = false
	}
	return out
}

func (p *HarmonyParser) text(out []HarmonyEvent, s string) []HarmonyEvent {
	if s == "" {
		return out
	}
	if !p.inBody {
		p.header += s
		return out
	}
	if p.kind == HarmonyToolCall {
		p.args.WriteString(s)
		return out
	}
	if n := len(out); n > 0 && out[n-1].Kind == p.kind {
		out[n-1].Text += s
		return out
	}
	return append(out, HarmonyEvent{Kind: p.kind, Text: s})
}

func (p *HarmonyParser) special(out []HarmonyEvent, tok string) []HarmonyEvent {
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
		if p.inBody && p.kind == HarmonyToolCall {
			out = append(out, HarmonyEvent{Kind: HarmonyToolCall, Name: p.name, Text: p.args.String()})
		}
		p.inBody, p.header = false, ""
	}
	return out
}

// headerKind reads a message header ("assistant <|channel|> commentary
// to=functions.get_weather <|constrain|> json"): a recipient
// functions.NAME makes a tool call; else the analysis channel is
// reasoning and any other (final, commentary) is content.
func headerKind(h string) (HarmonyKind, string) {
	channel := ""
	fields := strings.Fields(h)
	for i, f := range fields {
		if name, ok := strings.CutPrefix(f, "to=functions."); ok {
			return HarmonyToolCall, name
		}
		if f == "<|channel|>" && i+1 < len(fields) {
			channel = fields[i+1]
		}
	}
	if channel == "analysis" {
		return HarmonyReasoning, ""
	}
	return HarmonyContent, ""
}
