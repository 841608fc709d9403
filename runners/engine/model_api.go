package engine

// This file fixes the contract between the engine and the runners. The
// implementation (model.go, llama.go, …) provides exactly these
// declarations; runners depend on nothing else in this package.
//
//	func Load(ctx context.Context, path string, b Backend, opts LoadOptions) (*Model, error)
//	    path is a model directory (config.json + *.safetensors) or a .gguf file.
//	    Load opens it with the SourceOpener that runners/engine/backend
//	    registers (engine cannot import engine/weights, which imports it), so
//	    programs get their Backend from backend.Open. LoadSource(ctx, src, b,
//	    opts) loads from an already open Source.
//	func (m *Model) Info() ModelInfo
//	func (m *Model) Fingerprint() Fingerprint
//	func (m *Model) Backend() Backend
//	func (m *Model) NewCache() KVCache
//	func (m *Model) Forward(ctx context.Context, c KVCache, tokens []int32) ([]float32, error)
//	    runs tokens at positions c.Len()…, appends their KV, returns the
//	    float32 logits [V] of the last position only.
//	func (m *Model) ForwardBatch(ctx context.Context, caches []KVCache, tokens []int32) ([][]float32, error)
//	    one decode step for several sequences at once (token i appended to
//	    caches[i]); the same logits as separate Forward calls, with the
//	    projections and MLPs run once over all rows.
//	func (m *Model) ForwardInto(ctx, c, tokens, dst []float32) ([]float32, error)
//	func (m *Model) ForwardBatchInto(ctx, caches, tokens, dst []float32) ([][]float32, error)
//	    the same, writing the logits into the caller's reused buffer: a warm
//	    decode step then allocates nothing on the cpu backend.
//	func (m *Model) Prefill(ctx context.Context, c KVCache, tokens []int32, chunk int,
//	    onChunk func(start, n int) error) error
//	    runs tokens in chunks of at most chunk tokens (0 = default 512); after
//	    each chunk's KV is in the cache (evaluated) calls onChunk with the
//	    absolute positions [start, start+n); computes no logits; an error
//	    from onChunk or ctx stops it after the current chunk.
//	func (m *Model) Close() error

// LoadOptions tunes Load.
type LoadOptions struct {
	// CacheDType is the KV cache dtype; 0 means the model's dtype (F32 for
	// f32 weights, BF16 for bf16 or quantized safetensors, F32 for GGUF on
	// the cpu backend).
	CacheDType DType
	// Progress, when set, is called as weights load with bytes done/total.
	Progress func(done, total int64)
}

// ModelInfo describes a loaded model.
type ModelInfo struct {
	Arch         string // HF architecture name, e.g. "LlamaForCausalLM"
	Layers       int
	Hidden       int
	Heads        int
	KVHeads      int
	HeadDim      int
	Vocab        int
	MaxPositions int
	CacheDType   DType
	// Windows has one entry per layer (0: full attention, W: sliding
	// window of W positions); nil when every layer is full attention.
	Windows []int
}

// Fingerprint identifies everything that makes KV computed by one model
// usable by another: architecture family, layer count, KV heads, head dim,
// RoPE settings and the vocabulary (token strings in id order). It does not
// include the dtype: the wire states the dtype of the bytes it carries and
// the importing side converts between F32, F16 and BF16. Prefill and decode
// pair when fingerprints are equal, whatever their weights' format or
// quantization.
type Fingerprint [32]byte
