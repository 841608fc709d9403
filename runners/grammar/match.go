package grammar

import "math/bits"

// A frame is one level of the automaton's stack: the node being matched
// and where in it. Frames are immutable once made, so a state is a set of
// stack tops that share their lower frames, and backtracking costs
// nothing.
type frame struct {
	n    *node
	up   *frame
	st   uint8  // sub-state, per kind (below)
	ws   uint8  // whitespace bytes in a row
	u8   uint8  // UTF-8 continuation bytes still expected (strings, keys)
	cnt  int32  // kString: code points; kArray, kRepeat: items; kObject: progress; kNumber: bytes
	pos  int32  // kLit: trie node; kObject: key bytes (in a key) or the property (after it)
	nkey int32  // kObject: properties written (minProperties/maxProperties)
	mask uint64 // kObject, in a key: declared names the key is still a prefix of
}

// Sub-states.
const (
	// kString
	sStrOpen uint8 = iota // expects '"'
	sStrBody
	sStrEsc
	sStrHex // + 0..3: hex digits of \u seen
	_
	_
	_
	sStrHexD // after \uD: the next digit must be 0-7 (no surrogates)
	sStrDone
)

const (
	// kArray
	sArrOpen  uint8 = iota // expects '['
	sArrFirst              // after '['
	sArrItem               // an item is in progress (as an up frame)
	sArrAfter              // after an item
	sArrComma              // after ','
	sArrDone
)

const (
	// kObject
	sObjOpen  uint8 = iota // expects '{'
	sObjFirst              // after '{'
	sObjKey                // inside a key
	sObjColon              // after a key, expects ':'
	sObjValue              // after ':'
	sObjChild              // a value is in progress (as an up frame)
	sObjAfter              // after a value
	sObjComma              // after ','
	sObjDone
)

const (
	// kNumber
	sNumStart uint8 = iota
	sNumMinus
	sNumZero
	sNumInt
	sNumDot
	sNumFrac
	sNumE
	sNumESign
	sNumExp
)

// arena hands out frames for the mask walk and is reset per walk; a nil
// arena allocates from the heap (committed states).
type arena struct {
	chunks [][]frame
	ci, i  int
}

const chunkSize = 4096

func (a *arena) alloc(f frame) *frame {
	if a == nil {
		p := new(frame)
		*p = f
		return p
	}
	if a.ci == len(a.chunks) {
		a.chunks = append(a.chunks, make([]frame, chunkSize))
	}
	p := &a.chunks[a.ci][a.i]
	*p = f
	a.i++
	if a.i == chunkSize {
		a.ci, a.i = a.ci+1, 0
	}
	return p
}

func (a *arena) reset() { a.ci, a.i = 0, 0 }

