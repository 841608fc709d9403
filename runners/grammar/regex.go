package grammar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"regexp/syntax"
	"slices"
	"sort"
	"unicode"
)

// Patterns and formats are regular languages over the code points of a
// string's value (after JSON unescaping). Each is parsed with Go's
// regexp/syntax (RE2 syntax, Perl flags: `^` and `$` anchor the whole
// value; JSON Schema's pattern is a search, so an unanchored pattern may
// match anywhere in the value), and determinized when the schema is
// compiled: a DFA over classes of code points, with minLength/maxLength
// folded in, states that cannot reach an accepting state removed, bounded
// in states and transitions (past the bounds the schema is refused). The
// automaton then refuses, byte by byte, every byte after which no string
// of the language can be completed: inside a multi-byte character or a
// \u escape it checks the range of code points the bytes so far can
// still become.

// MaxPatternLen bounds the bytes of one pattern.
const MaxPatternLen = 4096

// MaxPatternStates bounds the DFA states of one pattern or format (with
// its minLength/maxLength folded in).
const MaxPatternStates = 4096

const (
	maxProgInsts   = 20000   // instructions of one compiled pattern
	maxTransitions = 1 << 21 // states x classes of one pattern
	maxSchemaCells = 1 << 22 // transitions of all the patterns of one schema
	maxPatternWork = 1 << 24 // instruction visits determinizing one pattern
)

// ErrPatternTooComplex is wrapped by Compile for a pattern past the bounds.
var ErrPatternTooComplex = errors.New("pattern too complex")

// dfa is a determinized pattern. Immutable but for its token tables,
// which are locked.
type dfa struct {
	bounds []rune // class c is the code points [bounds[c], bounds[c+1])
	ascii  [128]uint16
	ncls   int
	trans  []int32       // [state*ncls + class]: the next state, -1 where nothing can follow
	accept []bool        // the value may end here
	all    []bool        // every continuation stays here and is accepted
	loop   [][2]uint64   // per state: the ASCII string-body bytes that keep it there
	chain  [][][2]uint64 // per state: see prune
	minRem []int32       // the fewest code points to an accepting state
	maxRem []int32       // the most code points to an accepting state, -1: no most
	start  int32         // -1: the language is empty

	tables bodyTables // token tables of its states (bodytable.go), made as masks need them
}

func (d *dfa) class(r rune) int {
	if r < 128 {
		return int(d.ascii[r])
	}
	return sort.Search(len(d.bounds), func(i int) bool { return d.bounds[i] > r }) - 1
}

func (d *dfa) step(s int32, r rune) int32 { return d.trans[int(s)*d.ncls+d.class(r)] }

// anyIn reports whether some code point in [lo, hi] can follow in state s.
func (d *dfa) anyIn(s int32, lo, hi rune) bool {
	if hi > unicode.MaxRune {
		hi = unicode.MaxRune
	}
	row := d.trans[int(s)*d.ncls : int(s+1)*d.ncls]
	for c := d.class(lo); c < d.ncls && d.bounds[c] <= hi; c++ {
		if row[c] >= 0 {
			return true
		}
	}
	return false
}

// allIn reports whether every code point in [lo, hi] (surrogates aside)
// leads from s to a state that accepts everything.
func (d *dfa) allIn(s int32, lo, hi rune) bool {
	row := d.trans[int(s)*d.ncls : int(s+1)*d.ncls]
	for c := d.class(lo); c < d.ncls && d.bounds[c] <= hi; c++ {
		if isSurrogate(d.bounds[c]) {
			continue
		}
		if t := row[c]; t < 0 || !d.all[t] {
			return false
		}
	}
	return true
}

func isSurrogate(r rune) bool { return r >= 0xD800 && r < 0xE000 }

