package grammar

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
)

// Vocab is a byte trie over a vocabulary: each token's decoded bytes (what
// it adds to the text), so byte-level BPE and SentencePiece vocabularies
// look alike. Tokens left out (special tokens, tokens that decode to
// nothing) are never allowed by a mask; end-of-generation tokens are
// allowed exactly when the document is complete. A Vocab is immutable and
// shared by all generations of a model.
type Vocab struct {
	size  int
	eos   []int32
	bytes [][]byte // per id; nil when left out

	special map[int32][]byte // tokens left out of the trie, by id: only a tool-call wrapper may spell them

	nodes  []tnode
	edgeB  []byte
	edgeTo []int32
	order  []int32 // token ids in trie (sorted-bytes) order

	// plainSet[u]: the tokens made only of string-body bytes from UTF-8
	// state u; a mask in a free string starts from it and walks only the
	// rest of the trie.
	plainSet [numU8][]uint64

	// below[n]: the ASCII bytes on the paths under trie node n (bit 0
	// also for any byte >= 0x80, which no pattern loop mask holds), and
	// deep[n] their most bytes (capped at 255): a pattern state that
	// loops on every byte below takes the whole subtree (walkASCII).
	below [][2]uint64
	deep  []uint8
}

type tnode struct {
	e0, e1 int32 // edges [e0, e1)
	t0     int32 // order[t0:tEnd]: tokens ending here; order[t0:s1]: the subtree's
	tEnd   int32
	s1     int32
	plain  uint8 // bit u: every byte path below is string-body bytes from UTF-8 state u (numU8 = 8 states)
}