func isWS(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// UTF-8 states of a string body: the continuation bytes still expected,
// with the narrower ranges after E0, ED, F0 and F4 (so that overlong
// forms and surrogates, which decoders replace, never come out).
const (
	u8None uint8 = iota
	u8One
	u8Two
	u8Three
	u8E0 // A0..BF, then one more
	u8ED // 80..9F, then one more
	u8F0 // 90..BF, then two more
	u8F4 // 80..8F, then two more
	numU8
)

// utf8Step advances UTF-8 state u by b in a string body; ok is false
// when b cannot come there. Bytes below 0x20, '"' and '\\' are the
// caller's.
func utf8Step(u uint8, b byte) (uint8, bool) {
	lo, hi, next := byte(0x80), byte(0xBF), u8None
	switch u {
	case u8None:
		switch {
		case b < 0x80:
			return u8None, true
		case b >= 0xC2 && b <= 0xDF:
			return u8One, true
		case b == 0xE0:
			return u8E0, true
		case b == 0xED:
			return u8ED, true
		case b >= 0xE1 && b <= 0xEF:
			return u8Two, true
		case b == 0xF0:
			return u8F0, true
		case b == 0xF4:
			return u8F4, true
		case b >= 0xF1 && b <= 0xF3:
			return u8Three, true
		}
		return 0, false
	case u8One:
	case u8Two:
		next = u8One
	case u8Three:
		next = u8Two
	case u8E0:
		lo, next = 0xA0, u8One
	case u8ED:
		hi, next = 0x9F, u8One
	case u8F0:
		lo, next = 0x90, u8Two
	case u8F4:
		hi, next = 0x8F, u8Two
	default:
		return 0, false
	}
	if b >= lo && b <= hi {
		return next, true
	}
	return 0, false
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
}

// stepper advances frames; out collects the resulting stack tops.
type stepper struct {
	a     *arena
	out   []*frame
	depth int // enter recursion, guards grammars that recurse without consuming
}

const maxEnterDepth = 64

// canEnd reports whether f's node is complete (it may be popped).
func canEnd(f *frame) bool {
	n := f.n
	switch n.kind {
	case kLit:
		return n.lit.nodes[f.pos].terminal && (f.mask == 0 || f.mask&(1<<n.lit.term[f.pos]) == 0)
	case kString:
		return f.st == sStrDone
	case kNumber:
		return numComplete(f.st) && (!n.bounded || n.inRange(intValue(f))) && (n.dec == nil || n.dec.ok(decValue(f)))
	case kArray:
		return f.st == sArrDone
	case kObject:
		return f.st == sObjDone
	case kSeq:
		return int(f.st) == len(n.alts)
	case kRepeat:
		return f.cnt >= n.minItems
	case kRoot:
		return f.st == 1
	}
	return false
}

// afterChild returns up with its child (frame c) complete.
func (s *stepper) afterChild(up, c *frame) *frame {
	g := *up
	g.ws = 0
	switch up.n.kind {
	case kArray:
		g.st, g.cnt = sArrAfter, up.cnt+1
		if up.n.unique { // the literal is used: mask holds the used ones
			g.mask |= 1 << c.n.lit.term[c.pos]
		}
	case kObject:
		g.st = sObjAfter
		if up.pos >= 0 {
			g.cnt = up.pos + 1
		}
		g.nkey = up.nkey + 1
	case kSeq:
		g.st = up.st + 1
	case kRepeat:
		g.cnt = up.cnt + 1
	case kRoot:
		g.st = 1
	}
	return s.a.alloc(g)
}

// completes reports whether a stack whose top is f can end the document
// now.
func completes(f *frame) bool {
	if !canEnd(f) {
		return false
	}
	for up := f.up; up != nil; up = up.up {
		switch up.n.kind {
		case kSeq:
			if int(up.st)+1 != len(up.n.alts) {
				return false
			}
		case kRepeat:
			if up.cnt+1 < up.n.minItems {
				return false
			}
		case kRoot:
			return true
		default:
			return false // arrays and objects still need their closing byte
		}
	}
	return true
}

// enter starts node n under up with byte b.
func (s *stepper) enter(n *node, up *frame, b byte) {
	if s.depth > maxEnterDepth {
		return
	}
	s.depth++
	defer func() { s.depth-- }()
	switch n.kind {
	case kNever:
		return
	case kUnion:
		for _, a := range n.alts {
			s.enter(a, up, b)
		}
		return
	}
	f := frame{n: n, up: up}
	if up != nil && up.n.kind == kArray && up.n.unique {
		f.mask = up.mask // the literals used already
		if f.mask == 0 {
			f.mask = 1 << 63 // never a literal's bit (at most 63): "none used", but marked
		}
	}
	s.feed(&f, b)
}

// feed advances the stack top f by b, appending the results to s.out. f
// itself is never kept (only copies), so it may live on the Go stack.
func (s *stepper) feed(f *frame, b byte) {
	s.own(f, b)
	if canEnd(f) && f.up != nil {
		s.feed(s.afterChild(f.up, f), b)
	}
}

func (s *stepper) push(g frame) { s.out = append(s.out, s.a.alloc(g)) }

// own applies f's own transitions on b.
func (s *stepper) own(f *frame, b byte) {
	n := f.n
	switch n.kind {
	case kLit:
		// mask: literals already used (an item of a uniqueItems array).
		if p := n.lit.step(f.pos, b); p >= 0 && (f.mask == 0 || n.lit.below[p]&^f.mask != 0) {
			g := *f
			g.pos = p
			s.push(g)
		}
	case kString:
		s.ownString(f, b)
	case kNumber:
		s.ownNumber(f, b)
	case kArray:
		s.ownArray(f, b)
	case kObject:
		s.ownObject(f, b)
	case kSeq:
		if int(f.st) < len(n.alts) {
			s.enter(n.alts[f.st], s.a.alloc(*f), b)
		}
	case kRepeat:
		if n.maxItems < 0 || f.cnt < n.maxItems {
			s.enter(n.items, s.a.alloc(*f), b)
		}
	case kRoot:
		if f.st == 0 {
			if isWS(b) && !n.tight {
				if f.ws < MaxLeadingSpace {
					g := *f
					g.ws++
					s.push(g)
				}
				return
			}
			g := *f
			g.ws = 0
			s.enter(n.alts[0], s.a.alloc(g), b)
		}
	}
}

func (s *stepper) ownString(f *frame, b byte) {
	n := f.n
	if n.re != nil && (f.st == sStrOpen || !n.re.all[reState(f)]) {
		s.ownStringRe(f, b)
		return
	}
	g := *f
	switch f.st {
	case sStrOpen:
		if b == '"' {
			g.st = sStrBody
			s.push(g)
		}
	case sStrBody:
		if f.u8 > 0 {
			if u, ok := utf8Step(f.u8, b); ok {
				g.u8 = u
				s.push(g)
			}
			return
		}
		switch {
		case b == '"':
			if f.cnt >= n.minLen {
				g.st = sStrDone
				s.push(g)
			}
			return
		case b < 0x20:
			return
		}
		if n.maxLen >= 0 && f.cnt >= n.maxLen {
			return
		}
		if b == '\\' {
			g.st = sStrEsc
			s.push(g)
			return
		}
		u, ok := utf8Step(0, b)
		if !ok {
			return
		}
		g.u8 = u
		if n.minLen > 0 || n.maxLen >= 0 {
			g.cnt++
		}
		s.push(g)
	case sStrEsc:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			g.st = sStrBody
		case 'u':
			g.st = sStrHex
		default:
			return
		}
		if g.st == sStrBody && (n.minLen > 0 || n.maxLen >= 0) {
			g.cnt++
		}
		s.push(g)
	case sStrHexD:
		if b < '0' || b > '7' {
			return
		}
		g.st = sStrHex + 2
		s.push(g)
	case sStrHex, sStrHex + 1, sStrHex + 2, sStrHex + 3:
		if !isHex(b) {
			return
		}
		if f.st == sStrHex && (b == 'd' || b == 'D') {
			g.st = sStrHexD
		} else if f.st == sStrHex+3 {
			g.st = sStrBody
			if n.minLen > 0 || n.maxLen >= 0 {
				g.cnt++
			}
		} else {
			g.st++
		}
		s.push(g)
	}
}

