package chat

import (
	"encoding/json"
	"strings"
	"unicode"
)

// ToolEvent is one piece of a streamed answer: text (Index < 0), or a
// fragment of tool call Index: its Name on the call's first event, then
// pieces of its arguments text, which concatenate to the Arguments
// ParseToolCalls gives for the same output.
type ToolEvent struct {
	Text  string
	Index int
	Name  string
	Args  string
}

// ToolStream parses generated text as it comes (OpenAI's
// delta.tool_calls): text passes through except what might be the start
// of a tool-call marker, which is held back until it is known; a Hermes
// call streams its name as soon as it is read and then its arguments as
// they are generated; Llama and Mistral calls come whole at the end.
// Leading and trailing whitespace of the text is dropped, as
// ParseToolCalls drops it.
type ToolStream struct {
	f       Family
	pending string // text not yet emitted
	ws      string // whitespace held back
	started bool   // non-whitespace text has been emitted
	calls   int

	// Hermes call in progress.
	inCall   bool
	body     string // the call's text after <tool_call>
	named    bool   // its name went out; args streaming from argStart
	argStart int
	argSent  int  // bytes of body sent as arguments
	argDone  bool // the arguments value is complete
	scan     jsonScan
	buffered bool // not the usual shape: parse it whole at </tool_call>

	cur int // index of the call in progress

	// Llama / Mistral: the rest of the output is a call list.
	whole   bool
	decided bool // Llama: the first non-space byte has been seen
}

// NewToolStream parses a stream of family f.
func NewToolStream(f Family) *ToolStream { return &ToolStream{f: f} }

// Push adds generated text and returns what can be sent.
func (s *ToolStream) Push(text string) []ToolEvent {
	var ev []ToolEvent
	s.pending += text
	for {
		var again bool
		ev, again = s.step(ev)
		if !again {
			return ev
		}
	}
}