// compileRegex determinizes pattern for values of code point lengths in
// [minLen, maxLen] (maxLen < 0: none). A bound every value of the pattern
// meets is dropped; one bound left is returned (the other is 0 or -1) for
// the matcher to count against the automaton's distances (minRem,
// maxRem); two are folded into the states.
func compileRegex(pattern string, minLen, maxLen int32) (d *dfa, lo, hi int32, err error) {
	if len(pattern) > MaxPatternLen {
		return nil, 0, -1, fmt.Errorf("%w: longer than %d bytes", ErrPatternTooComplex, MaxPatternLen)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, 0, -1, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, 0, -1, err
	}
	if len(prog.Inst) > maxProgInsts {
		return nil, 0, -1, fmt.Errorf("%w: %d instructions (at most %d)", ErrPatternTooComplex, len(prog.Inst), maxProgInsts)
	}
	for _, in := range prog.Inst {
		if in.Op == syntax.InstEmptyWidth && syntax.EmptyOp(in.Arg)&^(syntax.EmptyBeginText|syntax.EmptyEndText) != 0 {
			return nil, 0, -1, &UnsupportedError{Keywords: []string{`pattern with \b, \B or multi-line ^/$`}}
		}
	}
	if d, err = determinize(prog, 0, -1); err != nil || d.start < 0 {
		return d, 0, -1, err
	}
	short, long := d.minRem[d.start], d.maxRem[d.start]
	if minLen <= short {
		minLen = 0
	}
	if maxLen >= 0 && long >= 0 && long <= maxLen {
		maxLen = -1
	}
	if minLen == 0 || maxLen < 0 {
		return d, minLen, maxLen, nil
	}
	d, err = determinize(prog, minLen, maxLen)
	return d, 0, -1, err
}

// fits reports whether a value that has n code points on entering state
// t can still end within [minLen, maxLen] (the bounds compileRegex left).
func (d *dfa) fits(t, n, minLen, maxLen int32) bool {
	if maxLen >= 0 && n+d.minRem[t] > maxLen {
		return false
	}
	return n >= minLen || d.maxRem[t] < 0 || n+d.maxRem[t] >= minLen
}

// determinizer is the subset construction over a syntax.Prog: a state is
// the set of rune instructions the text so far can be at (the start is
// added at every position, since a pattern is a search), whether the text
// matches whatever follows (a Match reached), whether it matches if it
// ends here, and the code points so far (capped: up to maxLen, or minLen
// when there is no maxLen).
type determinizer struct {
	prog   *syntax.Prog
	d      *dfa
	minLen int32
	maxLen int32
	ranges [][]int32 // per rune instruction: its class intervals [c0, c1]
	index  map[string]int32
	sets   []dstate
	work   int
	mark   []uint32
	gen    uint32
	stack  []uint32
}

type dstate struct {
	runes   []uint32 // sorted rune instruction pcs (nil when matched)
	matched bool
	count   int32
}

func determinize(prog *syntax.Prog, minLen, maxLen int32) (*dfa, error) {
	z := &determinizer{prog: prog, d: &dfa{}, minLen: minLen, maxLen: maxLen, index: map[string]int32{}, mark: make([]uint32, len(prog.Inst))}
	z.classes()
	if z.d.ncls > 1<<15 {
		return nil, fmt.Errorf("%w: %d classes of characters (at most %d)", ErrPatternTooComplex, z.d.ncls, 1<<15)
	}
	first, err := z.closure([]uint32{uint32(prog.Start)}, true)
	if err != nil {
		return nil, err
	}
	first.count = 0
	z.d.start = z.intern(first, true)
	for s := 0; s < len(z.sets); s++ {
		if err := z.expand(int32(s)); err != nil {
			return nil, err
		}
	}
	z.prune()
	return z.d, nil
}

// classes partitions the code points by every range boundary of the
// program (and the surrogates, which no JSON string can hold).
func (z *determinizer) classes() {
	bs := []rune{0, 0xD800, 0xE000, unicode.MaxRune + 1}
	rs := make([][]rune, len(z.prog.Inst))
	for pc, in := range z.prog.Inst {
		rs[pc] = instRanges(&in)
		for i := 0; i+1 < len(rs[pc]); i += 2 {
			bs = append(bs, rs[pc][i], rs[pc][i+1]+1)
		}
	}
	slices.Sort(bs)
	bs = slices.Compact(bs)
	d := z.d
	d.bounds = bs
	d.ncls = len(bs) - 1
	for r := rune(0); r < 128; r++ {
		d.ascii[r] = uint16(sort.Search(len(bs), func(i int) bool { return bs[i] > r }) - 1)
	}
	z.ranges = make([][]int32, len(z.prog.Inst))
	for pc, r := range rs {
		for i := 0; i+1 < len(r); i += 2 {
			z.ranges[pc] = append(z.ranges[pc], int32(d.class(r[i])), int32(d.class(r[i+1])))
		}
	}
}