func (s *stepper) ownNumber(f *frame, b byte) {
	if f.cnt >= MaxNumberLen || b == '-' && f.st == sNumStart && f.n.nonNegative {
		return
	}
	st, ok := numNext(f.st, b, f.n.integer)
	if !ok {
		return
	}
	g := *f
	g.cnt++
	g.st = st
	if st == sNumExp {
		g.pos = 1 // exponent digits
		if f.st == sNumExp {
			g.pos = f.pos + 1
		}
		if g.pos > MaxExponentDigits {
			return
		}
	}
	if f.n.bounded && !boundedStep(f, &g, b) {
		return
	}
	if f.n.dec != nil && !decStep(f.n, f, &g, b) {
		return
	}
	s.push(g)
}

// numNext is JSON's number automaton (integer: no fraction or exponent):
// the state after byte b in state st, or false where b cannot follow.
func numNext(st uint8, b byte, integer bool) (uint8, bool) {
	digit := b >= '0' && b <= '9'
	exp := (b == 'e' || b == 'E') && !integer
	switch {
	case st == sNumStart && b == '-':
		return sNumMinus, true
	case (st == sNumStart || st == sNumMinus) && b == '0':
		return sNumZero, true
	case (st == sNumStart || st == sNumMinus || st == sNumInt) && digit:
		return sNumInt, true
	case (st == sNumZero || st == sNumInt) && b == '.' && !integer:
		return sNumDot, true
	case (st == sNumDot || st == sNumFrac) && digit:
		return sNumFrac, true
	case (st == sNumZero || st == sNumInt || st == sNumFrac) && exp:
		return sNumE, true
	case st == sNumE && (b == '+' || b == '-'):
		return sNumESign, true
	case (st == sNumE || st == sNumESign || st == sNumExp) && digit:
		return sNumExp, true
	}
	return 0, false
}

