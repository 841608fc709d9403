package prefill

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// prefixCache is the prefill side's memory-bounded LRU of computed KV, keyed
// by chained hashes of fixed-size token blocks: the key of block i hashes
// block i's tokens together with the key of block i-1, so one map lookup per
// block finds the longest cached prefix. Hits are verified token by token
// (a hash collision can never serve wrong KV).
type prefixCache struct {
	mu            sync.Mutex
	block         int
	maxBytes      int64
	bytesPerToken int64
	seed          maphash.Seed
	lru           list.List // of *cacheEntry, front = most recent
	index         map[uint64]*cacheEntry
	used          int64

	// sizeOf, when set, is the bytes an entry of n tokens holds (a model
	// with sliding layers holds less than n·bytesPerToken).
	sizeOf func(n int) int64
}

type cacheEntry struct {
	tokens []int32
	cache  engine.KVCache
	keys   []uint64 // index keys owned by this entry
	el     *list.Element
}

func newPrefixCache(block int, maxBytes, bytesPerToken int64) *prefixCache {
	if block <= 0 {
		block = 64
	}
	return &prefixCache{block: block, maxBytes: maxBytes, bytesPerToken: bytesPerToken,
		seed: maphash.MakeSeed(), index: map[uint64]*cacheEntry{}}
}

// blockKeys returns the chained key of each full block of tokens.
func (p *prefixCache) blockKeys(tokens []int32) []uint64 {
	nb := len(tokens) / p.block
	keys := make([]uint64, nb)
	var prev uint64
	var buf [8]byte
	var h maphash.Hash
	h.SetSeed(p.seed)
	for i := range nb {
		h.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		h.Write(buf[:])
		for _, t := range tokens[i*p.block : (i+1)*p.block] {
			binary.LittleEndian.PutUint32(buf[:4], uint32(t))
			h.Write(buf[:4])
		}
		prev = h.Sum64()
		keys[i] = prev
	}
	return keys
}

func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// acquire returns a cache holding the KV of the longest cached prefix of
// tokens (at most limit tokens) and its length. The caller owns the returned
// cache and hands it back with release. When the best entry is exactly a
// prefix of tokens it is taken out of the LRU and reused in place;
// otherwise its prefix is copied into a new cache, so the entry stays.
//
// With exact set (a model with recurrent layers, whose state cannot be
// copied back to a shorter prefix) only an entry whose every token is a
// prefix of tokens is used, as it is.
func (p *prefixCache) acquire(tokens []int32, limit int, newCache func() engine.KVCache, exact bool) (engine.KVCache, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, n := p.lookup(tokens, limit)
	if best == nil {
		return newCache(), 0, nil
	}
	if n == len(best.tokens) {
		p.remove(best)
		return best.cache, n, nil
	}
	if exact {
		return newCache(), 0, nil
	}
	c := newCache()
	g := best.cache.Geometry()
	for l := range g.Layers {
		from := engine.WindowStart(g.Window(l), n) // a sliding layer copies its window only
		k, v, err := best.cache.Export(l, from, n-from)
		if err != nil {
			c.Free()
			return nil, 0, fmt.Errorf("prefix cache: copy layer %d: %w", l, err)
		}
		if err := c.Import(l, from, n-from, k, v); err != nil {
			c.Free()
			return nil, 0, fmt.Errorf("prefix cache: copy layer %d: %w", l, err)
		}
	}
	if err := c.Commit(n); err != nil {
		c.Free()
		return nil, 0, fmt.Errorf("prefix cache: commit copy: %w", err)
	}
	p.touch(best)
	return c, n, nil
}

// lookup finds the entry holding the longest usable prefix of tokens (at
// most limit tokens) and that prefix's length; p.mu is held.
func (p *prefixCache) lookup(tokens []int32, limit int) (*cacheEntry, int) {
	keys := p.blockKeys(tokens[:min(len(tokens), limit)])
	for i := len(keys) - 1; i >= 0; i-- {
		e, ok := p.index[keys[i]]
		if !ok || commonPrefix(e.tokens, tokens) < (i+1)*p.block {
			continue
		}
		// An entry whose sliding layers have moved past the window of
		// the shared prefix cannot serve it (PROTOCOL.md, prefix caches).
		if m := min(commonPrefix(e.tokens, tokens), limit); m == len(e.tokens) || e.cache.CanTruncate(m) {
			return e, m
		}
	}
	return nil, 0
}

// peek returns how many leading tokens acquire would find cached now
// (the same rules: at most limit; with exact, only a whole entry), without
// taking or touching anything: the answer to a prefix probe.
func (p *prefixCache) peek(tokens []int32, limit int, exact bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, n := p.lookup(tokens, limit)
	if best == nil || (exact && n != len(best.tokens)) {
		return 0
	}
	return n
}

// release stores cache as holding the KV of tokens (len(tokens) ==
// cache.Len()), evicting least recently used entries beyond the memory
// bound. A cache too big for the bound is freed.
func (p *prefixCache) release(tokens []int32, c engine.KVCache) {
	p.mu.Lock()
	defer p.mu.Unlock()
	size := p.entrySize(len(tokens))
	if len(tokens) < p.block || size > p.maxBytes {
		c.Free()
		return
	}
	e := &cacheEntry{tokens: tokens, cache: c}
	e.el = p.lru.PushFront(e)
	p.used += size
	for _, k := range p.blockKeys(tokens) {
		if old, ok := p.index[k]; ok && old != e {
			// The newer entry owns the key; the older keeps its other keys.
			old.keys = deleteKey(old.keys, k)
		}
		p.index[k] = e
		e.keys = append(e.keys, k)
	}
	for p.used > p.maxBytes {
		back := p.lru.Back().Value.(*cacheEntry)
		p.remove(back)
		back.cache.Free()
	}
}

func (p *prefixCache) entrySize(n int) int64 {
	if p.sizeOf != nil {
		return p.sizeOf(n)
	}
	return int64(n) * p.bytesPerToken
}

func deleteKey(keys []uint64, k uint64) []uint64 {
	for i, x := range keys {
		if x == k {
			return append(keys[:i], keys[i+1:]...)
		}
	}
	return keys
}

func (p *prefixCache) touch(e *cacheEntry) { p.lru.MoveToFront(e.el) }

// remove unlinks e (the caller frees or reuses its cache).
func (p *prefixCache) remove(e *cacheEntry) {
	p.lru.Remove(e.el)
	for _, k := range e.keys {
		if p.index[k] == e {
			delete(p.index, k)
		}
	}
	e.keys = nil
	p.used -= p.entrySize(len(e.tokens))
}

// stats returns the entries and bytes held.
func (p *prefixCache) stats() (entries int, bytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lru.Len(), p.used
}

// close frees everything.
func (p *prefixCache) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.lru.Len() > 0 {
		e := p.lru.Back().Value.(*cacheEntry)
		p.remove(e)
		e.cache.Free()
	}
}
