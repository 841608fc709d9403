package chat

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Llama3 is the tool-call format of Llama 3.1 and 3.2: the whole answer is
// a bare {"name": …, "parameters": {…}} object, optionally after
// <|python_tag|>, or several separated by ";" (as Llama 3.2 sometimes
// writes them); any other answer is text. Calls stream as they are
// written: a call's name once its head is read, then its arguments.
var Llama3 Format = llama3{}

type llama3 struct {
	unplanned
	templateTools
}

const pythonTag = "<|python_tag|>"

func (llama3) String() string { return "llama3" }

// Calls: one call per answer (the format has no list the grammar writes).
func (llama3) Calls(bool) grammar.CallFormat { return grammar.CallFormat{ArgsKey: "parameters"} }

func (llama3) Lazy() (grammar.CallFormat, Trigger, bool) {
	return grammar.CallFormat{ArgsKey: "parameters"}, Trigger{}, true
}

func (llama3) NewParser(calls bool, _ Start) Parser {
	if !calls {
		return plain{}
	}
	return &llamaParser{list: callList{argsKey: "parameters", sep: ';', uniSpace: true, state: listElem}}
}

// llamaParser decides at the answer's first non-space text whether it is
// a call list (then streamed by list) or text.
type llamaParser struct {
	raw  string // the output so far (all text, should the list break)
	mode int    // llamaUndecided, llamaList, llamaText
	out  textOut
	list callList
}

const (
	llamaUndecided = iota
	llamaList
	llamaText
)

func (p *llamaParser) Add(s string, done bool) []Event {
	var ev []Event
	p.raw += s
	switch p.mode {
	case llamaUndecided:
		t := strings.TrimLeftFunc(p.raw, unicode.IsSpace)
		if r, ok := strings.CutPrefix(t, pythonTag); ok {
			t = strings.TrimLeftFunc(r, unicode.IsSpace)
			if t == "" && !done {
				return nil
			}
		} else if !done && (len(t) < len(pythonTag) && strings.HasPrefix(pythonTag, t) || !utf8.FullRuneInString(t)) {
			return nil // "", a prefix of <|python_tag|> or of a rune: wait
		}
		if strings.HasPrefix(t, "{") {
			p.mode = llamaList
			ev = p.list.feed(ev, t, done)
			break
		}
		p.mode = llamaText
		ev = p.out.text(ev, p.raw)
	case llamaList:
		ev = p.list.feed(ev, s, done)
	default:
		ev = p.out.text(ev, s)
	}
	if p.mode == llamaList && p.list.state == listBad {
		p.mode = llamaText
		ev = p.out.text(ev, p.list.textFrom(p.raw)) // all: the whole output
	}
	if done {
		ev = p.out.end(ev)
	}
	return ev
}