// numComplete reports whether a number in state st is a whole number.
func numComplete(st uint8) bool {
	return st == sNumZero || st == sNumInt || st == sNumFrac || st == sNumExp
}

// A bounded integer's frame keeps its sign in u8 (1: negative), its
// digits in pos and their value in mask.

// boundedStep updates g (f after byte b) and reports whether some integer
// it can still become lies within the node's bounds.
func boundedStep(f, g *frame, b byte) bool {
	n := f.n
	if b == '-' {
		g.u8 = 1
		return !n.hasLo || n.lo <= 0 // at least -0
	}
	g.pos = f.pos + 1
	if g.pos > 18 {
		return false
	}
	g.mask = f.mask*10 + uint64(b-'0')
	if g.st == sNumZero {
		return n.inRange(0)
	}
	v := int64(g.mask)
	for k, p := int32(0), int64(1); g.pos+k <= 18; k, p = k+1, p*10 {
		a, z := v*p, v*p+p-1 // the values with k more digits
		if k == 0 {
			z = a
		}
		if g.u8 == 1 {
			a, z = -z, -a
		}
		if (!n.hasLo || z >= n.lo) && (!n.hasHi || a <= n.hi) {
			return true
		}
	}
	return false
}

func intValue(f *frame) int64 {
	if f.u8 == 1 {
		return -int64(f.mask)
	}
	return int64(f.mask)
}

// ws handles whitespace byte b in a state that allows whitespace: one
// space, or a newline and up to MaxIndent spaces or tabs (see MaxIndent).
func (s *stepper) ws(f *frame, b byte) {
	g := *f
	switch {
	case f.ws == wsNone && b == ' ':
		g.ws = wsSpace
	case f.ws == wsNone && b == '\n':
		g.ws = wsNL
	case f.ws >= wsNL && (b == ' ' || b == '\t') && f.ws-wsNL < MaxIndent:
		g.ws++
	default:
		return
	}
	s.push(g)
}

func (s *stepper) ownArray(f *frame, b byte) {
	n := f.n
	g := *f
	g.ws = 0
	switch f.st {
	case sArrOpen:
		if b == '[' {
			g.st = sArrFirst
			s.push(g)
		}
	case sArrFirst, sArrComma:
		if isWS(b) {
			s.ws(f, b)
			return
		}
		if b == ']' && f.st == sArrFirst {
			if n.minItems <= 0 {
				g.st = sArrDone
				s.push(g)
			}
			return
		}
		if !n.canItem(f.cnt) {
			return
		}
		g.st = sArrItem
		s.enter(n.itemAt(f.cnt), s.a.alloc(g), b)
	case sArrAfter:
		switch {
		case isWS(b):
			s.ws(f, b)
		case b == ',':
			if n.canItem(f.cnt) {
				g.st = sArrComma
				s.push(g)
			}
		case b == ']':
			if f.cnt >= n.minItems {
				g.st = sArrDone
				s.push(g)
			}
		}
	}
}

