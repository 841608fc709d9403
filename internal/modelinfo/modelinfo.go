// Package modelinfo reads the facts that placement needs from a local model
// source without loading it: the layer count, each layer's weight bytes (from
// the safetensors headers or the GGUF tensor infos, by the layer index in the
// tensor names), the bytes outside the layers (embedding, LM head, final
// norm), the attention shape (heads, KV heads, head dim), the MLP sizes
// (intermediate, experts), the context length and the KV bytes per token of
// a layer. It also finds a source in the model store read-only (Locate).
//
// It owns only reading headers and config files: it never reads weight data,
// never downloads, and must not import runners/ (the supervisor, which
// builds with CGO_ENABLED=0, uses it) or any supervisor package.
package modelinfo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrFormat is wrapped by every error about malformed model files.
var ErrFormat = errors.New("modelinfo: malformed model file")

// Facts describe a model for placement.
type Facts struct {
	Path   string // the model directory or .gguf file read
	Format string // "safetensors" or "gguf"
	Arch   string // architectures[0] (safetensors) or general.architecture (GGUF)

	Layers int
	// LayerBytes[i] is the weight bytes of layer i (every tensor whose
	// name carries layer index i).
	LayerBytes []int64
	// Bytes outside the layers: the token embedding, the LM head (0 when
	// tied to the embedding), the final norm, and the rest (e.g. tensors of
	// layers past Layers, such as multi-token-prediction heads, or rotary
	// tables).
	EmbedBytes, HeadBytes, NormBytes, OtherBytes int64
	// Tied: the LM head is the embedding matrix (no head tensor), so the
	// last stage needs the embedding too.
	Tied bool

	Hidden, Heads, KVHeads, HeadDim int
	// Intermediate is the dense MLP width; MoEIntermediate each expert's;
	// Experts the routed experts per sparse layer (0: dense).
	Intermediate, MoEIntermediate, Experts int
	// What a tensor-parallel split must divide besides heads and widths
	// (see TensorCheck): the shared expert's width (Qwen2-MoE), Gated
	// DeltaNet's key and value heads and value head dim, the affine
	// quantization group (0: dense), whether some layers have a dense MLP
	// and some a sparse one.
	SharedExpertIntermediate         int
	LinearKeyHeads, LinearValueHeads int
	LinearValueDim                   int
	QuantGroup                       int
	DenseMLP, SparseMLP              bool
	// MaxContext is the model's context length (max_position_embeddings,
	// GGUF context_length).
	MaxContext int
	// KVLayer[i] says layer i keeps a KV cache (attention); false for
	// recurrent (Gated DeltaNet) layers, whose state is fixed-size.
	KVLayer []bool
	// Window[i] is layer i's sliding window in positions (0: full
	// attention, a KV cache that grows with the context). Read from
	// config.json by the engine's rules (layer_types, Gemma 3's pattern,
	// Mistral's sliding_window, Qwen's use_sliding_window); a GGUF's layers
	// count as full (an over-estimate).
	Window []int
	// KVElemBytes is the KV cache element size assumed: 4 for f32 models
	// and for GGUF (the cpu backend's f32 cache, the larger of its two),
	// else 2.
	KVElemBytes int
}

// KVBytesPerTokenPerLayer is one attention layer's K and V bytes for one
// token: 2 × KV heads × head dim × element bytes.
func (f *Facts) KVBytesPerTokenPerLayer() int64 {
	return 2 * int64(f.KVHeads) * int64(f.HeadDim) * int64(f.KVElemBytes)
}

// KVTokens is how many positions of context tokens layer i's cache holds:
// 0 for a recurrent layer, the window for a sliding one, else context.
func (f *Facts) KVTokens(i, context int) int {
	if i < 0 || i >= len(f.KVLayer) || !f.KVLayer[i] {
		return 0
	}
	if i < len(f.Window) && f.Window[i] > 0 {
		return min(f.Window[i], context)
	}
	return context
}

// KVBytes is the KV reserve of layers [a, b) for context tokens.
func (f *Facts) KVBytes(a, b, context int) int64 {
	var n int64
	for i := max(a, 0); i < min(b, f.Layers); i++ {
		n += int64(f.KVTokens(i, context))
	}
	return n * f.KVBytesPerTokenPerLayer()
}

// LayerRangeBytes is the weight bytes of layers [a, b).
func (f *Facts) LayerRangeBytes(a, b int) int64 {
	var n int64
	for i := max(a, 0); i < min(b, len(f.LayerBytes)); i++ {
		n += f.LayerBytes[i]
	}
	return n
}

// KVLayers counts the layers of [a, b) that keep a growing KV cache.
func (f *Facts) KVLayers(a, b int) int {
	n := 0
	for i := max(a, 0); i < min(b, len(f.KVLayer)); i++ {
		if f.KVLayer[i] {
			n++
		}
	}
	return n
}

// TotalBytes is every weight byte.
func (f *Facts) TotalBytes() int64 {
	return f.LayerRangeBytes(0, f.Layers) + f.EmbedBytes + f.HeadBytes + f.NormBytes + f.OtherBytes
}

// Read reads the facts of a model directory (config.json and safetensors)
// or a .gguf file.
func Read(path string) (*Facts, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("modelinfo: %w", err)
	}
	var f *Facts
	if st.IsDir() {
		f, err = readDir(path)
	} else if strings.HasSuffix(strings.ToLower(path), ".gguf") {
		f, err = readGGUFFile(path)
	} else {
		return nil, fmt.Errorf("modelinfo: %s is neither a model directory nor a .gguf file", path)
	}
	if err != nil {
		return nil, err
	}
	f.Path, _ = filepath.Abs(path)
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("modelinfo: %s: %w", path, err)
	}
	return f, nil
}

func (f *Facts) check() error {
	switch {
	case f.Layers < 1:
		return fmt.Errorf("%w: no layer count", ErrFormat)
	case f.Heads < 1 || f.KVHeads < 1 || f.HeadDim < 1:
		return fmt.Errorf("%w: attention shape (heads %d, KV heads %d, head dim %d)", ErrFormat, f.Heads, f.KVHeads, f.HeadDim)
	case len(f.LayerBytes) != f.Layers || len(f.KVLayer) != f.Layers:
		return fmt.Errorf("%w: per-layer facts for %d of %d layers", ErrFormat, len(f.LayerBytes), f.Layers)
	}
	for i, b := range f.LayerBytes {
		if b == 0 {
			return fmt.Errorf("%w: layer %d has no weights", ErrFormat, i)
		}
	}
	return nil
}

// tensorKind sorts a tensor outside the layers.
type tensorKind int

const (
	kindOther tensorKind = iota
	kindEmbed
	kindHead
	kindNorm
)

// add counts n bytes of tensor name: by layer index when it has one below
// f.Layers, else by kind.
func (f *Facts) add(layer int, kind tensorKind, n int64) {
	switch {
	case layer >= 0 && layer < f.Layers:
		f.LayerBytes[layer] += n
	case layer >= 0:
		f.OtherBytes += n
	case kind == kindEmbed:
		f.EmbedBytes += n
	case kind == kindHead:
		f.HeadBytes += n
	case kind == kindNorm:
		f.NormBytes += n
	default:
		f.OtherBytes += n
	}
}
