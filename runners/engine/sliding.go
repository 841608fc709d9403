package engine

// This file is the sliding-window attention layer kind: a layer whose
// position p attends to positions p-W+1..p only, optionally with attention
// sinks (a learned logit per head in the softmax denominator). Its cache is
// a ring that keeps what later positions can still see (KVCache), its
// attention is Backend.WindowedAttention, and the window pattern is part of
// the cache geometry, the KV fingerprint and the wire header, so that
// prefill and decode agree on which positions a layer keeps.

// RingSlack is how many positions before its window a sliding layer keeps
// when it drops old positions (both backends' ring caches), so that a
// conversation can go back a little without losing the window.
const RingSlack = 32

// SlidingHeldMax bounds the positions a sliding layer of window w holds
// when every step appends at most chunk positions: the size of its ring's
// storage (both backends size it so), whatever the sequence's length.
func SlidingHeldMax(w, chunk int) int {
	return (max(w-1+RingSlack+chunk, 2*(w+RingSlack)) + 15) / 16 * 16
}

// geometry is the cache geometry of the model's layers.
func (m *Model) geometry() CacheGeometry {
	return CacheGeometry{Layers: len(m.kinds), KVHeads: m.rc.KVHeads, HeadDim: m.cfg.HeadDim, Windows: m.windows}
}
