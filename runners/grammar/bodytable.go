package grammar

import "sync"

// A body table holds, for one pattern automaton state q (between
// characters of a string's value, with no length bound left to count)
// and one Vocab, the tokens made only of string-body bytes that the
// automaton takes from q. A mask whose only stack is such a string starts
// from the table and walks only the tokens with a quote, backslash or
// control byte (walkSpecial). A state's table is the body part of its
// second mask (a state met once is not worth keeping): the walk makes it.
type bodyTable struct {
	ok []uint64
}

// maxBodyTables bounds the tables one automaton keeps (for the first
// Vocab it is used with); past it they start over.
const maxBodyTables = 256

// bodyTables is an automaton's tables, shared by every generation of its
// grammar (which the decode runner caches by schema, so an agent's next
// turns find them).
type bodyTables struct {
	mu   sync.Mutex
	v    *Vocab
	seen map[int32]bool // states masked once
	m    map[int32]*bodyTable
}

// bodyTable returns q's table, or nil and whether the caller should make
// one from the mask it walks (the second time q is masked).
func (w *walker) bodyTable(n *node, q int32) (*bodyTable, bool) {
	bts := &n.re.tables
	bts.mu.Lock()
	defer bts.mu.Unlock()
	if bts.v == nil {
		bts.v = w.v
	}
	if bts.v != w.v { // another vocabulary: tables are for the first only
		return nil, false
	}
	if t := bts.m[q]; t != nil {
		return t, false
	}
	if bts.seen[q] {
		return nil, true
	}
	if bts.seen == nil || len(bts.seen) >= 4*maxBodyTables {
		bts.seen = map[int32]bool{}
	}
	bts.seen[q] = true
	return nil, false
}

// keepBodyTable stores q's table: the body tokens of mask.
func (w *walker) keepBodyTable(n *node, q int32, mask []uint64) {
	body := w.v.plainSet[u8None]
	bt := &bodyTable{ok: make([]uint64, len(mask))}
	for i := range mask {
		bt.ok[i] = mask[i] & body[i]
	}
	bts := &n.re.tables
	bts.mu.Lock()
	defer bts.mu.Unlock()
	if bts.m == nil || len(bts.m) >= maxBodyTables {
		bts.m = map[int32]*bodyTable{}
	}
	bts.m[q] = bt
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