func (s *stepper) ownObject(f *frame, b byte) {
	n := f.n
	g := *f
	g.ws = 0
	switch f.st {
	case sObjOpen:
		if b == '{' {
			g.st = sObjFirst
			s.push(g)
		}
	case sObjFirst, sObjComma:
		switch {
		case isWS(b):
			s.ws(f, b)
		case b == '"':
			allowed, add := n.nextKeys(f)
			if allowed == 0 && !add {
				return
			}
			g.st, g.pos, g.u8 = sObjKey, 0, 0
			g.mask = allowed
			if add {
				g.mask = allMask(len(n.props))
			}
			s.push(g)
		case b == '}' && f.st == sObjFirst:
			if n.closable[f.cnt] && f.nkey >= n.minProps {
				g.st = sObjDone
				s.push(g)
			}
		}
	case sObjKey:
		s.objKey(f, b)
	case sObjColon:
		switch {
		case isWS(b):
			s.ws(f, b)
		case b == ':':
			g.st = sObjValue
			s.push(g)
		}
	case sObjValue:
		if isWS(b) {
			s.ws(f, b)
			return
		}
		child := n.additional
		if f.pos >= 0 {
			child = n.props[f.pos].node
		}
		g.st = sObjChild
		s.enter(child, s.a.alloc(g), b)
	case sObjAfter:
		switch {
		case isWS(b):
			s.ws(f, b)
		case b == ',':
			if allowed, add := n.nextKeys(f); allowed != 0 || add {
				g.st = sObjComma
				s.push(g)
			}
		case b == '}':
			if n.closable[f.cnt] && f.nkey >= n.minProps {
				g.st = sObjDone
				s.push(g)
			}
		}
	}
}

func allMask(k int) uint64 {
	if k >= 64 {
		return ^uint64(0)
	}
	return 1<<k - 1
}

// objKey advances a key. mask holds the declared names the key is still a
// prefix of (with additionalProperties: all of them, to refuse a key equal
// to one; without: only those allowed next).
func (s *stepper) objKey(f *frame, b byte) {
	n := f.n
	g := *f
	quoted := false // a declared name continues with an escaped quote
	for r := f.mask; r != 0; r &= r - 1 {
		k := n.props[bits.TrailingZeros64(r)].key
		if int(f.pos) < len(k) && k[f.pos] == '"' {
			quoted = true
		}
	}
	if b == '"' && !quoted && (f.u8 == 0 || f.u8 == noAdd) {
		// Close: an exact declared name, or an additional key.
		allowed, add := n.nextKeys(f)
		exact := -1
		for m := f.mask; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m)
			if int(f.pos) == len(n.props[i].key) {
				exact = i
				break
			}
		}
		switch {
		case exact >= 0 && allowed&(1<<exact) != 0:
			g.pos = int32(exact)
		case exact >= 0:
			return // a declared name out of order, or again
		case add && f.u8 == 0:
			g.pos = -1
		default:
			return
		}
		g.st, g.mask, g.u8 = sObjColon, 0, 0
		s.push(g)
		return
	}
	var m uint64
	for r := f.mask; r != 0; r &= r - 1 {
		i := bits.TrailingZeros64(r)
		k := n.props[i].key
		if int(f.pos) < len(k) && k[f.pos] == b {
			m |= 1 << i
		}
	}
	g.mask = m
	g.pos = f.pos + 1
	allowed, add := n.nextKeys(f)
	declaredOK := m&allowed != 0
	if add && f.u8 != noAdd && b >= 0x20 && b != '\\' && b != '"' {
		if u, ok := utf8Step(f.u8, b); ok {
			g.u8 = u
			s.push(g)
			return
		}
	}
	if declaredOK {
		g.u8 = noAdd // only a declared name from here: compared bytewise
		s.push(g)
	}
}

// noAdd in an object key's u8 marks a key that can no longer be an
// additional one (it has taken a byte only a declared name allows).
const noAdd = 0xFF

