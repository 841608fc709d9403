package engine

import "errors"

// ErrNotFound is returned (wrapped) by a Source for a missing tensor.
var ErrNotFound = errors.New("engine: tensor not found")

// Tensor is host-side weight data as stored on disk (possibly memory-mapped:
// Data is read-only and valid until the Source is closed).
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// QuantSpec says how a linear layer's weight is quantized (MLX affine form,
// see Linear). Bits 0 means dense.
type QuantSpec struct {
	Bits, GroupSize int
	Mode            string // "" (MLX affine) or "mxfp4" (see Linear)
}

// Source is a set of named tensors in HF naming
// ("model.layers.0.self_attn.q_proj.weight"), whatever the file format. A
// quantized linear "p" appears as "p.weight" (U32 packed), "p.scales" and
// "p.biases". Implementations live in engine/weights (safetensors
// directories, GGUF files).
type Source interface {
	// Tensor returns the named tensor or an error wrapping ErrNotFound.
	Tensor(name string) (Tensor, error)
	// Names lists every tensor name.
	Names() []string
	// Quant returns the quantization of the linear layer with this prefix
	// ("model.layers.0.mlp.up_proj"); Bits 0 when dense.
	Quant(prefix string) QuantSpec
	// Config returns the model's HF config.json bytes (for GGUF, an
	// equivalent config.json synthesized from the metadata).
	Config() []byte
	// Vocab returns the token strings in id order (tokenizer.json's
	// model.vocab plus added_tokens, or GGUF tokenizer.ggml.tokens); the
	// engine hashes it into the KV fingerprint.
	Vocab() ([]string, error)
	Close() error
}
