package chat

import (
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What the JSON tool-call formats (Hermes, Llama 3, Mistral) share: a call
// object {"name": …, "arguments"|"parameters": {…}}, read whole or
// streamed name first, and the white-space rules of the text around it.

// parseCallObject reads {"name": …, argsKey: …} (also accepting the other
// format's key, and arguments given as a JSON string holding an object).
func parseCallObject(s, argsKey string) (parsedCall, bool) {
	var o map[string]json.RawMessage
	s = strings.TrimSpace(s)
	d := json.NewDecoder(strings.NewReader(s))
	if err := d.Decode(&o); err != nil || strings.TrimSpace(s[d.InputOffset():]) != "" {
		return parsedCall{}, false
	}
	var name string
	if json.Unmarshal(o["name"], &name) != nil || name == "" {
		return parsedCall{}, false
	}
	args, ok := o[argsKey]
	if !ok {
		for _, k := range []string{"arguments", "parameters"} {
			if a, found := o[k]; found {
				args, ok = a, true
				break
			}
		}
	}
	if !ok {
		return parsedCall{Name: name, Arguments: "{}"}, true
	}
	var str string
	if json.Unmarshal(args, &str) == nil {
		args = json.RawMessage(strings.TrimSpace(str))
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil || obj == nil {
		return parsedCall{}, false
	}
	// The arguments text as the model wrote it (what streaming sends).
	return parsedCall{Name: name, Arguments: string(args)}, true
}

type headState int

const (
	headMore headState = iota
	headOK
	headBad
)

// callHead reads `{"name": "<name>", "<argsKey>": ` from the start of
// body; start is the offset of the arguments value. Any other shape
// (keys in another order, the other format's arguments key) is headBad:
// such a call is read whole once it ends.
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
	if k != argsKey {
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

// heldPrefix returns how many trailing bytes of t could start marker.
func heldPrefix(t, marker string) int {
	for k := min(len(marker)-1, len(t)); k > 0; k-- {
		if strings.HasSuffix(t, marker[:k]) {
			return k
		}
	}
	return 0
}

// textOut emits the answer text around calls without its leading and
// trailing white space (as the whole-text parsers trim it), the same
// however the text is split (a rune's first bytes wait for the rest).
type textOut struct {
	ws      string // white space held back
	part    string // an incomplete rune at the end
	started bool   // non-white-space text has been emitted
}

func (o *textOut) text(ev []Event, t string) []Event {
	t = o.part + t
	o.part = ""
	for i := len(t) - 1; i >= 0 && i >= len(t)-utf8.UTFMax; i-- {
		if utf8.RuneStart(t[i]) {
			if !utf8.FullRuneInString(t[i:]) {
				t, o.part = t[:i], t[i:]
			}
			break
		}
	}
	return o.emit(ev, t)
}

// end emits an incomplete rune held back (the output ended in it).
func (o *textOut) end(ev []Event) []Event {
	t := o.part
	o.part = ""
	return o.emit(ev, t)
}

func (o *textOut) emit(ev []Event, t string) []Event {
	if t == "" {
		return ev
	}
	trimmed := strings.TrimRightFunc(t, unicode.IsSpace)
	if trimmed == "" {
		o.ws += t
		return ev
	}
	out := trimmed
	if o.started {
		out = o.ws + trimmed
	} else {
		out = strings.TrimLeftFunc(trimmed, unicode.IsSpace)
	}
	o.ws = t[len(trimmed):]
	o.started = true
	return append(ev, Event{Kind: Content, Text: out})
}

// callEvents are the events of whole calls, numbered from first.
func callEvents(ev []Event, first int, calls []parsedCall) []Event {
	for i, c := range calls {
		ev = append(ev, Event{Kind: Call, Index: first + i, Name: c.Name}, Event{Kind: Call, Index: first + i, Args: c.Arguments})
	}
	return ev
}

// callList streams a list of call objects separated by sep, as Llama 3
// (";", to the end of the output) and Mistral (",", inside [ ]) write
// them: each call's name as soon as its head is read, then its
// arguments as they are generated. A call of another shape is read whole
// when it ends. Text that breaks the list makes it bad: the caller turns
// the rest into answer text (all of it when no call went out yet).
type callList struct {
	argsKey string
	sep     byte
	close   byte // ends the list (0: the output's end does)
	// uniSpace: any Unicode white space may stand between calls (else
	// JSON's own, as inside a JSON array).
	uniSpace bool

	body  string // the list's text so far
	p     int    // parsed up to here
	state int
	first bool // no element yet (a Mistral list may be empty)
	calls int  // calls that went out (named)

	// the element in progress
	start    int // its offset in body
	es       jsonScan
	esPos    int // body[start:esPos] fed to es
	end      int // offset after its closing brace (0: not yet)
	named    bool
	argSent  int // body[:argSent] of the arguments sent
	argDone  bool
	as       jsonScan
	buffered bool // read whole at its end
	cur      int
}

const (
	listOpen = iota // before '[' (Mistral)
	listElem        // before an element
	listIn          // inside an element
	listSep         // after an element
	listEnd         // after the list's close
	listBad         // the text is not a call list
)

// badAt is where the text that broke the list starts.
func (l *callList) badAt() string {
	if l.state == listIn {
		return l.body[l.start:]
	}
	return l.body[l.p:]
}

// textFrom is the text a parser passes on once the list broke: all (what
// it held back since its output could be a list) when no call went out,
// else the text from where it broke.
func (l *callList) textFrom(all string) string {
	if l.calls == 0 {
		return all
	}
	return l.badAt()
}

// feed adds text and returns the calls' events; the list is bad when
// l.state is listBad (badAt is the text from where it broke).
func (l *callList) feed(ev []Event, text string, done bool) []Event {
	l.body += text
	for l.state != listBad {
		if l.state != listIn {
			var partial bool
			l.p, partial = skipSpace(l.body, l.p, l.uniSpace || l.state == listOpen || l.state == listEnd)
			if partial && !done {
				return ev // a rune's first bytes
			}
			if l.p == len(l.body) {
				if done && (l.state == listOpen || l.close != 0 && l.state != listEnd) {
					l.state = listBad // an unclosed list
				}
				return ev
			}
		}
		c := l.body[l.p]
		switch l.state {
		case listOpen:
			if c != '[' {
				l.state = listBad
				continue
			}
			l.p++
			l.state, l.first = listElem, true
		case listElem:
			switch {
			case c == '{':
				l.state, l.start, l.esPos, l.end = listIn, l.p, l.p, 0
				l.es, l.as, l.named, l.argDone, l.buffered = jsonScan{}, jsonScan{}, false, false, false
			case c == l.close && l.close != 0 && l.first:
				l.p++
				l.state = listEnd
			default:
				l.state = listBad
			}
		case listIn:
			var stop bool
			if ev, stop = l.element(ev, done); stop {
				return ev
			}
		case listSep:
			switch {
			case c == l.sep:
				l.p++
				l.state, l.first = listElem, false
			case c == l.close && l.close != 0:
				l.p++
				l.state = listEnd
			default:
				l.state = listBad
			}
		case listEnd:
			l.state = listBad // text after the list
		}
	}
	return ev
}

// element advances the element in progress; stop: feed returns (it
// needs more text).
func (l *callList) element(ev []Event, done bool) ([]Event, bool) {
	for l.end == 0 && l.esPos < len(l.body) {
		if l.es.feed(l.body[l.esPos]) {
			l.end = l.esPos + 1
		}
		l.esPos++
	}
	limit := len(l.body)
	if l.end > 0 {
		limit = l.end
	}
	if !l.named && !l.buffered {
		name, start, st := callHead(l.body[l.start:limit], l.argsKey)
		switch {
		case st == headOK:
			l.named, l.cur, l.argSent = true, l.calls, l.start+start
			l.calls++
			ev = append(ev, Event{Kind: Call, Index: l.cur, Name: name})
			l.buffered = l.body[l.argSent] != '{' // arguments as a string: sent whole at the end
		case st == headBad || l.end > 0:
			l.buffered = true
		}
	}
	if l.named && !l.buffered && !l.argDone {
		from := l.argSent
		for i := from; i < limit; i++ {
			l.argSent = i + 1
			if l.as.feed(l.body[i]) {
				l.argDone = true
				break
			}
		}
		if l.argSent > from {
			ev = append(ev, Event{Kind: Call, Index: l.cur, Args: l.body[from:l.argSent]})
		}
	}
	if l.end == 0 {
		if done && !l.named {
			l.state = listBad
			return ev, false
		}
		return ev, true // more text, or a named call cut short: it stays as far as it got
	}
	c, ok := parseCallObject(l.body[l.start:l.end], l.argsKey)
	switch {
	case !ok && !l.named:
		l.state = listBad
		return ev, false
	case !l.named:
		ev = callEvents(ev, l.calls, []parsedCall{c})
		l.calls++
	case l.buffered && ok:
		ev = append(ev, Event{Kind: Call, Index: l.cur, Args: c.Arguments})
	case l.buffered:
		ev = append(ev, Event{Kind: Call, Index: l.cur, Args: "{}"})
	}
	// (a streamed call that turns out malformed stays as far as it got)
	l.p, l.state = l.end, listSep
	return ev, false
}

// skipSpace skips white space from p (uni: any Unicode white space, else
// JSON's); partial: s ends inside a rune there.
func skipSpace(s string, p int, uni bool) (int, bool) {
	for p < len(s) {
		if !uni {
			if strings.IndexByte(" \t\r\n", s[p]) < 0 {
				return p, false
			}
			p++
			continue
		}
		if !utf8.FullRuneInString(s[p:]) {
			return p, true
		}
		r, n := utf8.DecodeRuneInString(s[p:])
		if !unicode.IsSpace(r) {
			return p, false
		}
		p += n
	}
	return p, false
}
