package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"sort"
	"strings"
	"sync"
)

// Architecture is everything the engine knows about one model family,
// registered by HF architecture name from the init of that family's file
// (arch_<name>.go). Shared code never asks which architecture it runs: it
// calls these functions and composes the blocks they return.
type Architecture struct {
	// KVFamily names the KV semantics in the fingerprint (e.g. "llama").
	// Architectures that compute the same KV from the same weights share
	// it (Gemma3ForCausalLM and Gemma3ForConditionalGeneration).
	KVFamily string
	// Prepare, when set, rewrites config.json into the flat form the
	// common parser reads: a nested text_config lifted, the family's own
	// key names mapped, its defaults filled in, settings the engine does
	// not implement refused by name.
	Prepare func(data []byte) ([]byte, error)
	// Parse, when set, reads and validates the family's own fields of
	// the prepared config.json after the common ones (it may keep them in
	// Config.ext), and checks the common ones the family constrains.
	Parse func(data []byte, c *Config) error
	// Layers gives every layer's kind (its cache: full attention, a
	// sliding window, recurrent state).
	Layers func(c *Config) ([]LayerKind, error)
	// Source, when set, presents a checkpoint's tensors under the names
	// the family's loaders read (a multimodal checkpoint's text model).
	Source func(src Source) Source
	// Open, when set, runs before any weight is read (it may look at the
	// checkpoint's layout and set how the loader converts weights).
	Open func(l *loader, c *Config) error
	// Embed loads the token embedding (the first stage of a pipeline);
	// nil: model.embed_tokens.
	Embed func(l *loader, c *Config) (*embedding, error)
	// Head loads the final norm and the LM head (the last stage); nil:
	// model.norm and lm_head, or the embedding when tied.
	Head func(l *loader, c *Config, e *embedding) (*outputHead, error)
	// Block loads layer i of kind k.
	Block func(l *loader, c *Config, i int, k LayerKind) (Block, error)
	// Fingerprint, when set, hashes what the family's KV depends on
	// beyond the common fields (after the vocabulary).
	Fingerprint func(c *Config, w *fpWriter)
	// GGUF, when set, is how llama.cpp writes the architecture (gguf.go).
	GGUF *GGUFLayout
	// NoTensorSplit, when set, says why the family's layers cannot split
	// over tensor-parallel ranks (CheckTensorSplit refuses it by name).
	NoTensorSplit string
}

// LayerKind is what a layer keeps between steps, which decides its cache,
// what crosses the KV wire for it and how the KV fingerprint sees it.
type LayerKind struct {
	// Window is 0 for full attention (a growing K/V cache) and W > 0 for
	// attention over the last W positions (a ring cache).
	Window int
	// Recurrent marks a layer that keeps a state instead of K/V per
	// position (Gated DeltaNet: conv state and recurrent state).
	Recurrent bool
}

// Block is one layer of a model: it owns its weights, knows its cache
// kind and how its weights split across tensor-parallel ranks, and runs a
// step's rows through itself. A model is its embedding (first stage), a
// sequence of blocks, and its output head (last stage); blocks [a, b)
// load and run alone (LoadOptions.Layers).
type Block interface {
	// Kind is the layer's cache kind.
	Kind() LayerKind
	// Weights lists the block's tensors (name prefixes as loaded) and
	// how each shards across tensor-parallel ranks.
	Weights() []Weight
	// forward adds the layer to the residual stream x [n, D] of every
	// sequence of the step, appending to (or replacing) cache slot of
	// each sequence's cache. When s.tail is set (the last layer of a
	// step that wants no logits) it only fills the caches, records what
	// the step must evaluate, and returns nil.
	forward(s *step, slot int, x Array) (Array, error)
}

// Shard says how a weight splits across tensor-parallel ranks (as MLX's
// shard_linear does; quantized scales and biases split with their weight).
type Shard int

const (
	// Replicated: every rank holds the whole tensor (norms, routers).
	Replicated Shard = iota
	// SplitOutput: split along the output rows (axis −2 of [.., out, in],
	// the bias with it): q/k/v, gate/up, experts' gate/up. Each rank
	// computes its share of heads or of the intermediate width.
	SplitOutput
	// SplitInput: split along the input columns (axis −1), the outputs
	// summed over the ranks (all_sum) after: o_proj, down projections.
	// A bias is added once, after the sum.
	SplitInput
	// SplitHeads: a per-head vector ([H]: attention sinks) split with the
	// heads.
	SplitHeads
)

// Weight names one tensor of a block (the loader's name: a Linear's prefix,
// a vector's full name; routed experts by their stacked name as mlx-lm
// stores them, whichever layout the checkpoint has) and how it shards.
type Weight struct {
	Name  string
	Shard Shard
}

// embedding is the first stage's token embedding, optionally scaled (Gemma
// 3: by √D in bf16).
type embedding struct {
	table *Linear // [V, D]
	scale Array   // [D] or nil
}