// A string with a pattern or format keeps in mask its automaton state
// (low 32 bits) and, inside a multi-byte character or a \u escape, the
// code point so far (bits 32-52) and the character's UTF-8 length (bits
// 56-58); cnt counts code points when a length bound is left to count.
// Once the automaton is in a state that accepts everything, the string
// goes on as a plain one (ownString).

func reState(f *frame) int32 { return int32(uint32(f.mask)) }
func reAcc(f *frame) rune    { return rune(f.mask >> 32 & 0x1FFFFF) }

func reSet(g *frame, st int32, acc rune, l int) {
	g.mask = uint64(uint32(st)) | uint64(acc)<<32 | uint64(l)<<56
}

var utf8Min = [5]rune{0, 0, 0x80, 0x800, 0x10000}

// utf8Left is the continuation bytes still expected in UTF-8 state u.
var utf8Left = [numU8]int{u8One: 1, u8Two: 2, u8Three: 3, u8E0: 2, u8ED: 2, u8F0: 3, u8F4: 3}

// utf8Span is the code points a character of l bytes can become with acc
// its value so far and left bytes to come.
func utf8Span(acc rune, left, l int) (lo, hi rune) {
	lo = acc << (6 * left)
	hi = lo | (1<<(6*left) - 1)
	return max(lo, utf8Min[l]), min(hi, 0x10FFFF)
}

// reTo is the state after code point r from st, -1 when r cannot come
// (or the length bound left cannot be met after it).
func reTo(n *node, st int32, r rune, cnt1 int32) int32 {
	t := n.re.step(st, r)
	if t >= 0 && (n.minLen > 0 || n.maxLen >= 0) && !n.re.fits(t, cnt1, n.minLen, n.maxLen) {
		return -1
	}
	return t
}

// reCan reports whether some code point in [lo, hi] can come from st.
func reCan(n *node, st int32, lo, hi rune, cnt1 int32) bool {
	d := n.re
	counted := n.minLen > 0 || n.maxLen >= 0
	row := d.trans[int(st)*d.ncls : int(st+1)*d.ncls]
	for c := d.class(lo); c < d.ncls && d.bounds[c] <= hi; c++ {
		if t := row[c]; t >= 0 && (!counted || d.fits(t, cnt1, n.minLen, n.maxLen)) {
			return true
		}
	}
	return false
}

func (s *stepper) ownStringRe(f *frame, b byte) {
	n := f.n
	g := *f
	st := reState(f)
	cnt1 := f.cnt + 1
	done := func(t int32) { // a code point taken: to state t
		reSet(&g, t, 0, 0)
		g.st, g.u8 = sStrBody, 0
		if n.minLen > 0 || n.maxLen >= 0 {
			g.cnt = cnt1
		}
		s.push(g)
	}
	switch f.st {
	case sStrOpen:
		if b == '"' {
			g.st, g.cnt = sStrBody, 0
			reSet(&g, n.re.start, 0, 0)
			s.push(g)
		}
	case sStrBody:
		switch {
		case f.u8 == 0 && b == '"':
			if n.re.accept[st] && f.cnt >= n.minLen {
				g.st = sStrDone
				s.push(g)
			}
		case f.u8 == 0 && b < 0x20:
		case f.u8 == 0 && b == '\\':
			if reCan(n, st, 0, 0xFFFF, cnt1) { // what an escape can spell
				g.st = sStrEsc
				s.push(g)
			}
		default:
			if g, ok := reBody(f, b); ok {
				s.push(g)
			}
		}
	case sStrEsc:
		var r rune
		switch b {
		case '"', '\\', '/':
			r = rune(b)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			g.st = sStrHex
			reSet(&g, st, 0, 0)
			s.push(g) // the escape was allowed: some BMP code point can come
			return
		default:
			return
		}
		if t := reTo(n, st, r, cnt1); t >= 0 {
			done(t)
		}
	case sStrHexD:
		if b < '0' || b > '7' {
			return
		}
		acc := rune(0xD<<4 | (b - '0'))
		if reCan(n, st, acc<<8, acc<<8|0xFF, cnt1) {
			g.st = sStrHex + 2
			reSet(&g, st, acc, 0)
			s.push(g)
		}
	case sStrHex, sStrHex + 1, sStrHex + 2, sStrHex + 3:
		if !isHex(b) {
			return
		}
		acc := reAcc(f)<<4 | hexVal(b)
		k := f.st - sStrHex
		switch {
		case k == 0 && acc == 0xD:
			if reCan(n, st, 0xD000, 0xD7FF, cnt1) {
				g.st = sStrHexD
				reSet(&g, st, acc, 0)
				s.push(g)
			}
		case k == 3:
			if t := reTo(n, st, acc, cnt1); t >= 0 {
				done(t)
			}
		default:
			left := 4 * (3 - int(k))
			if reCan(n, st, acc<<left, acc<<left|(1<<left-1), cnt1) {
				g.st++
				reSet(&g, st, acc, 0)
				s.push(g)
			}
		}
	}
}

