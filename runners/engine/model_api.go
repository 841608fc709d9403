package engine

// This file fixes the contract between the engine and the runners. The
// implementation (model.go, step.go, the arch_*.go files) provides exactly these
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
	// HostMoERouting makes MoE layers read their router logits back and
	// choose experts on the host (one synchronization per sparse layer and
	// step) instead of inside the graph. It exists only as the baseline of
	// the benchmarks that measure what in-graph routing gains; the results
	// agree up to rounding of the expert weights.
	HostMoERouting bool
	// RouteObserver, when set, is called by each sparse (MoE) layer of
	// every step with the experts it chose, token by token ([n][k],
	// in TopK's order: compare them as sets): a diagnostic for tests that ask whether two runs
	// routed alike. It costs one synchronization per sparse layer and
	// step (the indices are read back), so it is nil outside such tests;
	// it does not change what is computed.
	RouteObserver func(layer int, experts [][]int32)
	// Beside, when set, is a model on the same backend that this one runs
	// beside (a speculative decoder's draft beside its target): the two
	// share one lock, so their steps never overlap (a backend's step
	// temporaries, the cpu arena or the MLX thread's, are one per
	// backend). Load refuses a model of another backend.
	Beside *Model
	// Layers, when set, loads only layers [Start, End): a pipeline stage
	// (the embedding only with the first layer, the final norm and LM head
	// only with the last). A stage runs through StageForward; its caches
	// (NewCache) hold its layers only; Info and Fingerprint are the whole
	// model's.
	Layers LayerRange
	// Tensor, when set, loads this rank's share of a tensor-parallel
	// split over Tensor.Size() ranks (tensor.go): every rank loads the
	// same model with its own Collective and runs every step with the
	// same arguments in lockstep; the blocks sum their partial outputs
	// with Tensor.AllSum. The rank count must divide the model's heads
	// and widths (CheckTensorSplit, refused at load otherwise). Every
	// rank returns the same logits; caches hold the rank's KV heads
	// (KVHeadRange). Info and Fingerprint are the whole model's.
	Tensor Collective
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
	// Recurrent marks the recurrent (Gated DeltaNet) layers; nil when the
	// model has none. Their caches implement RecurrentState.
	Recurrent []bool
}

// RecurrentState is implemented by the cache of a model with recurrent
// layers: what such a layer keeps is a state, not K and V per position, and
// it crosses the KV wire in State frames.
type RecurrentState interface {
	// Recurrent reports whether layer is recurrent.
	Recurrent(layer int) bool
	// ExportState returns the layer's state after the cache's Len()
	// positions: for Gated DeltaNet, the conv state [K−1, C] and the
	// recurrent state [Hv, Dv, Dk], each float32 little-endian.
	ExportState(layer int) ([][]byte, error)
	// ImportState stages a layer's state in ExportState's layout; Commit
	// applies every staged state at once (and fails unless every recurrent
	// layer has one), Truncate back to Len() drops them.
	ImportState(layer int, arrays [][]byte) error
}

// Fingerprint identifies everything that makes KV computed by one model
// usable by another: architecture family, layer count, KV heads, head dim,
// RoPE settings and the vocabulary (token strings in id order). It does not
// include the dtype: the wire states the dtype of the bytes it carries and
// the importing side converts between F32, F16 and BF16. Prefill and decode
// pair when fingerprints are equal, whatever their weights' format or
// quantization.
type Fingerprint [32]byte