// instRanges returns the code point ranges (lo, hi pairs) a rune
// instruction matches, nil for other instructions.
func instRanges(in *syntax.Inst) []rune {
	switch in.Op {
	case syntax.InstRune1:
		return []rune{in.Rune[0], in.Rune[0]}
	case syntax.InstRuneAny:
		return []rune{0, unicode.MaxRune}
	case syntax.InstRuneAnyNotNL:
		return []rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}
	case syntax.InstRune:
		if len(in.Rune) != 1 {
			return in.Rune
		}
		r := in.Rune[0]
		rs := []rune{r}
		if syntax.Flags(in.Arg)&syntax.FoldCase != 0 {
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				rs = append(rs, f)
			}
		}
		slices.Sort(rs)
		out := make([]rune, 0, 2*len(rs))
		for _, x := range rs {
			out = append(out, x, x)
		}
		return out
	}
	return nil
}

func isRuneInst(op syntax.InstOp) bool {
	return op == syntax.InstRune || op == syntax.InstRune1 || op == syntax.InstRuneAny || op == syntax.InstRuneAnyNotNL
}

// closure follows the empty transitions from pcs at the start of the
// text (atStart) or later, returning the rune instructions reached and
// whether Match is (then the value matches whatever follows: the state
// has no rune instructions).
func (z *determinizer) closure(pcs []uint32, atStart bool) (dstate, error) {
	var st dstate
	z.gen++
	z.stack = append(z.stack[:0], pcs...)
	for len(z.stack) > 0 {
		pc := z.stack[len(z.stack)-1]
		z.stack = z.stack[:len(z.stack)-1]
		if z.mark[pc] == z.gen {
			continue
		}
		z.mark[pc] = z.gen
		if z.work++; z.work > maxPatternWork {
			return st, fmt.Errorf("%w: determinizing it takes more than %d steps", ErrPatternTooComplex, maxPatternWork)
		}
		in := &z.prog.Inst[pc]
		switch {
		case in.Op == syntax.InstMatch:
			return dstate{matched: true}, nil
		case in.Op == syntax.InstAlt || in.Op == syntax.InstAltMatch:
			z.stack = append(z.stack, in.Out, in.Arg)
		case in.Op == syntax.InstNop || in.Op == syntax.InstCapture:
			z.stack = append(z.stack, in.Out)
		case in.Op == syntax.InstEmptyWidth:
			op := syntax.EmptyOp(in.Arg)
			if op&syntax.EmptyBeginText != 0 && !atStart {
				continue
			}
			if op&syntax.EmptyEndText != 0 {
				st.runes = append(st.runes, pc) // kept: it decides whether the value may end here
				continue
			}
			z.stack = append(z.stack, in.Out)
		case isRuneInst(in.Op):
			st.runes = append(st.runes, pc)
		}
	}
	slices.Sort(st.runes)
	return st, nil
}

// endsHere reports whether the value matches if it ends in a state with
// these instructions: an end-of-text assertion among them leads to Match
// through empty transitions.
func (z *determinizer) endsHere(st dstate, atStart bool) bool {
	if st.matched {
		return true
	}
	z.gen++
	z.stack = z.stack[:0]
	for _, pc := range st.runes {
		if z.prog.Inst[pc].Op == syntax.InstEmptyWidth {
			z.stack = append(z.stack, z.prog.Inst[pc].Out)
		}
	}
	for len(z.stack) > 0 {
		pc := z.stack[len(z.stack)-1]
		z.stack = z.stack[:len(z.stack)-1]
		if z.mark[pc] == z.gen {
			continue
		}
		z.mark[pc] = z.gen
		z.work++
		in := &z.prog.Inst[pc]
		switch in.Op {
		case syntax.InstMatch:
			return true
		case syntax.InstAlt, syntax.InstAltMatch:
			z.stack = append(z.stack, in.Out, in.Arg)
		case syntax.InstNop, syntax.InstCapture:
			z.stack = append(z.stack, in.Out)
		case syntax.InstEmptyWidth:
			if syntax.EmptyOp(in.Arg)&syntax.EmptyBeginText == 0 || atStart {
				z.stack = append(z.stack, in.Out)
			}
		}
	}
	return false
}

