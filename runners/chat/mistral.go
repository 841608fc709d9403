package chat

import (
	"strings"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

// Mistral is the tool-call format of Mistral models: answer text, then
// [TOOL_CALLS] and a JSON array of {"name", "arguments"} objects to the
// end of the output. Calls stream as they are written: a call's name once
// its head is read, then its arguments.
var Mistral Format = mistral{}

type mistral struct {
	unplanned
	templateTools
}

const mistralTag = "[TOOL_CALLS]"

func (mistral) String() string { return "mistral" }

func (mistral) Calls(parallel bool) grammar.CallFormat {
	return grammar.CallFormat{List: true, ListPrefix: mistralTag, ArgsKey: "arguments", Parallel: parallel}
}

func (mistral) Lazy() (grammar.CallFormat, Trigger, bool) {
	return grammar.CallFormat{List: true, ArgsKey: "arguments", Parallel: true}, Trigger{Marker: mistralTag}, true
}

func (mistral) NewParser(calls bool, _ Start) Parser {
	if !calls {
		return plain{}
	}
	return &mistralParser{list: callList{argsKey: "arguments", sep: ',', close: ']'}}
}

// mistralParser passes text through until [TOOL_CALLS] (holding back what
// may begin it), then streams the call list after it.
type mistralParser struct {
	pending string // text that may begin the tag
	mode    int    // mistralText, mistralList, mistralAfter
	out     textOut
	list    callList
}

const (
	mistralText  = iota // before the tag
	mistralList         // in the list
	mistralAfter        // the list broke: the rest is text
)

func (p *mistralParser) Add(s string, done bool) []Event {
	var ev []Event
	switch p.mode {
	case mistralText:
		p.pending += s
		i := strings.Index(p.pending, mistralTag)
		if i < 0 {
			k := heldPrefix(p.pending, mistralTag)
			if done {
				k = 0
			}
			ev = p.out.text(ev, p.pending[:len(p.pending)-k])
			p.pending = p.pending[len(p.pending)-k:]
			if done {
				ev = p.out.end(ev)
			}
			return ev
		}
		ev = p.out.text(ev, p.pending[:i])
		rest := p.pending[i+len(mistralTag):]
		p.pending, p.mode = "", mistralList
		ev = p.list.feed(ev, rest, done)
	case mistralList:
		ev = p.list.feed(ev, s, done)
	default:
		ev = p.out.text(ev, s)
	}
	if p.mode == mistralList && p.list.state == listBad {
		p.mode = mistralAfter
		ev = p.out.text(ev, p.list.textFrom(mistralTag+p.list.body)) // all: the tag and the list
	}
	if done {
		ev = p.out.end(ev)
	}
	return ev
}