// step consumes what it can of pending; again: call it once more.
func (s *ToolStream) step(ev []ToolEvent) ([]ToolEvent, bool) {
	if s.whole {
		return ev, false
	}
	switch s.f {
	case Llama:
		if s.decided {
			ev = s.text(ev, s.pending)
			s.pending = ""
			return ev, false
		}
		t := strings.TrimLeftFunc(s.pending, unicode.IsSpace)
		if t == "" || len(t) < len(pythonTag) && strings.HasPrefix(pythonTag, t) {
			return ev, false
		}
		s.decided = true
		if t[0] == '{' || strings.HasPrefix(t, pythonTag) {
			s.whole = true
			return ev, false
		}
		return ev, true
	case Mistral:
		if i := strings.Index(s.pending, mistralTag); i >= 0 {
			ev = s.text(ev, s.pending[:i])
			s.pending = s.pending[i:]
			s.whole = true
			return ev, false
		}
		k := heldPrefix(s.pending, mistralTag)
		ev = s.text(ev, s.pending[:len(s.pending)-k])
		s.pending = s.pending[len(s.pending)-k:]
		return ev, false
	}
	if !s.inCall {
		if i := strings.Index(s.pending, hermesOpen); i >= 0 {
			ev = s.text(ev, s.pending[:i])
			s.pending = s.pending[i+len(hermesOpen):]
			s.inCall, s.body, s.named, s.argStart, s.argSent, s.argDone, s.buffered = true, "", false, 0, 0, false, false
			s.scan = jsonScan{}
			s.cur = -1
			return ev, true
		}
		k := heldPrefix(s.pending, hermesOpen)
		ev = s.text(ev, s.pending[:len(s.pending)-k])
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

// advanceCall streams what the body now holds of the call in progress.
func (s *ToolStream) advanceCall(ev []ToolEvent) []ToolEvent {
	if s.buffered {
		return ev
	}
	if !s.named {
		name, start, st := callHead(s.body, s.f.ArgsKey())
		switch st {
		case headMore:
			return ev
		case headBad:
			s.buffered = true
			return ev
		}
		s.named, s.argStart, s.argSent = true, start, start
		s.cur = s.calls
		s.calls++
		ev = append(ev, ToolEvent{Index: s.cur, Name: name})
		if s.body[start] != '{' {
			s.buffered = true // arguments as a string: sent whole at the end
			return ev
		}
	}
	if s.argDone {
		return ev
	}
	from := s.argSent
	for i := from; i < len(s.body); i++ {
		if s.scan.feed(s.body[i]) {
			s.argSent, s.argDone = i+1, true
			break
		}
		s.argSent = i + 1
	}
	if s.argSent > from {
		ev = append(ev, ToolEvent{Index: s.cur, Args: s.body[from:s.argSent]})
	}
	return ev
}

// endCall finishes the call in progress at </tool_call> (closed) or at
// the end of the output.
func (s *ToolStream) endCall(ev []ToolEvent, closed bool) []ToolEvent {
	c, ok := parseCallObject(s.body, s.f.ArgsKey())
	switch {
	case s.named && s.buffered:
		args := "{}"
		if ok {
			args = c.Arguments
		}
		ev = append(ev, ToolEvent{Index: s.cur, Args: args})
	case s.named:
		// streamed already (a call cut short stays as far as it got)
	case ok:
		ev = append(ev, ToolEvent{Index: s.calls, Name: c.Name}, ToolEvent{Index: s.calls, Args: c.Arguments})
		s.calls++
	default:
		t := hermesOpen + s.body
		if closed {
			t += hermesClose
		}
		ev = s.text(ev, t)
	}
	s.inCall, s.body = false, ""
	return ev
}

type headState int

const (
	headMore headState = iota
	headOK
	headBad
)

// callHead reads `{"name": "<name>", "<argsKey>": ` from the start of
// body; start is the offset of the arguments value.
func callHead(body, argsKey string) (name string, start int, st headState) {
	p := 0
	ws := func() {
		for p < len(body) && strings.IndexByte(" \t\r\n", body[p]) >= 0 {
			p++
		}
	}
	lit := func(c byte) headState {
		ws()
		if p == len(body) {
			return headMore
		}
		if body[p] != c {
			return headBad
		}
		p++
		return headOK
	}
	str := func() (string, headState) {
		ws()
		if p == len(body) {
			return "", headMore
		}
		if body[p] != '"' {
			return "", headBad
		}
		for i := p + 1; i < len(body); i++ {
			switch body[i] {
			case '\\':
				i++
			case '"':
				var v string
				if json.Unmarshal([]byte(body[p:i+1]), &v) != nil {
					return "", headBad
				}
				p = i + 1
				return v, headOK
			}
		}
		return "", headMore
	}
	if st := lit('{'); st != headOK {
		return "", 0, st
	}
	k, st := str()
	if st != headOK {
		return "", 0, st
	}
	if k != "name" {
		return "", 0, headBad
	}
	if st := lit(':'); st != headOK {
		return "", 0, st
	}
	if name, st = str(); st != headOK {
		return "", 0, st
	}
	if st := lit(','); st != headOK {
		return "", 0, st
	}
	k, st = str()
	if st != headOK {
		return "", 0, st
	}
	if k != argsKey && k != "arguments" && k != "parameters" {
		return "", 0, headBad
	}
	if st := lit(':'); st != headOK {
		return "", 0, st
	}
	ws()
	if p == len(body) {
		return "", 0, headMore
	}
	return name, p, headOK
}

// jsonScan finds the end of one JSON object or array.
type jsonScan struct {
	depth int
	inStr bool
	esc   bool
}

// feed reports whether c completes the value.
func (j *jsonScan) feed(c byte) bool {
	switch {
	case j.inStr:
		switch {
		case j.esc:
			j.esc = false
		case c == '\\':
			j.esc = true
		case c == '"':
			j.inStr = false
		}
	case c == '"':
		j.inStr = true
	case c == '{' || c == '[':
		j.depth++
	case c == '}' || c == ']':
		j.depth--
		return j.depth == 0
	}
	return false
}

// Finish ends the stream: held-back text and an unfinished call.
func (s *ToolStream) Finish() []ToolEvent {
	var ev []ToolEvent
	switch {
	case s.whole:
		content, calls := ParseToolCalls(s.f, s.pending)
		ev = s.text(ev, content)
		for _, c := range calls {
			ev = append(ev, ToolEvent{Index: s.calls, Name: c.Name}, ToolEvent{Index: s.calls, Args: c.Arguments})
			s.calls++
		}
	case s.inCall:
		ev = s.endCall(ev, false)
		ev = s.text(ev, s.pending)
	default:
		ev = s.text(ev, s.pending)
	}
	s.pending = ""
	return ev
}

// Calls is the number of tool calls started so far.
func (s *ToolStream) Calls() int { return s.calls }

// text emits t with the whitespace rules.
func (s *ToolStream) text(ev []ToolEvent, t string) []ToolEvent {
	if t == "" {
		return ev
	}
	trimmed := strings.TrimRightFunc(t, unicode.IsSpace)
	if trimmed == "" {
		s.ws += t
		return ev
	}
	out := trimmed
	if s.started {
		out = s.ws + trimmed
	} else {
		out = strings.TrimLeftFunc(trimmed, unicode.IsSpace)
	}
	s.ws = t[len(trimmed):]
	s.started = true
	return append(ev, ToolEvent{Index: -1, Text: out})
}

// heldPrefix returns how many trailing bytes of t could start marker.
func heldPrefix(t, marker string) int {
	for k := min(len(marker)-1, len(t)); k > 0; k-- {
		if strings.HasSuffix(t, marker[:k]) {
			return k
		}
	}
	return 0
}