// reBody is the frame after string-body byte b (not a quote, backslash
// or control byte between characters) in pattern string frame f, false
// when b cannot come. The mask walk calls it directly (walkRe).
func reBody(f *frame, b byte) (frame, bool) {
	n := f.n
	g := *f
	st := reState(f)
	cnt1 := f.cnt + 1
	if f.u8 > 0 {
		u, ok := utf8Step(f.u8, b)
		if !ok {
			return g, false
		}
		l := int(f.mask >> 56 & 7)
		acc := reAcc(f)<<6 | rune(b&0x3F)
		if u == u8None {
			t := reTo(n, st, acc, cnt1)
			if t < 0 {
				return g, false
			}
			reSet(&g, t, 0, 0)
			g.u8 = 0
			if n.minLen > 0 || n.maxLen >= 0 {
				g.cnt = cnt1
			}
			return g, true
		}
		if lo, hi := utf8Span(acc, utf8Left[u], l); !reCan(n, st, lo, hi, cnt1) {
			return g, false
		}
		g.u8 = u
		reSet(&g, st, acc, l)
		return g, true
	}
	if b < 0x80 {
		t := reTo(n, st, rune(b), cnt1)
		if t < 0 {
			return g, false
		}
		reSet(&g, t, 0, 0)
		if n.minLen > 0 || n.maxLen >= 0 {
			g.cnt = cnt1
		}
		return g, true
	}
	u, ok := utf8Step(u8None, b)
	if !ok {
		return g, false
	}
	l, acc := 2, rune(b&0x1F)
	switch {
	case b >= 0xF0:
		l, acc = 4, rune(b&0x07)
	case b >= 0xE0:
		l, acc = 3, rune(b&0x0F)
	}
	if lo, hi := utf8Span(acc, l-1, l); !reCan(n, st, lo, hi, cnt1) {
		return g, false
	}
	g.u8 = u
	reSet(&g, st, acc, l)
	return g, true
}

func hexVal(b byte) rune {
	switch {
	case b >= 'a':
		return rune(b-'a') + 10
	case b >= 'A':
		return rune(b-'A') + 10
	}
	return rune(b - '0')
}

// nextKeys returns the declared properties that may come next in object
// frame f (a bit per index) and whether an additional one may: those the
// order allows, less, under minProperties/maxProperties, those after
// which the count could no longer be met.
func (n *node) nextKeys(f *frame) (uint64, bool) {
	allowed, add := n.allowed[f.cnt], n.additional != nil
	if n.minProps <= 0 && n.maxProps < 0 {
		return allowed, add
	}
	k1 := f.nkey + 1
	if n.maxProps >= 0 && k1+n.reqAfter[f.cnt] > n.maxProps {
		add = false // the required ones still to come would not fit
	}
	for r := allowed; r != 0; r &= r - 1 {
		i := bits.TrailingZeros64(r)
		if n.maxProps >= 0 && k1+n.reqAfter[i+1] > n.maxProps ||
			n.minProps > k1 && n.additional == nil && k1+n.availAfter[i+1] < n.minProps {
			allowed &^= 1 << i
		}
	}
	return allowed, add
}
