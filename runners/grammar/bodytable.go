package grammar

import (
	"slices"
	"sync"
)

// A body table holds, for one pattern automaton state q (between
// characters of a string's value) and one Vocab, the tokens made only of
// string-body bytes that the automaton takes from q, with what each
// leaves: the code points it adds and the state it ends in. A mask whose
// only stack is such a string starts from the table (filtered by the
// length bound left to count, if any) and walks only the tokens with a
// quote, backslash or control byte. Tables are kept per generation
// (see bodyTables).
type bodyTable struct {
	ok []uint64 // the tokens the automaton takes from q, lengths aside
	// byHi: the tokens ending between characters, by k+minRem[t]
	// descending (cleared while over maxLen-cnt); byLo: those whose end
	// state has a most, by k+maxRem[t] ascending (cleared while under
	// minLen-cnt).
	byHi, byLo []bodyTok
	partial    []bodyTok // tokens ending inside a character: checked one by one
}

type bodyTok struct {
	id     int32
	k      int32 // code points completed
	t      int32 // the state after them
	key    int32 // the sort key (byHi, byLo)
	lo, hi rune  // partial: the code points the last character can become
}

// maxBodyTables and maxBodyBytes bound the tables one automaton keeps
// (for the first Vocab it is used with); past either they start over.
const (
	maxBodyTables = 256
	maxBodyBytes  = 32 << 20
)

// bodyTables is an automaton's tables, shared by every generation of its
// grammar (which the decode runner caches by schema, so an agent's next
// turns find them).
type bodyTables struct {
	mu    sync.Mutex
	v     *Vocab
	seen  map[int32]bool // states masked once (tabulated at the second)
	m     map[int32]*bodyTable
	bytes int // of the tables in m
}

// A state's table is built at its second mask (a state met once is
// cheaper to walk than to tabulate): nil before.
func (w *walker) bodyTableFor(n *node, q int32) *bodyTable {
	bts := &n.re.tables
	bts.mu.Lock()
	if bts.v == nil {
		bts.v = w.v
	}
	if bts.v != w.v { // another vocabulary: tables are for the first only
		bts.mu.Unlock()
		return nil
	}
	if t := bts.m[q]; t != nil {
		bts.mu.Unlock()
		return t
	}
	if !bts.seen[q] {
		if bts.seen == nil || len(bts.seen) >= 4*maxBodyTables {
			bts.seen = map[int32]bool{}
		}
		bts.seen[q] = true
		bts.mu.Unlock()
		return nil
	}
	bts.mu.Unlock()
	counted := n.minLen > 0 || n.maxLen >= 0
	bt := &bodyTable{ok: make([]uint64, w.v.MaskWords())}
	w.buildBody(bt, n.re, 0, q, u8None, 0, 0, 0, counted)
	if counted {
		d := n.re
		for i := range bt.byHi {
			tk := &bt.byHi[i]
			if d.maxRem[tk.t] >= 0 {
				lo := *tk
				lo.key = tk.k + d.maxRem[tk.t]
				bt.byLo = append(bt.byLo, lo)
			}
			tk.key = tk.k + d.minRem[tk.t]
		}
		bucketSort(bt.byHi, true)
		bucketSort(bt.byLo, false)
	}
	size := 8*len(bt.ok) + 24*(len(bt.byHi)+len(bt.byLo)+len(bt.partial))
	bts.mu.Lock()
	if bts.m == nil || len(bts.m) >= maxBodyTables || bts.bytes+size > maxBodyBytes {
		bts.m, bts.bytes = map[int32]*bodyTable{}, 0
	}
	bts.m[q] = bt
	bts.bytes += size
	bts.mu.Unlock()
	return bt
}

// bucketSort orders l by key (small non-negative numbers) in linear time.
func bucketSort(l []bodyTok, desc bool) {
	if len(l) == 0 {
		return
	}
	hi := int32(0)
	for _, tk := range l {
		hi = max(hi, tk.key)
	}
	if hi > 1<<16 {
		slices.SortFunc(l, func(a, b bodyTok) int { return int(a.key - b.key) })
	} else {
		start := make([]int32, hi+2)
		for _, tk := range l {
			start[tk.key+1]++
		}
		for i := 1; i < len(start); i++ {
			start[i] += start[i-1]
		}
		out := make([]bodyTok, len(l))
		for _, tk := range l {
			out[start[tk.key]] = tk
			start[tk.key]++
		}
		copy(l, out)
	}
	if desc {
		slices.Reverse(l)
	}
}