// outputHead is the last stage's final norm and LM head.
type outputHead struct {
	norm Array   // [D]
	out  *Linear // [V, D]; the embedding table when tied
}

// archRegistry maps HF architecture names to their Architecture. It is
// filled by init functions only and read-only afterwards.
var archRegistry = struct {
	sync.RWMutex
	m map[string]*Architecture
}{m: map[string]*Architecture{}}

// Register registers an architecture under an HF architecture name
// (called from init).
func Register(name string, a *Architecture) {
	archRegistry.Lock()
	defer archRegistry.Unlock()
	if _, dup := archRegistry.m[name]; dup {
		panic("engine: architecture registered twice: " + name)
	}
	if a.Layers == nil || a.Block == nil || a.KVFamily == "" {
		panic("engine: architecture " + name + " without KVFamily, Layers or Block")
	}
	archRegistry.m[name] = a
}

// registered returns the architecture registered under name (nil if none).
func registered(name string) *Architecture {
	archRegistry.RLock()
	defer archRegistry.RUnlock()
	return archRegistry.m[name]
}

func lookupArch(name string) (*Architecture, error) {
	if a := registered(name); a != nil {
		return a, nil
	}
	return nil, cfgErr("architectures", "unsupported %q (supported: %s)", name, strings.Join(Architectures(), ", "))
}

// Architectures lists the registered HF architecture names.
func Architectures() []string {
	archRegistry.RLock()
	defer archRegistry.RUnlock()
	names := make([]string, 0, len(archRegistry.m))
	for n := range archRegistry.m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// fpWriter is the KV fingerprint's hash with its encodings.
type fpWriter struct {
	h interface{ Write([]byte) (int, error) }
}

func (w *fpWriter) u64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	w.h.Write(b[:])
}

func (w *fpWriter) f64(v float64) { w.u64(math.Float64bits(v)) }

func (w *fpWriter) str(s string) {
	w.u64(uint64(len(s)))
	w.h.Write([]byte(s))
}

// fingerprint hashes what makes KV transferable between two models: the
// family, the geometry, RoPE, the recurrent layers' shapes, the vocabulary,
// the family's own settings and the window pattern (hashed only when some
// layer slides, so full-attention models keep the fingerprints they had).
func fingerprint(c *Config, a *Architecture, vocab []string, kinds []LayerKind) Fingerprint {
	h := sha256.New()
	w := &fpWriter{h: h}
	w.str("exo-pd kv fingerprint v1")
	w.str(a.KVFamily)
	w.u64(uint64(c.Layers))
	w.u64(uint64(c.KVHeads))
	w.u64(uint64(c.HeadDim))
	r := c.RoPE
	w.u64(uint64(r.Dims))
	w.f64(r.Base)
	w.str(r.Scale.Type)
	for _, f := range []float64{r.Scale.Factor, r.Scale.LowFreqFactor, r.Scale.HighFreqFactor, r.Scale.BetaFast, r.Scale.BetaSlow, r.Scale.MScale, r.Scale.MScaleAllDim} {
		w.f64(f)
	}
	w.u64(uint64(r.Scale.OriginalMaxPositions))
	if recurrent(kinds) {
		// Which layers are recurrent and the shapes of their states.
		w.str("gated deltanet")
		for _, v := range []int{c.FullAttentionInterval, c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim, c.LinearConvKernel} {
			w.u64(uint64(v))
		}
	}
	w.u64(uint64(len(vocab)))
	for _, t := range vocab {
		w.str(t)
	}
	if a.Fingerprint != nil {
		a.Fingerprint(c, w)
	}
	if ws := windows(kinds); ws != nil {
		w.str("windows")
		for _, x := range ws {
			w.u64(uint64(x))
		}
	}
	var fp Fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}

// windows is the per-layer window list of kinds (nil when every layer is
// full attention or recurrent).
func windows(kinds []LayerKind) []int {
	for _, k := range kinds {
		if k.Window > 0 {
			w := make([]int, len(kinds))
			for i, k := range kinds {
				w[i] = k.Window
			}
			return w
		}
	}
	return nil
}

// recurrent reports whether some layer keeps a recurrent state.
func recurrent(kinds []LayerKind) bool {
	for _, k := range kinds {
		if k.Recurrent {
			return true
		}
	}
	return false
}

// uniformKinds gives every layer the same window (0: full attention).
func uniformKinds(c *Config, window int) []LayerKind {
	k := make([]LayerKind, c.Layers)
	for i := range k {
		k[i].Window = window
	}
	return k
}

// typedKinds maps HF layer_types ("sliding_attention", "full_attention")
// to kinds: sliding layers slide over window.
func typedKinds(types []string, window int) []LayerKind {
	k := make([]LayerKind, len(types))
	for i, t := range types {
		if t == "sliding_attention" {
			k[i].Window = window
		}
	}
	return k
}