func (z *determinizer) intern(st dstate, atStart bool) int32 {
	flags := byte(0) // flags and count first: the pcs run to the end
	if st.matched {
		flags |= 1
	}
	if atStart {
		flags |= 2
	}
	key := binary.AppendVarint([]byte{flags}, int64(st.count))
	for _, pc := range st.runes {
		key = binary.AppendUvarint(key, uint64(pc))
	}
	if s, ok := z.index[string(key)]; ok {
		return s
	}
	s := int32(len(z.sets))
	z.index[string(key)] = s
	z.sets = append(z.sets, st)
	d := z.d
	d.accept = append(d.accept, z.endsHere(st, atStart) && st.count >= z.minLen)
	d.trans = append(d.trans, make([]int32, d.ncls)...)
	return s
}

// expand computes state s's transitions.
func (z *determinizer) expand(s int32) error {
	d := z.d
	if len(z.sets) > MaxPatternStates || len(d.trans) > maxTransitions {
		return fmt.Errorf("%w: more than %d states or %d transitions", ErrPatternTooComplex, MaxPatternStates, maxTransitions)
	}
	st := z.sets[s]
	count := st.count + 1
	switch {
	case z.maxLen >= 0 && count > z.maxLen:
		count = -1
	case z.maxLen < 0 && count > z.minLen:
		count = z.minLen
	}
	row := int(s) * d.ncls
	for c := range d.ncls {
		d.trans[row+c] = -1
	}
	if count < 0 {
		return nil
	}
	// The instructions each class leads to.
	outs := make([][]uint32, d.ncls)
	if !st.matched {
		for _, pc := range st.runes {
			in := &z.prog.Inst[pc]
			if !isRuneInst(in.Op) {
				continue
			}
			rs := z.ranges[pc]
			for i := 0; i+1 < len(rs); i += 2 {
				for c := rs[i]; c <= rs[i+1]; c++ {
					outs[c] = append(outs[c], in.Out)
					z.work++
				}
			}
		}
	}
	memo := map[string]int32{}
	var key []byte
	for c := range d.ncls {
		if isSurrogate(d.bounds[c]) {
			continue
		}
		var next dstate
		if st.matched {
			next = dstate{matched: true}
		} else {
			key = key[:0]
			for _, o := range outs[c] {
				key = binary.AppendUvarint(key, uint64(o))
			}
			if t, ok := memo[string(key)]; ok {
				d.trans[int(s)*d.ncls+c] = t
				continue
			}
			var err error
			if next, err = z.closure(append(outs[c], uint32(z.prog.Start)), false); err != nil {
				return err
			}
		}
		next.count = count
		t := z.intern(next, false)
		d.trans[int(s)*d.ncls+c] = t
		if !st.matched {
			memo[string(key)] = t
		}
		if z.work > maxPatternWork {
			return fmt.Errorf("%w: determinizing it takes more than %d steps", ErrPatternTooComplex, maxPatternWork)
		}
	}
	return nil
}

