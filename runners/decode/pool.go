package decode

import (
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// convEntry is a KV cache together with the tokens whose KV it holds:
// len(tokens) == cache.Len() whenever the entry is in the pool.
type convEntry struct {
	tokens []int32
	cache  engine.KVCache
	last   uint64 // LRU clock
}

// kvPool is the decode-side prefix cache across requests: the KV of the last
// few conversations, keyed by their token sequences. A request takes the
// entry sharing the longest prefix with its prompt (the entry leaves the pool
// while the request owns it) and puts it back when done, so a second chat
// turn reuses the first turn's KV. Bounded by entry count and total tokens.
type kvPool struct {
	mu         sync.Mutex
	entries    []*convEntry
	maxEntries int
	maxTokens  int
	clock      uint64
	newCache   func() engine.KVCache
}

func newKVPool(maxEntries, maxTokens int, newCache func() engine.KVCache) *kvPool {
	return &kvPool{maxEntries: maxEntries, maxTokens: maxTokens, newCache: newCache}
}

func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// take returns an entry for prompt and the number of its leading tokens
// whose KV the entry holds (the entry is already truncated to that many).
// With no sharing entry it reuses the least recently used entry's storage
// when the pool is full, else makes a new cache.
func (p *kvPool) take(prompt []int32) (*convEntry, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, bestN := -1, 0
	for i, e := range p.entries {
		// A sliding layer keeps only a suffix: the entry serves a prefix
		// only while every such layer still holds that prefix's window.
		if n := commonPrefix(e.tokens, prompt); n > bestN && e.cache.CanTruncate(n) {
			best, bestN = i, n
		}
	}
	if best < 0 && p.maxEntries > 0 && len(p.entries) >= p.maxEntries {
		// Recycle the LRU entry's storage rather than grow.
		lru := 0
		for i, e := range p.entries {
			if e.last < p.entries[lru].last {
				lru = i
			}
		}
		best, bestN = lru, 0
	}
	if best < 0 {
		return &convEntry{cache: p.newCache()}, 0
	}
	e := p.entries[best]
	p.entries = append(p.entries[:best], p.entries[best+1:]...)
	e.cache.Truncate(bestN)
	bestN = min(bestN, e.cache.Len()) // a recurrent model's cache goes back to its latest kept state
	e.tokens = e.tokens[:bestN]
	return e, bestN
}

// put returns an entry to the pool (tokens must describe its KV), evicting
// least recently used entries over the bounds.
func (p *kvPool) put(e *convEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.maxEntries <= 0 || len(e.tokens) > p.maxTokens {
		e.cache.Free()
		return
	}
	p.clock++
	e.last = p.clock
	p.entries = append(p.entries, e)
	for {
		total := 0
		for _, x := range p.entries {
			total += len(x.tokens)
		}
		if len(p.entries) <= p.maxEntries && total <= p.maxTokens {
			return
		}
		lru := 0
		for i, x := range p.entries {
			if x.last < p.entries[lru].last {
				lru = i
			}
		}
		p.entries[lru].cache.Free()
		p.entries = append(p.entries[:lru], p.entries[lru+1:]...)
	}
}

// drop frees an entry whose state is unknown (after an error).
func (p *kvPool) drop(e *convEntry) { e.cache.Free() }

// close frees every entry.
func (p *kvPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.entries {
		e.cache.Free()
	}
	p.entries = nil
}
