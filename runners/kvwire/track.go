package kvwire

import "fmt"

// tracker enforces the ordering rules of PROTOCOL.md §12 and counts the
// totals. The server runs one over what its producer emits, the client one
// over what it receives; both must agree with the Done frame.
type tracker struct {
	h        *Header
	maxFrame int
	// next[l] is, for an attention layer, the next token position expected;
	// for a recurrent layer, the token_end of its last state (-1: none).
	next   []int
	totals Totals
}

func newTracker(h *Header, lim Limits) *tracker {
	t := &tracker{h: h, maxFrame: lim.MaxFrame, next: make([]int, len(h.Kinds))}
	for i, k := range h.Kinds {
		if k == LayerAttention {
			t.next[i] = h.LayerStart(i)
		} else {
			t.next[i] = -1
		}
	}
	t.totals.TokenEnd = h.TokenEnd
	return t
}

func (t *tracker) chunk(layer, start, count, kl, vl int) error {
	if layer < 0 || layer >= len(t.h.Kinds) {
		return fmt.Errorf("chunk for layer %d of %d", layer, len(t.h.Kinds))
	}
	if t.h.Kinds[layer] != LayerAttention {
		return fmt.Errorf("chunk for recurrent layer %d", layer)
	}
	if start != t.next[layer] {
		return fmt.Errorf("layer %d chunk starts at %d, expected %d", layer, start, t.next[layer])
	}
	if count < 1 || count > t.h.TokenEnd-start {
		return fmt.Errorf("layer %d chunk [%d, +%d) beyond token_end %d", layer, start, count, t.h.TokenEnd)
	}
	want := t.h.KVBytes(count)
	if int64(kl) != want || int64(vl) != want {
		return fmt.Errorf("layer %d chunk of %d tokens has K %d / V %d bytes, geometry says %d each", layer, count, kl, vl, want)
	}
	if chunkPrefixSize+2*want > int64(t.maxFrame) {
		return fmt.Errorf("layer %d chunk of %d bytes exceeds the frame limit %d", layer, chunkPrefixSize+2*want, t.maxFrame)
	}
	t.next[layer] = start + count
	t.totals.Chunks++
	t.totals.PayloadBytes += int64(kl) + int64(vl)
	return nil
}

func (t *tracker) state(layer, tokenEnd int, sizes int64) error {
	if layer < 0 || layer >= len(t.h.Kinds) {
		return fmt.Errorf("state for layer %d of %d", layer, len(t.h.Kinds))
	}
	if t.h.Kinds[layer] != LayerRecurrent {
		return fmt.Errorf("state for attention layer %d", layer)
	}
	if tokenEnd < t.h.TokenStart || tokenEnd > t.h.TokenEnd || tokenEnd < t.next[layer] {
		return fmt.Errorf("layer %d state at %d outside [%d, %d] or before %d", layer, tokenEnd, t.h.TokenStart, t.h.TokenEnd, t.next[layer])
	}
	t.next[layer] = tokenEnd
	t.totals.States++
	t.totals.PayloadBytes += sizes
	return nil
}

// complete checks that every layer reached token_end.
func (t *tracker) complete() error {
	for i, k := range t.h.Kinds {
		if t.next[i] == t.h.TokenEnd {
			continue
		}
		if k == LayerAttention {
			return fmt.Errorf("layer %d ends at %d, token_end is %d", i, t.next[i], t.h.TokenEnd)
		}
		if t.h.TokenEnd > t.h.TokenStart || t.next[i] >= 0 {
			return fmt.Errorf("recurrent layer %d has no state at token_end %d", i, t.h.TokenEnd)
		}
	}
	return nil
}
