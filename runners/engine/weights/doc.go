// Package weights opens model weight files and presents them as an
// engine.Source in HF naming: HF safetensors directories (single file or
// sharded through model.safetensors.index.json; F32/F16/BF16; MLX-quantized
// U32 + scales + biases) and GGUF files (metadata, tensor directory, and the
// conversion of GGUF tensors to HF names, HF shapes and MLX affine packing).
//
// Files are memory-mapped where the platform allows it and every length,
// count and offset read from a file is checked against the file's size
// before use: a corrupt or hostile file yields an error, never a panic or a
// huge allocation.
//
// Which GGUF architectures exist, their HF names, block stems and
// metadata → config.json mapping are the architectures' own (each
// arch_*.go file's engine.GGUFLayout); this package applies them and the
// tensor conversions they name.
//
// This package owns only file decoding. It must not import backends,
// runners, HTTP code or anything under supervisor/; it depends only on the
// engine package's Source contract and GGUF layouts.
package weights
