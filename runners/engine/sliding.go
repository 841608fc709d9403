package engine

import "fmt"

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

// layerWindows returns each layer's window for cfg (nil when every layer is
// full attention).
func layerWindows(cfg *Config, arch Arch) ([]int, error) {
	var w []int
	switch {
	case arch.Windows != nil:
		var err error
		if w, err = arch.Windows(cfg); err != nil {
			return nil, err
		}
		if w != nil && len(w) != cfg.Layers {
			return nil, fmt.Errorf("engine: %d layer windows for %d layers", len(w), cfg.Layers)
		}
	case arch.SlidingWindow && cfg.SlidingWindow > 0:
		w = make([]int, cfg.Layers)
		for i := range w {
			w[i] = cfg.SlidingWindow
		}
	}
	for _, x := range w {
		if x < 0 {
			return nil, cfgErr("sliding_window", "negative window %d", x)
		}
		if x > 0 {
			return w, nil
		}
	}
	return nil, nil
}

// geometry is the cache geometry of the model's layers.
func (m *Model) geometry() CacheGeometry {
	return CacheGeometry{Layers: m.cfg.Layers, KVHeads: m.cfg.KVHeads, HeadDim: m.cfg.HeadDim, Windows: m.windows}
}

// window is layer i's window (0: full attention).
func (m *Model) window(i int) int {
	if m.windows == nil {
		return 0
	}
	return m.windows[i]
}

// attention runs layer i's attention over its cache view: the plain causal
// op for full layers without sinks, the windowed one otherwise.
func (m *Model) attention(i int, q, k, v Array, scale float32) Array {
	w, sinks := m.window(i), m.layers[i].sinks
	if w == 0 && sinks == nil {
		return m.b.Attention(q, k, v, scale)
	}
	return m.b.WindowedAttention(q, k, v, scale, w, sinks)
}

// qwenWindows is HF Qwen2/Qwen3's rule: with use_sliding_window, the layers
// from max_window_layers on (or those layer_types names
// sliding_attention) slide over sliding_window; without it none does.
func qwenWindows(c *Config) ([]int, error) {
	if !c.SlidingWindowUse {
		return nil, nil
	}
	if c.SlidingWindow <= 0 {
		return nil, cfgErr("sliding_window", "use_sliding_window needs a positive sliding_window")
	}
	w := make([]int, c.Layers)
	for i := range w {
		slide := i >= c.MaxWindowLayers
		if c.LayerTypes != nil {
			slide = c.LayerTypes[i] == "sliding_attention"
		}
		if slide {
			w[i] = c.SlidingWindow
		}
	}
	return w, nil
}