// NewVocab builds the trie. bytesOf returns token id's decoded bytes;
// leave reports tokens to leave out (may be nil); eos lists the
// end-of-generation ids (left out of the trie whatever leave says).
func NewVocab(size int, bytesOf func(id int32) []byte, leave func(id int32) bool, eos []int32) (*Vocab, error) {
	if size <= 0 {
		return nil, errors.New("grammar: empty vocabulary")
	}
	v := &Vocab{size: size, eos: slices.Clone(eos), bytes: make([][]byte, size)}
	for _, e := range eos {
		if e < 0 || int(e) >= size {
			return nil, fmt.Errorf("grammar: end-of-generation id %d outside the vocabulary of %d", e, size)
		}
	}
	var ids []int32
	for id := int32(0); int(id) < size; id++ {
		if slices.Contains(eos, id) || leave != nil && leave(id) {
			continue
		}
		b := bytesOf(id)
		if len(b) == 0 {
			continue
		}
		v.bytes[id] = slices.Clone(b)
		ids = append(ids, id)
	}
	v.special = map[int32][]byte{}
	for id := int32(0); int(id) < size; id++ {
		if v.bytes[id] == nil && !slices.Contains(eos, id) {
			if b := bytesOf(id); len(b) > 0 {
				v.special[id] = slices.Clone(b)
			}
		}
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(v.bytes[a], v.bytes[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	v.order = ids
	v.build()
	return v, nil
}

func (v *Vocab) build() {
	type tmp struct {
		parent int32
		b      byte
		t0     int32
		tEnd   int32
		s1     int32
	}
	nodes := []tmp{{parent: -1}}
	stack := []int32{0} // stack[d]: the node at depth d on the current path
	var prev []byte
	for i, id := range v.order {
		tb := v.bytes[id]
		l := 0
		for l < len(prev) && l < len(tb) && prev[l] == tb[l] {
			l++
		}
		for len(stack)-1 > l { // close nodes deeper than the common prefix
			nodes[stack[len(stack)-1]].s1 = int32(i)
			stack = stack[:len(stack)-1]
		}
		for d := l; d < len(tb); d++ {
			nodes = append(nodes, tmp{parent: stack[len(stack)-1], b: tb[d], t0: int32(i), tEnd: int32(i)})
			stack = append(stack, int32(len(nodes)-1))
		}
		nodes[stack[len(stack)-1]].tEnd = int32(i + 1)
		prev = tb
	}
	for _, n := range stack {
		nodes[n].s1 = int32(len(v.order))
	}
	nodes[0].t0, nodes[0].tEnd = 0, 0
	// Edges grouped by parent; nodes were made in pre-order, so a parent's
	// children come in increasing byte order.
	cnt := make([]int32, len(nodes)+1)
	for _, n := range nodes[1:] {
		cnt[n.parent+1]++
	}
	for i := 1; i < len(cnt); i++ {
		cnt[i] += cnt[i-1]
	}
	v.nodes = make([]tnode, len(nodes))
	v.edgeB = make([]byte, len(nodes)-1)
	v.edgeTo = make([]int32, len(nodes)-1)
	fill := slices.Clone(cnt)
	for i, n := range nodes {
		v.nodes[i] = tnode{e0: cnt[i], e1: cnt[i+1], t0: n.t0, tEnd: n.tEnd, s1: n.s1}
		if i > 0 {
			e := fill[n.parent]
			fill[n.parent]++
			v.edgeB[e], v.edgeTo[e] = n.b, int32(i)
		}
	}
	for u := range v.plainSet {
		v.plainSet[u] = make([]uint64, v.MaskWords())
	}
	v.below = make([][2]uint64, len(v.nodes))
	v.deep = make([]uint8, len(v.nodes))
	for i := len(v.nodes) - 1; i >= 0; i-- { // children come after parents
		n := &v.nodes[i]
		for e := n.e0; e < n.e1; e++ {
			b, c := v.edgeB[e], v.edgeTo[e]
			bb := b
			if b >= 0x80 {
				bb = 0
			}
			v.below[i][bb>>6] |= 1 << (bb & 63)
			v.below[i][0] |= v.below[c][0]
			v.below[i][1] |= v.below[c][1]
			v.deep[i] = max(v.deep[i], min(v.deep[c], 254)+1)
		}
	}
	for i := len(v.nodes) - 1; i >= 0; i-- {
		n := &v.nodes[i]
		var plain uint8
		for u := uint8(0); u < numU8; u++ {
			ok := true
			for e := n.e0; e < n.e1 && ok; e++ {
				b := v.edgeB[e]
				nu, good := utf8Step(u, b)
				if u == 0 && (b < 0x20 || b == '"' || b == '\\') {
					good = false
				}
				ok = good && v.nodes[v.edgeTo[e]].plain&(1<<nu) != 0
			}
			if ok {
				plain |= 1 << u
			}
		}
		n.plain = plain
	}
	for u := uint8(0); u < numU8; u++ {
		v.markPlain(0, u, v.plainSet[u])
	}
}

// markPlain sets in dst the tokens under node ni made only of string-body
// bytes, the path to ni having left UTF-8 state u.
func (v *Vocab) markPlain(ni int32, u uint8, dst []uint64) {
	n := &v.nodes[ni]
	if n.plain&(1<<u) != 0 {
		for _, id := range v.order[n.t0:n.s1] {
			dst[id>>6] |= 1 << (id & 63)
		}
		return
	}
	if ni != 0 {
		for _, id := range v.order[n.t0:n.tEnd] {
			dst[id>>6] |= 1 << (id & 63)
		}
	}
	for e := n.e0; e < n.e1; e++ {
		b := v.edgeB[e]
		if u == u8None && (b < 0x20 || b == '"' || b == '\\') {
			continue
		}
		if nu, ok := utf8Step(u, b); ok {
			v.markPlain(v.edgeTo[e], nu, dst)
		}
	}
}

// Size is the vocabulary size (the length of a logits row).
func (v *Vocab) Size() int { return v.size }

// MaskWords is the length of a mask bitset for this vocabulary.
func (v *Vocab) MaskWords() int { return (v.size + 63) / 64 }

// TokenBytes returns the bytes of id in the trie, nil when left out.
func (v *Vocab) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= v.size {
		return nil
	}
	return v.bytes[id]
}

// IsEOS reports whether id ends generation.
func (v *Vocab) IsEOS(id int32) bool { return slices.Contains(v.eos, id) }

// Constraint applies a Grammar to one generation: Mask gives the tokens
// allowed next, Accept consumes the token chosen. Masks are cached by
// automaton state. Not safe for concurrent use.
type Constraint struct {
	v        *Vocab
	m        *Matcher
	specials []int32 // left-out tokens the grammar's wrappers spell
	done     bool
	w        walker
	cache    map[string][]uint64
	shared   *sharedMasks // the grammar's, across generations
	key      []byte
}

// maxCache bounds the masks kept per generation.
const maxCache = 256

// NewConstraint starts g over v.
func NewConstraint(g *Grammar, v *Vocab) *Constraint {
	c := &Constraint{v: v, m: g.NewMatcher(), w: walker{v: v}, cache: map[string][]uint64{}, shared: g.shared}
	for id, b := range v.special {
		for _, w := range g.wrappers {
			if bytes.Contains(w, b) {
				c.specials = append(c.specials, id)
				break
			}
		}
	}
	slices.Sort(c.specials)
	return c
}

// Done reports whether an end-of-generation token has been accepted.
func (c *Constraint) Done() bool { return c.done }

// CanEnd reports whether the text so far is a complete document.
func (c *Constraint) CanEnd() bool { return c.m.CanEnd() }

// Matcher returns the underlying matcher (shared: do not advance it).
func (c *Constraint) Matcher() *Matcher { return c.m }

// ErrDone is returned by Accept after the end of generation.
var ErrDone = errors.New("grammar: generation already ended")

// Accept advances by token id; an end-of-generation token is accepted only
// when the document is complete.
func (c *Constraint) Accept(id int32) error {
	if c.done {
		return ErrDone
	}
	if c.v.IsEOS(id) {
		if !c.m.CanEnd() {
			return fmt.Errorf("%w: end of generation before the document is complete", ErrRejected)
		}
		c.done = true
		return nil
	}
	b := c.v.TokenBytes(id)
	if b == nil && slices.Contains(c.specials, id) {
		b = c.v.special[id]
	}
	if b == nil {
		return fmt.Errorf("%w: token %d is not in the constrained vocabulary", ErrRejected, id)
	}
	return c.m.Advance(b)
}

// AdvanceBytes consumes text that came without tokens (what was generated
// before the constraint began); on a byte the grammar refuses it returns
// an error wrapping ErrRejected and leaves the state as it was.
func (c *Constraint) AdvanceBytes(b []byte) error {
	if c.done {
		return ErrDone
	}
	return c.m.Advance(b)
}

// Mask sets dst (MaskWords long) to the bitset of the tokens allowed next.
// After the end of generation nothing is allowed.
func (c *Constraint) Mask(dst []uint64) {
	clear(dst)
	if c.done {
		return
	}
	if c.cache != nil {
		c.key = stateKey(c.key[:0], c.m.alts)
		if m, ok := c.cache[string(c.key)]; ok {
			copy(dst, m)
			return
		}
		if c.shared != nil {
			if m := c.shared.get(c.v, c.key); m != nil {
				copy(dst, m)
				c.cache[string(c.key)] = m
				return
			}
		}
	}
	c.w.mask(c.m.alts, dst)
	for _, id := range c.specials {
		if c.m.Accepts(c.v.special[id]) {
			dst[id/64] |= 1 << (id % 64)
		}
	}
	if c.m.CanEnd() {
		for _, e := range c.v.eos {
			dst[e/64] |= 1 << (e % 64)
		}
	}
	if c.cache == nil {
		return
	}
	if len(c.cache) >= maxCache {
		clear(c.cache)
	}
	m := slices.Clone(dst)
	c.cache[string(c.key)] = m
	if c.shared != nil {
		c.shared.put(c.v, c.key, m)
	}
}

// walker computes masks by walking the trie with the automaton.
type walker struct {
	v     *Vocab
	a     arena
	s     stepper
	bufs  [][]*frame
	dst   []uint64
	plain bool // the walk started in plain mode: plain subtrees are set already
}

func (w *walker) mask(alts []*frame, dst []uint64) {
	w.a.reset()
	w.s.a = &w.a
	w.dst = dst
	w.plain = false
	if u, ok := plainMode(alts); ok {
		copy(dst, w.v.plainSet[u]) // the walk below skips what this covers
		w.plain = true
	}
	if f := alts[0]; len(alts) == 1 && reBodyFrame(f) && f.u8 == 0 && f.n.minLen == 0 && f.n.maxLen < 0 {
		bt, keep := w.bodyTable(f.n, reState(f))
		if bt != nil {
			copy(dst, bt.ok)
			w.walkSpecial(0, *f, 0)
			w.dst = nil
			return
		}
		w.walk(0, alts, 0, w.plain)
		if keep {
			w.keepBodyTable(f.n, reState(f), dst)
		}
		w.dst = nil
		return
	}
	w.walk(0, alts, 0, w.plain)
	w.dst = nil
}

func (w *walker) setRange(lo, hi int32) {
	for _, id := range w.v.order[lo:hi] {
		w.dst[id>>6] |= 1 << (id & 63)
	}
}

// plainMode reports whether alts is one stack whose top takes any
// string-body byte and stays the same but for its UTF-8 state u.
func plainMode(alts []*frame) (uint8, bool) {
	if len(alts) != 1 {
		return 0, false
	}
	f := alts[0]
	n := f.n
	switch {
	case n.kind == kString && f.st == sStrBody && n.minLen == 0 && n.maxLen < 0 && (n.re == nil || n.re.all[reState(f)]):
		return f.u8, true
	case n.kind == kObject && f.st == sObjKey && f.mask == 0 && n.additional != nil && f.u8 != noAdd:
		return f.u8, true
	}
	return 0, false
}

// walk extends the stacks alts at trie node ni. inPlain: the walk began
// in plain mode and the path to ni is plain string-body bytes, so the
// tokens of a plain subtree below are in plainSet already.
func (w *walker) walk(ni int32, alts []*frame, depth int, inPlain bool) {
	v := w.v
	n := &v.nodes[ni]
	if len(alts) == 1 && !inPlain && reBodyFrame(alts[0]) {
		w.walkRe(ni, *alts[0], depth)
		return
	}
	for e := n.e0; e < n.e1; e++ {
		w.edge(e, alts, depth, inPlain)
	}
}

// edge walks trie edge e from the stacks alts.
func (w *walker) edge(e int32, alts []*frame, depth int, inPlain bool) {
	v := w.v
	for depth >= len(w.bufs) {
		w.bufs = append(w.bufs, make([]*frame, 0, 8))
	}
	b := v.edgeB[e]
	w.s.out = w.bufs[depth][:0]
	for _, f := range alts {
		w.s.feed(f, b)
	}
	next := w.s.out
	w.bufs[depth] = next[:0]
	if len(next) == 0 {
		return
	}
	ci := v.edgeTo[e]
	c := &v.nodes[ci]
	childPlain := inPlain && b >= 0x20 && b != '"' && b != '\\'
	if u, ok := plainMode(next); ok && c.plain&(1<<u) != 0 {
		if !childPlain {
			w.setRange(c.t0, c.s1)
		}
		return
	}
	w.setRange(c.t0, c.tEnd)
	if c.e1 > c.e0 {
		if len(next) > 8 {
			next = dedupe(next)
		}
		w.walk(ci, next, depth+1, childPlain)
	}
}

// reBodyFrame reports whether f is a pattern string's body outside a
// state that accepts everything (walkRe's case).
func reBodyFrame(f *frame) bool {
	return f.n.kind == kString && f.n.re != nil && f.st == sStrBody && !f.n.re.all[reState(f)]
}

// walkRe walks the subtree at ni while the only stack is the pattern
// string frame f, stepping its automaton directly instead of through the
// stepper: ASCII characters between characters in walkASCII (carrying
// only the state and count), others by reBody; a quote, backslash or
// control byte goes the general way.
func (w *walker) walkRe(ni int32, f frame, depth int) {
	if f.u8 == 0 {
		w.walkASCII(ni, &f, reState(&f), f.cnt, depth)
		return
	}
	w.walkReByte(ni, f, depth)
}

// walkASCII is walkRe between characters at automaton state q after cnt
// code points; f gives the rest of the frame.
func (w *walker) walkASCII(ni int32, f *frame, q, cnt int32, depth int) {
	v := w.v
	n := &v.nodes[ni]
	d := f.n.re
	counted := f.n.minLen > 0 || f.n.maxLen >= 0
	row := d.trans[int(q)*d.ncls : int(q+1)*d.ncls]
	for e := n.e0; e < n.e1; e++ {
		b := v.edgeB[e]
		if b >= 0x80 || b == '"' || b == '\\' || b < 0x20 {
			g := *f
			reSet(&g, q, 0, 0)
			g.cnt, g.u8 = cnt, 0
			w.reEdge(e, g, depth)
			continue
		}
		t := row[d.ascii[b]]
		if t < 0 || counted && !d.fits(t, cnt+1, f.n.minLen, f.n.maxLen) {
			continue
		}
		ci := v.edgeTo[e]
		c := &v.nodes[ci]
		if lp := &d.loop[t]; v.below[ci][0]&^lp[0] == 0 && v.below[ci][1]&^lp[1] == 0 &&
			(!counted || f.n.maxLen < 0 || cnt+1+int32(v.deep[ci])+d.minRem[t] <= f.n.maxLen) {
			// Every byte below keeps the automaton at t (a loop state,
			// with no end to reach: maxRem is none), and every token
			// fits the length: the whole subtree is taken.
			w.setRange(c.t0, c.s1)
			continue
		}
		if dp := int(v.deep[ci]); !counted && dp > 0 && dp <= len(d.chain[t]) {
			if ch := &d.chain[t][dp-1]; v.below[ci][0]&^ch[0] == 0 && v.below[ci][1]&^ch[1] == 0 {
				w.setRange(c.t0, c.s1) // every path below stays live along the chain
				continue
			}
		}
		for _, id := range v.order[c.t0:c.tEnd] {
			w.dst[id>>6] |= 1 << (id & 63)
		}
		if c.e1 == c.e0 {
			continue
		}
		nc := cnt
		if counted {
			nc++
		}
		if !d.all[t] {
			w.walkASCII(ci, f, t, nc, depth+1)
			continue
		}
		if !counted && c.plain&(1<<u8None) != 0 {
			w.setRange(c.t0, c.s1) // from here any body byte is taken: so is the whole plain subtree
			continue
		}
		g := *f
		reSet(&g, t, 0, 0)
		g.cnt, g.u8 = nc, 0
		w.walk(ci, []*frame{w.a.alloc(g)}, depth+1, false)
	}
}

// walkReByte is walkRe inside a character (or for any byte).
func (w *walker) walkReByte(ni int32, f frame, depth int) {
	v := w.v
	n := &v.nodes[ni]
	for e := n.e0; e < n.e1; e++ {
		w.reEdge(e, f, depth)
	}
}

// reEdge walks trie edge e from pattern string frame f.
func (w *walker) reEdge(e int32, f frame, depth int) {
	v := w.v
	b := v.edgeB[e]
	if f.u8 == 0 && (b == '"' || b == '\\' || b < 0x20) {
		w.edge(e, []*frame{w.a.alloc(f)}, depth, false)
		return
	}
	g, ok := reBody(&f, b)
	if !ok {
		return
	}
	c := &v.nodes[v.edgeTo[e]]
	if g.u8 != 0 && g.n.minLen == 0 && g.n.maxLen < 0 && c.plain&(1<<g.u8) != 0 {
		// Inside a character whose every completion leads to a state
		// that takes everything: the plain subtree is taken whole.
		lo, hi := utf8Span(reAcc(&g), utf8Left[g.u8], int(g.mask>>56&7))
		if g.n.re.allIn(reState(&g), lo, hi) {
			w.setRange(c.t0, c.s1)
			return
		}
	}
	w.setRange(c.t0, c.tEnd)
	if c.e1 > c.e0 {
		if reBodyFrame(&g) {
			w.walkRe(v.edgeTo[e], g, depth+1)
		} else {
			w.walk(v.edgeTo[e], []*frame{w.a.alloc(g)}, depth+1, false)
		}
	}
}