// buildBody walks the trie below ni over string-body bytes from state q
// (UTF-8 state u, the character so far acc of l bytes), k code points
// in, recording every token the automaton takes (with what it leaves
// when a length is counted).
func (w *walker) buildBody(bt *bodyTable, d *dfa, ni, q int32, u uint8, acc rune, l int, k int32, counted bool) {
	v := w.v
	n := &v.nodes[ni]
	row := d.trans[int(q)*d.ncls : int(q+1)*d.ncls]
	for e := n.e0; e < n.e1; e++ {
		b := v.edgeB[e]
		ci := v.edgeTo[e]
		c := &v.nodes[ci]
		nq, nu, nacc, nl, nk := q, u, acc, l, k
		switch {
		case u == u8None && (b == '"' || b == '\\' || b < 0x20):
			continue
		case u == u8None && b < 0x80:
			if nq = row[d.ascii[b]]; nq < 0 {
				continue
			}
			nk++
		case u == u8None:
			var ok bool
			if nu, ok = utf8Step(u8None, b); !ok {
				continue
			}
			nl, nacc = 2, rune(b&0x1F)
			switch {
			case b >= 0xF0:
				nl, nacc = 4, rune(b&0x07)
			case b >= 0xE0:
				nl, nacc = 3, rune(b&0x0F)
			}
			if lo, hi := utf8Span(nacc, nl-1, nl); !d.anyIn(q, lo, hi) {
				continue
			}
		default:
			var ok bool
			if nu, ok = utf8Step(u, b); !ok {
				continue
			}
			nacc = acc<<6 | rune(b&0x3F)
			if nu == u8None {
				if nq = d.step(q, nacc); nq < 0 {
					continue
				}
				nk++
				nacc, nl = 0, 0
			} else if lo, hi := utf8Span(nacc, utf8Left[nu], nl); !d.anyIn(q, lo, hi) {
				continue
			}
		}
		for _, id := range v.order[c.t0:c.tEnd] {
			bt.ok[id>>6] |= 1 << (id & 63)
			if !counted {
				continue
			}
			if nu == u8None {
				bt.byHi = append(bt.byHi, bodyTok{id: id, k: nk, t: nq})
			} else {
				lo, hi := utf8Span(nacc, utf8Left[nu], nl)
				bt.partial = append(bt.partial, bodyTok{id: id, k: nk, t: nq, lo: lo, hi: hi})
			}
		}
		if c.e1 > c.e0 {
			w.buildBody(bt, d, ci, nq, nu, nacc, nl, nk, counted)
		}
	}
}

// bodyMask sets dst from the table for string frame f (between
// characters): the tokens the automaton takes, less those the length
// bound left cannot accommodate after f.cnt code points.
func (w *walker) bodyMask(f *frame, bt *bodyTable) {
	copy(w.dst, bt.ok)
	n := f.n
	if n.minLen == 0 && n.maxLen < 0 {
		return
	}
	cnt := f.cnt
	clr := func(id int32) { w.dst[id>>6] &^= 1 << (id & 63) }
	if n.maxLen >= 0 {
		for _, tk := range bt.byHi {
			if cnt+tk.key <= n.maxLen {
				break
			}
			clr(tk.id)
		}
	}
	if n.minLen > 0 {
		for _, tk := range bt.byLo {
			if cnt+tk.key >= n.minLen {
				break
			}
			clr(tk.id)
		}
	}
	for _, tk := range bt.partial {
		if !reCan(n, tk.t, tk.lo, tk.hi, cnt+tk.k+1) {
			clr(tk.id)
		}
	}
}

// walkSpecial walks, below ni, only the subtrees with a token that is not
// all string-body bytes (those are in the table): string frame f steps
// over body bytes, a quote, backslash or control byte goes the general
// way.
func (w *walker) walkSpecial(ni int32, f frame, depth int) {
	v := w.v
	n := &v.nodes[ni]
	for e := n.e0; e < n.e1; e++ {
		b := v.edgeB[e]
		ci := v.edgeTo[e]
		c := &v.nodes[ci]
		if f.u8 == 0 && (b == '"' || b == '\\' || b < 0x20) {
			w.edge(e, []*frame{w.a.alloc(f)}, depth, false)
			continue
		}
		g, ok := reBody(&f, b)
		if !ok || c.plain&(1<<g.u8) != 0 || c.e1 == c.e0 {
			continue // refused, or every token below is in the table
		}
		if g.n.re.all[reState(&g)] && g.u8 == 0 {
			// From here on every body byte is taken: the tokens below
			// made of body bytes are in the table; walk the others.
			w.walkSpecialAll(ci, []*frame{w.a.alloc(g)}, depth+1)
			continue
		}
		w.walkSpecial(ci, g, depth+1)
	}
}

// walkSpecialAll is walkSpecial for a frame in an accepting-everything
// state: the general walk, marked as on a plain path so that it skips
// the all-body subtrees (the table has them).
func (w *walker) walkSpecialAll(ni int32, alts []*frame, depth int) {
	v := w.v
	n := &v.nodes[ni]
	for e := n.e0; e < n.e1; e++ {
		w.edge(e, alts, depth, true)
	}
}
