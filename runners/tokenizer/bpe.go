package tokenizer

import (
	"container/heap"
	"container/list"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is a BPE model: vocabulary and merge ranks over token ids. Byte-level
// (GPT-2 style): a piece's bytes map to printable runes first. spm
// (SentencePiece style): a piece's characters are the symbols, and one
// missing from the vocabulary becomes its UTF-8 bytes' <0xXX> tokens
// (byteFallback) or unk (consecutive unks fused with fuseUnk).
type bpe struct {
	vocab        map[string]int32 // token string → id
	merges       map[uint64]merge // pair (left id, right id) → merge
	ignoreMerges bool             // a word that is itself in the vocabulary is one token (Llama 3)
	unk          int32            // -1: none
	b2r          [256]rune
	cache        *lru

	spm          bool
	byteFallback bool
	fuseUnk      bool
	byteIDs      [256]int32 // <0xXX> token ids (byteFallback)
	byteOfID     map[int32]byte
}

// byteOf reports whether id is a byte-fallback token, and its byte.
func (m *bpe) byteOf(id int32) (byte, bool) {
	c, ok := m.byteOfID[id]
	return c, ok
}

// maxCachedPiece bounds the pieces the LRU keeps: SentencePiece-style
// tokenizers have no pre-tokenizer, so a piece can be a whole prompt.
const maxCachedPiece = 256

type merge struct{ rank, id int32 }

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// appendWord appends the ids of one pre-tokenized piece (raw bytes).
func (m *bpe) appendWord(dst []int32, piece string) []int32 {
	if ids, ok := m.cache.get(piece); ok {
		return append(dst, ids...)
	}
	ids := m.word(piece)
	if len(piece) <= maxCachedPiece {
		m.cache.put(piece, ids)
	}
	return append(dst, ids...)
}

// word tokenizes one piece: bytes → byte-level runes → symbols → merges in
// rank order (ties: leftmost first, as HF tokenizers does).
func (m *bpe) word(piece string) []int32 {
	if m.spm {
		return m.spmWord(piece)
	}
	mapped := make([]rune, len(piece))
	for i := 0; i < len(piece); i++ {
		mapped[i] = m.b2r[piece[i]]
	}
	ms := string(mapped)
	if m.ignoreMerges {
		if id, ok := m.vocab[ms]; ok {
			return []int32{id}
		}
	}
	syms := make([]symbol, 0, len(mapped))
	var buf [4]byte
	for _, r := range mapped {
		n := encodeRune(buf[:], r)
		id, ok := m.vocab[string(buf[:n])]
		if !ok {
			if m.unk < 0 {
				continue
			}
			id = m.unk
		}
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	return m.mergeSymbols(syms)
}

// spmWord tokenizes one SentencePiece-style piece: characters → symbols
// (bytes or unk for characters outside the vocabulary) → merges.
func (m *bpe) spmWord(piece string) []int32 {
	syms := make([]symbol, 0, len(piece))
	add := func(id int32) {
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	lastUnk := false
	for i, r := range piece {
		n := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, n = utf8.DecodeRuneInString(piece[i:])
		}
		ch := piece[i : i+n]
		if id, ok := m.vocab[ch]; ok {
			add(id)
			lastUnk = false
			continue
		}
		if m.byteFallback {
			for k := 0; k < len(ch); k++ {
				add(m.byteIDs[ch[k]])
			}
			lastUnk = false
			continue
		}
		if m.unk < 0 || (m.fuseUnk && lastUnk) {
			continue
		}
		add(m.unk)
		lastUnk = true
	}
	return m.mergeSymbols(syms)
}

// mergeSymbols applies the merges in rank order (ties: leftmost first, as
// HF tokenizers does) to a linked run of symbols and returns the ids.
func (m *bpe) mergeSymbols(syms []symbol) []int32 {
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1
	if len(syms) > 1 {
		q := make(mergeQueue, 0, len(syms))
		for i := 0; i+1 < len(syms); i++ {
			if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
				q = append(q, candidate{rank: mg.rank, pos: int32(i), left: syms[i].id, right: syms[i+1].id, id: mg.id})
			}
		}
		heap.Init(&q)
		for q.Len() > 0 {
			c := heap.Pop(&q).(candidate)
			s := &syms[c.pos]
			if s.id != c.left || s.next < 0 || syms[s.next].id != c.right {
				continue // stale: one side was merged already
			}
			// merge right into left
			r := s.next
			s.id = c.id
			s.next = syms[r].next
			syms[r].id = -1
			if s.next >= 0 {
				syms[s.next].prev = c.pos
				if mg, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
					heap.Push(&q, candidate{rank: mg.rank, pos: c.pos, left: s.id, right: syms[s.next].id, id: mg.id})
				}
			}
			if s.prev >= 0 {
				p := &syms[s.prev]
				if mg, ok := m.merges[pairKey(p.id, s.id)]; ok {
					heap.Push(&q, candidate{rank: mg.rank, pos: s.prev, left: p.id, right: s.id, id: mg.id})
				}
			}
		}
	}
	out := make([]int32, 0, len(syms))
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

func encodeRune(b []byte, r rune) int {
	switch {
	case r < 0x80:
		b[0] = byte(r)
		return 1
	case r < 0x800:
		b[0] = 0xC0 | byte(r>>6)
		b[1] = 0x80 | byte(r)&0x3F
		return 2
	default: // byte-level runes are < 0x10000
		b[0] = 0xE0 | byte(r>>12)
		b[1] = 0x80 | byte(r>>6)&0x3F
		b[2] = 0x80 | byte(r)&0x3F
		return 3
	}
}

type symbol struct {
	id         int32 // -1 once merged away
	prev, next int32
}

type candidate struct {
	rank, pos, left, right, id int32
}

type mergeQueue []candidate

func (q mergeQueue) Len() int { return len(q) }
func (q mergeQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q mergeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *mergeQueue) Push(x any)   { *q = append(*q, x.(candidate)) }
func (q *mergeQueue) Pop() any {
	old := *q
	c := old[len(old)-1]
	*q = old[:len(old)-1]
	return c
}

// lru caches piece → ids; safe for concurrent use.
type lru struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element
	order list.List // front = most recent
}

type lruEntry struct {
	key string
	ids []int32
}

func newLRU(max int) *lru { return &lru{max: max, items: make(map[string]*list.Element, max)} }

func (c *lru) get(k string) ([]int32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[k]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry).ids, true
}

func (c *lru) put(k string, ids []int32) {
	if len(k) > 256 { // long pieces are rare; keep the cache small
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[k]; ok {
		return
	}
	k = strings.Clone(k) // do not pin the caller's whole text
	c.items[k] = c.order.PushFront(&lruEntry{key: k, ids: ids})
	if c.order.Len() > c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.items, old.Value.(*lruEntry).key)
	}
}