// prune removes the transitions into states that cannot reach an
// accepting state, and marks the states that accept everything.
func (z *determinizer) prune() {
	d := z.d
	n := len(z.sets)
	rev := make([][]int32, n)
	for s := range n {
		for c := range d.ncls {
			if t := d.trans[s*d.ncls+c]; t >= 0 {
				rev[t] = append(rev[t], int32(s))
			}
		}
	}
	live := make([]bool, n)
	var q []int32
	for s := range n {
		if d.accept[s] {
			live[s] = true
			q = append(q, int32(s))
		}
	}
	for len(q) > 0 {
		t := q[len(q)-1]
		q = q[:len(q)-1]
		for _, s := range rev[t] {
			if !live[s] {
				live[s] = true
				q = append(q, s)
			}
		}
	}
	d.all = make([]bool, n)
	for s := range n {
		all := d.accept[s]
		for c := range d.ncls {
			i := s*d.ncls + c
			if t := d.trans[i]; t >= 0 && !live[t] {
				d.trans[i] = -1
			}
			if !isSurrogate(d.bounds[c]) && d.trans[i] != int32(s) {
				all = false
			}
		}
		d.all[s] = all
	}
	if !live[d.start] {
		d.start = -1
		return
	}
	d.distances(rev, live)
	d.loop = make([][2]uint64, n)
	// next[s]: the state most ASCII body bytes lead to from s, sets[s]
	// those bytes.
	next := make([]int32, n)
	sets := make([][2]uint64, n)
	for s := range n {
		next[s] = -1
		cnt := map[int32]int{}
		for b := 0x20; b < 0x80; b++ {
			if b == '"' || b == '\\' {
				continue
			}
			t := d.trans[s*d.ncls+int(d.ascii[b])]
			if t == int32(s) {
				d.loop[s][b>>6] |= 1 << (b & 63)
			}
			if t >= 0 {
				if cnt[t]++; next[s] < 0 || cnt[t] > cnt[next[s]] || cnt[t] == cnt[next[s]] && t < next[s] {
					next[s] = t
				}
			}
		}
		for b := 0x20; b < 0x80; b++ {
			if b != '"' && b != '\\' && next[s] >= 0 && d.trans[s*d.ncls+int(d.ascii[b])] == next[s] {
				sets[s][b>>6] |= 1 << (b & 63)
			}
		}
	}
	// chain[s][k-1]: the bytes any k of which in a row are taken from s,
	// each step along the state most bytes lead to (an email's counted
	// atom, a host name's label).
	d.chain = make([][][2]uint64, n)
	for s := range n {
		acc := [2]uint64{^uint64(0), ^uint64(0)}
		for cur, k := int32(s), 0; k < maxChain && cur >= 0 && next[cur] >= 0; k++ {
			acc[0] &= sets[cur][0]
			acc[1] &= sets[cur][1]
			if acc[0]|acc[1] == 0 {
				break
			}
			d.chain[s] = append(d.chain[s], acc)
			cur = next[cur]
		}
	}
}

// maxChain bounds the chains kept per state (a token's bytes rarely
// exceed it).
const maxChain = 32

// distances fills minRem and maxRem (over the pruned automaton: every
// state left reaches an accepting one).
func (d *dfa) distances(rev [][]int32, live []bool) {
	n := len(d.accept)
	d.minRem = make([]int32, n)
	d.maxRem = make([]int32, n)
	var q []int32
	for s := range n {
		d.minRem[s] = -1
		if d.accept[s] {
			d.minRem[s] = 0
			q = append(q, int32(s))
		}
	}
	for len(q) > 0 {
		t := q[0]
		q = q[1:]
		for _, s := range rev[t] {
			if live[s] && d.minRem[s] < 0 {
				d.minRem[s] = d.minRem[t] + 1
				q = append(q, s)
			}
		}
	}
	// Longest: a state that reaches a cycle has none; the others take
	// the longest path over the acyclic rest (post-order of a DFS).
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, n)
	type item struct{ s, c int32 }
	for root := range n {
		if color[root] != white || !live[root] {
			continue
		}
		stack := []item{{int32(root), 0}}
		color[root] = grey
		d.maxRem[root] = -2 // not known yet
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			s := top.s
			if int(top.c) < d.ncls {
				t := d.trans[int(s)*d.ncls+int(top.c)]
				top.c++
				if t < 0 {
					continue
				}
				switch color[t] {
				case white:
					color[t] = grey
					d.maxRem[t] = -2
					stack = append(stack, item{t, 0})
				case grey:
					d.maxRem[s] = -1 // on a cycle
				}
				continue
			}
			// All successors done: combine.
			if d.maxRem[s] != -1 {
				best := int32(-2)
				if d.accept[s] {
					best = 0
				}
				for c := range d.ncls {
					t := d.trans[int(s)*d.ncls+c]
					if t < 0 {
						continue
					}
					if d.maxRem[t] == -1 {
						best = -1
						break
					}
					if d.maxRem[t]+1 > best {
						best = d.maxRem[t] + 1
					}
				}
				d.maxRem[s] = best
			}
			color[s] = black
			stack = stack[:len(stack)-1]
		}
	}
}

