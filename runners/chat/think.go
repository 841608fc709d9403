package chat

import (
	"strings"
	"unicode"
)

// Models whose template is Qwen3's reason before answering inside
// <think>…</think> at the start of their output (the template strips it
// from past turns and reads message.reasoning_content instead).
// ThinkParser splits such a generation, fed in arbitrary pieces, into
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
type ThinkParser struct {
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

// ThinkTags reports whether the template is of a model that reasons in
// <think>…</think> and takes that reasoning back as reasoning_content
// (Qwen3's templates).
func (t *Template) ThinkTags() bool {
	return strings.Contains(t.src, thinkOpen) && strings.Contains(t.src, "reasoning_content")
}

// Feed parses more output and returns the reasoning and answer text it
// completes (reasoning always comes first in the output).
func (p *ThinkParser) Feed(s string) (reasoning, content string) {
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
func (p *ThinkParser) Flush() (reasoning, content string) {
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