// Formats: the values each generates (a subset of what the format allows
// where the exact language is not regular or not worth its states, noted
// per format).
var formatPatterns = map[string]string{
	"date":      `^` + reDate + `$`,
	"time":      `^` + reTime + `$`,
	"date-time": `^` + reDate + `T` + reTime + `$`,
	// ISO 8601 durations as RFC 3339's appendix A has them.
	"duration": `^P(?:[0-9]+W|(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:T` + reDurTime + `)?|T` + reDurTime + `)$`,
	// Dot-atom local parts (three atoms of up to 20 characters) at a
	// host name of up to four labels of up to 46 characters: within the
	// 64- and 254-character limits.
	"email":    `^` + reAtom + `(?:\.` + reAtom + `){0,2}@` + reLabel46 + `(?:\.` + reLabel46 + `){0,3}$`,
	"hostname": `^` + reHostname + `$`,
	"ipv4":     `^` + reIPv4 + `$`,
	// Hex groups, with one "::" at most (no embedded IPv4, no zone).
	"ipv6": `^(?:` + reIPv6 + `)$`,
	"uuid": `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`,
	// An absolute URI: a scheme, then a host name and optional port
	// after "//", or an opaque part; then path, query and fragment of
	// unreserved, sub-delimiter and percent-encoded characters.
	"uri": `^[A-Za-z][A-Za-z0-9+.-]*:(?://` + reHostname + `(?::[0-9]{1,5})?(?:/` + rePchar + `*)*|` + rePchar + `+(?:/` + rePchar + `*)*)(?:\?(?:` + rePchar + `|[/?])*)?(?:#(?:` + rePchar + `|[/?])*)?$`,
}

const (
	// Days per month, February 29 in leap years (of the Gregorian rule).
	reDate = `(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)`
	// No leap second; at most 9 fraction digits.
	reTime     = `(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])`
	reDurTime  = `(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)`
	reAtom     = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,20}"
	reLabel46  = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,44}[A-Za-z0-9])?`
	reLabel62  = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?`
	reHostname = reLabel62 + `(?:\.` + reLabel62 + `){0,3}` // at most 251 characters
	reIPv4oct  = `(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
	reIPv4     = reIPv4oct + `\.` + reIPv4oct + `\.` + reIPv4oct + `\.` + reIPv4oct
	reH        = `[0-9a-fA-F]{1,4}`
	reIPv6     = `(?:` + reH + `:){7}` + reH +
		`|(?:` + reH + `:){1,7}:` +
		`|(?:` + reH + `:){1,6}:` + reH +
		`|(?:` + reH + `:){1,5}(?::` + reH + `){1,2}` +
		`|(?:` + reH + `:){1,4}(?::` + reH + `){1,3}` +
		`|(?:` + reH + `:){1,3}(?::` + reH + `){1,4}` +
		`|(?:` + reH + `:){1,2}(?::` + reH + `){1,5}` +
		`|` + reH + `:(?::` + reH + `){1,6}` +
		`|:(?::` + reH + `){1,7}|::`
	rePchar = `(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})`
)

// formatDFA compiles format name's language (with length bounds as
// compileRegex takes them); formats caches the unbounded automata of one
// schema (a schema that uses a format many times determinizes it once).
func formatDFA(formats map[string]*dfa, name string, minLen, maxLen int32) (d *dfa, lo, hi int32, err error) {
	p, ok := formatPatterns[name]
	if !ok {
		return nil, 0, -1, &UnsupportedError{Keywords: []string{"format " + name}}
	}
	if minLen == 0 && maxLen < 0 {
		if d := formats[name]; d != nil {
			return d, 0, -1, nil
		}
	}
	if d, lo, hi, err = compileRegex(p, minLen, maxLen); err == nil && minLen == 0 && maxLen < 0 {
		formats[name] = d
	}
	return d, lo, hi, err
}
