// Package engine owns the inference engine's contract: a small array API
// (Backend) that every backend implements, the model code written once against
// it, the KV cache contract, and the loading of a model directory or GGUF file
// into a runnable Model.
//
// Shape conventions (batch size is always 1 and never appears in a shape):
//
//	hidden states      [L, D]            L tokens in this step, D model width
//	q                  [H, L, Dh]        H query heads, Dh head dim
//	k, v (step)        [Hkv, L, Dh]
//	k, v (cache)       [Hkv, T, Dh]      T tokens cached so far, per layer
//	logits             [L, V] or [V]
//
// Evaluation model: a backend may be eager (cpu: every op computes at once) or
// lazy (mlx: ops build a graph that Eval computes). Model code must therefore
// call Eval before reading data back, and must not assume an op has run.
//
// Errors: ops do not return errors. Programming errors (shape mismatch, wrong
// dtype) panic with a descriptive message; a backend's own runtime failure
// (for mlx, an error reported by mlx-c) panics with an error value wrapping
// ErrBackend. The engine's public entry points (Model.Forward and friends)
// recover these panics into returned errors, so callers outside this package
// never see them.
//
// Memory: arrays made during a step are temporaries. Backend.Free releases
// them explicitly after the step; Backend.Keep marks arrays (weights, cache
// storage) that a Free-all sweep must leave alone. Eval ends the life of the
// temporaries it is not given (see Backend.Eval), so a step's intermediates
// need not all be alive at once. The cpu backend relies on the Go GC and may
// treat Free/Keep as no-ops; the mlx backend must not.
//
// Models: an architecture is one file, arch_<model_type>.go, that registers
// an Architecture under its HF architecture name(s) in init(): its config
// (Prepare maps the family's config.json onto the common fields, Parse
// validates its own settings), its layer kinds (Layers), how it reads its
// checkpoint (Source, Open, Embed, Head: HF, mlx-community and the GGUF
// names weights presents) and its layers (Block) composed from the shared
// blocks: decoderLayer (a mixer and a feed-forward part, each with optional
// norms before and after), attention (full, sliding, sinks, gated, RoPE
// variants or none, q/k norms per head or over the projection), the dense
// gated MLP (SwiGLU, GeGLU, clamped SwiGLU), the MoE (moe.go) and Gated
// DeltaNet (deltanet.go). Shared code never branches on an architecture.
//
// A Model is an embedding (the first pipeline stage's), a sequence of
// Blocks and an output head (final norm and LM head: the last stage's).
// Each Block has a LayerKind (full attention, a window, recurrent), which
// drives the cache, the KV fingerprint and the wire header; it lists its
// weights and how each shards across tensor-parallel ranks (Weight, Shard:
// q/k/v and gate/up by output rows, o and down by input columns then
// all_sum, experts along their intermediate width, per-head vectors with
// the heads), and runs all of a step's sequences at once over cache slot i.
// Blocks depend only on the step and their own weights, so a layer range
// [a, b) loads and runs alone (LoadOptions.Layers, Model.StageForward: the
// first stage embeds tokens, later ones take the previous stage's hidden
// states, the last returns logits; a stage's cache holds its layers only):
// Architecture.Block is called per layer of the range, Embed only for the
// first stage and Head only for the last. A model also splits over
// tensor-parallel ranks (tensor.go, LoadOptions.Tensor): each rank loads
// its share of every block as the shard kinds say and the blocks sum
// their partial outputs through a Collective (an MLX group, or LocalGroup's
// in-process ranks); CheckTensorSplit says which rank counts a config
// allows.
//
// This package must not import anything under supervisor/, nor kvwire, nor
// any HTTP code: it is a library used by the runners.
package engine

import (
	"errors"
	"fmt"
)

// DType is an element type.
type DType uint8

// Element types. U32 holds packed quantized weights; I32 holds token ids.
const (
	F32 DType = iota + 1
	F16
	BF16
	I32
	U32
	U8
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32, U32:
		return 4
	case F16, BF16:
		return 2
	case U8:
		return 1
	}
	panic(fmt.Sprintf("engine: unknown dtype %d", d))
}

func (d DType) String() string {
	switch d {
	case F32:
		return "float32"
	case F16:
		return "float16"
	case BF16:
		return "bfloat16"
	case I32:
		return "int32"
	case U32:
		return "uint32"
	case U8:
		return "uint8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType parses the names used by safetensors ("F32", "BF16") and by
// HF config.json torch_dtype ("float32", "bfloat16").
func ParseDType(s string) (DType, error) {
	switch s {
	case "F32", "float32":
		return F32, nil
	case "F16", "float16":
		return F16, nil
	case "BF16", "bfloat16":
		return BF16, nil
	case "I32", "int32":
		return I32, nil
	case "U32", "uint32":
		return U32, nil
	case "U8", "uint8":
		return U8, nil
	}
	return 0, fmt.Errorf("engine: unknown dtype %q", s)
}

// ErrBackend wraps failures reported by a backend's runtime.
var ErrBackend = errors.New("engine: backend error")

// Array is a backend-owned n-dimensional array. Only the backend that made
// it may operate on it.
type Array interface {
	Shape() []int
	DType() DType
}

// Linear is a (possibly quantized) weight matrix in HF layout [out, in] with
// an optional bias [out]. When Bits is 0 the weight is dense (W is [out, in]
// float). When Bits > 0 it uses MLX's affine quantization: W is U32
// [out, in*Bits/32] with values packed little-end first (element j of a
// uint32 occupies bits [j*Bits, (j+1)*Bits)), Scales and Biases are
// [out, in/GroupSize] float, and w = scale*q + bias for each group.
// GGUF Q4_0, Q4_1 and Q8_0 are converted to this form at load (group 32).
type Linear struct {
	W, Scales, Biases Array
	Bias              Array // nil when absent
	Bits, GroupSize   int
	// Mode "mxfp4" (MLX's and OCP's MXFP4, gpt-oss's experts): Bits 4,
	// GroupSize 32, W packed as for affine but each 4-bit value is an
	// E2M1 float (sign, 2 exponent bits, 1 mantissa bit: ±{0, 0.5, 1,
	// 1.5, 2, 3, 4, 6}), Scales U8 [out, in/32] E8M0 (2^(s-127)), no
	// Biases: w = e2m1(q) · 2^(s-127), exact in float32.
	Mode string
}

// RoPE describes rotary position embedding as HF configs state it.
// Dims is the number of rotated dimensions (normally the head dim); the
// rotation is the non-interleaved "rotate half" form used by HF Llama/Qwen.
type RoPE struct {
	Dims  int
	Base  float64
	Scale RoPEScaling
}

// RoPEScaling is the rope_scaling block of config.json. Type is "" (none),
// "linear", "llama3" or "yarn".
type RoPEScaling struct {
	Type                          string
	Factor                        float64
	LowFreqFactor, HighFreqFactor float64 // llama3
	OriginalMaxPositions          int     // llama3, yarn
	BetaFast, BetaSlow            float64 // yarn
	MScale, MScaleAllDim          float64 // yarn
	// NoTruncate (yarn, config "truncate": false, as gpt-oss's): the
	// correction range's ends stay fractional instead of being floored and
	// ceiled (HF transformers honours the key; mlx-lm and llama.cpp do
	// not, and always truncate).
	NoTruncate bool
}

// Backend is the array API. The model code in this package is written only
// against it. Implementations: engine/cpu (pure Go, eager) and engine/mlx
// (mlx-c, lazy). A Backend is not safe for concurrent use unless it says so;
// the runners serialize work per model.
type Backend interface {
	// Name is "cpu" or "mlx" (plus device, e.g. "mlx-gpu").
	Name() string

	// FromBytes makes an array from host bytes in dtype dt (little-endian),
	// copying them. len(data) must equal product(shape)*dt.Size().
	FromBytes(data []byte, shape []int, dt DType) Array
	// FromFloat32 and FromInt32 are conveniences over FromBytes.
	FromFloat32(data []float32, shape ...int) Array
	FromInt32(data []int32, shape ...int) Array
	// Bytes evaluates a and returns its contents as little-endian host
	// bytes in a's dtype, row-major. The slice is the caller's.
	Bytes(a Array) ([]byte, error)
	// Float32 evaluates a and returns it converted to float32.
	Float32(a Array) ([]float32, error)

	// Eval computes the given arrays (a no-op for eager backends). It also
	// ends the step's other temporaries: a lazy backend releases every
	// temporary made before the call that is neither among arrays nor
	// kept, so that intermediate storage is freed while the graph runs.
	// Using such an array afterwards is a programming error (the mlx
	// backend panics); arrays stays valid until Free.
	Eval(arrays ...Array) error
	// Keep pins arrays so that Free-all sweeps leave them alone (weights,
	// cache storage). Free releases arrays now; Free() with no arguments
	// releases every array made since the last sweep that is not kept.
	Keep(arrays ...Array)
	Free(arrays ...Array)

	// Linear computes x @ Wᵀ (+ bias) for x [L, in] → [L, out], dense or
	// quantized as l says.
	Linear(x Array, l *Linear) Array
	// MatMul is a plain batched matmul: a [..., M, K] @ b [..., K, N].
	MatMul(a, b Array) Array
	// Embedding gathers rows ids [L] (I32) from table [V, D] (dense or
	// quantized, as for Linear) → [L, D].
	Embedding(table *Linear, ids Array) Array
	// RMSNorm normalizes over the last axis: x / rms(x) * w.
	RMSNorm(x, w Array, eps float32) Array
	// RoPE rotates x [H, L, Dh] for positions offset..offset+L-1.
	RoPE(x Array, offset int, r *RoPE) Array
	// Attention computes softmax(q kᵀ * scale + mask) v for q [H, L, Dh] and
	// k, v [Hkv, T, Dh] (H a multiple of Hkv: grouped-query attention),
	// with a causal mask in which query i (absolute position T-L+i) sees
	// keys 0..T-L+i. Returns [H, L, Dh].
	Attention(q, k, v Array, scale float32) Array
	// WindowedAttention is Attention for the layer kinds that need more
	// than a causal mask (sliding.go). With window > 0, query i (absolute
	// key index T-L+i) sees only keys T-L+i-window+1..T-L+i: sliding-window
	// attention, where k and v hold at least the window each query needs
	// (a sliding layer's cache view). sinks, when not nil, is [H] float32:
	// one learned logit per head that joins each row's softmax denominator
	// and contributes no value (gpt-oss's attention sinks). window 0 and
	// nil sinks is exactly Attention. It is one op rather than a mask
	// argument because the cpu backend skips the masked keys (its sums run
	// over the visible keys only, so chunked and one-shot prefill agree bit
	// for bit) and MLX's fused attention takes the mask and the sinks
	// together.
	WindowedAttention(q, k, v Array, scale float32, window int, sinks Array) Array
	// RoPERows rotates x [N, H, Dh] row by row: row n (all its heads) as
	// RoPE rotates position positions[n] (len(positions) == N, any
	// order). A decode step of N sequences rotates its rows with one op
	// whatever their positions; row n's values are RoPE's bit for bit.
	// The backend copies positions (the caller may reuse the slice).
	RoPERows(x Array, positions []int, r *RoPE) Array
	// BatchAttention is the attention of a decode step of B sequences of
	// one row each: q [B, H, Dh], k, v [B, Hkv, Dh] (rotated). It appends
	// row b's k and v to caches[b] at layer, as caches[b].Append(layer,
	// k_b, v_b) with k_b [Hkv, 1, Dh] does, and returns [B, H, Dh] whose
	// row b is WindowedAttention(q_b, kAll_b, vAll_b, scale, window,
	// sinks) over the views that Append returns. One op so that a lazy
	// backend can keep the B sequences' K/V in one padded layout and run
	// one attention with a mask over it (the mlx backend does for full-
	// attention caches), so that the graph per layer does not grow with B;
	// the cpu backend loops over the rows. The caches are distinct. The
	// backend copies the caches slice.
	BatchAttention(caches []KVCache, layer int, q, k, v Array, scale float32, window int, sinks Array) Array

	// SwiGLU is silu(gate) · up, silu(x) = x·sigmoid(x), for gate and up of
	// one shape: the gated MLP's activation, one op so that a backend can
	// fuse it (mlx compiles it into one kernel, as mlx-lm does).
	SwiGLU(gate, up Array) Array
	// GeGLU is gelu_tanh(gate) · up with gelu_tanh(x) = 0.5·x·(1 +
	// tanh(√(2/π)·(x + 0.044715·x³))): Gemma's gated MLP activation (HF
	// gelu_pytorch_tanh, mlx-lm's nn.gelu_approx). One op, like SwiGLU, so
	// that a backend can fuse it; neither the array API's other ops nor
	// SwiGLU can express the tanh.
	GeGLU(gate, up Array) Array
	// ClampedSwiGLU is gpt-oss's expert activation: with g = min(gate,
	// limit) and u = clamp(up, -limit, limit), (u + 1) · g · σ(alpha·g).
	// One op for the same reason as SwiGLU; the clamps and the +1 are not
	// expressible with the other ops.
	ClampedSwiGLU(gate, up Array, alpha, limit float32) Array
	Add(a, b Array) Array  // broadcasting over leading axes
	Mul(a, b Array) Array  // broadcasting over leading axes
	Softmax(x Array) Array // over the last axis
	Argmax(x Array) Array  // over the last axis → I32
	Reshape(x Array, shape ...int) Array
	Transpose(x Array, perm ...int) Array
	// Slice takes [start, end) along axis.
	Slice(x Array, axis, start, end int) Array
	Concat(axis int, arrays ...Array) Array
	AsType(x Array, dt DType) Array

	// The routing ops below exist so that a mixture of experts chooses and
	// runs its experts inside the graph (as mlx-lm does): a decode step is
	// then one Eval however many sparse layers the model has, instead of
	// one read-back of router logits per layer, which stalls a GPU.

	// TopK returns the indices (I32) of the k largest entries of x along
	// the last axis: x [..., N] → [..., k]. It picks each token's experts.
	// The order of the k indices is the backend's (mlx: argpartition's,
	// unspecified; cpu: by descending value, ties to the lower index), so
	// callers must not depend on it beyond the set.
	TopK(x Array, k int) Array
	// TakeAlongAxis gathers along the last axis: x [..., N] and idx
	// [..., k] (I32, same leading axes) → [..., k] with out[..., j] =
	// x[..., idx[..., j]]. It reads the chosen experts' router scores.
	TakeAlongAxis(x, idx Array) Array
	// Take gathers rows: x [R, ...] and idx [N] (I32) → [N, ...] with
	// out[n] = x[idx[n]]. MoE prefill moves (token, expert) rows into
	// expert order with it and back again.
	Take(x, idx Array) Array
	// Argsort returns (I32) the permutation that sorts x along the last
	// axis ascending: x [..., N] → [..., N]. MoE prefill sorts its
	// (token, expert) pairs by expert so that each expert's weights are
	// read once per chunk. Ties may come in any order.
	Argsort(x Array) Array
	// GatherLinear applies a different weight matrix to each row: l holds
	// E stacked matrices (dense W [E, out, in], or MLX affine-quantized W
	// U32 [E, out, in*Bits/32] with Scales and Biases [E, out, in/GroupSize];
	// optional Bias [E, out]), x is [N, in] or [1, in] (then shared by every
	// row), experts is [N] (I32, values in [0, E)), and the result is
	// [N, out] with row n = x[n] · W[experts[n]]ᵀ (+ Bias[experts[n]]).
	// These are MLX's gather_mm / gather_qmm semantics with rhs_indices:
	// only the chosen experts' weights are read. sorted says that experts
	// is ascending, so a backend may read each expert's weights once for
	// its run of rows (MLX's sorted_indices); it changes no result.
	GatherLinear(x Array, l *Linear, experts Array, sorted bool) Array
	// Sigmoid is 1/(1+e^−x) elementwise. Shared-expert MoE blocks
	// (Qwen2-MoE, Qwen3-Next) scale the shared expert's output by the
	// sigmoid of a one-output gate.
	Sigmoid(x Array) Array

	// The two ops below are the recurrence of Gated DeltaNet layers
	// (Qwen3-Next, Qwen3.5: mlx-lm's gated_delta_update), a linear
	// attention whose per-head state [Dv, Dk] replaces the KV cache. They
	// are ops, not compositions, because the recurrence runs token by
	// token (dozens of tiny ops per token otherwise) and because its gates
	// must be computed in float32 whatever the weights' dtype for engines
	// to agree (exo's parity patches; mlx-lm's compute_g).

	// DeltaGates computes the per-token gates in float32: a, b [L, H] (the
	// layer's projections, any float dtype), aLog, dtBias [H] →
	// g = exp(−exp(aLog) · softplus(a + dtBias)), the state's decay in
	// (0, 1), and beta = sigmoid(b), its write strength; both F32 [L, H].
	// mlx-lm adds a + dtBias and takes the sigmoid in the inputs' dtype
	// (bfloat16 for bf16 checkpoints) and only the rest in float32; here
	// all of it is float32, as exo's parity patches do (the decay is
	// raised to a power per token, so its rounding compounds).
	DeltaGates(a, b, aLog, dtBias Array) (g, beta Array)
	// GatedDelta runs the gated delta rule over L tokens: q, k [L, Hk, Dk]
	// and v [L, Hv, Dv] (Hv a multiple of Hk; each k head serves Hv/Hk
	// consecutive v heads), g and beta [L, Hv] F32, state [Hv, Dv, Dk] F32.
	// For each token and head, in float32: S ← g·S; S ← S + β (v − S k) kᵀ;
	// y = S q. It returns y [L, Hv, Dv] in q's dtype and the new state
	// (F32). Running L tokens at once equals running them in any split
	// with the state carried over: bit for bit on cpu (the recurrence is
	// the same); the mlx backend runs steps of 128+ tokens in a chunked
	// matrix form that agrees within float32 rounding (1e-6 of the largest
	// value measured; the test allows 2e-5).
	GatedDelta(q, k, v, g, beta, state Array) (y, newState Array)

	// NewKVCache makes an empty cache for the given geometry and dtype.
	NewKVCache(g CacheGeometry, dt DType) KVCache
}

// CacheGeometry is the per-layer shape of a model's attention KV.
type CacheGeometry struct {
	Layers, KVHeads, HeadDim int
	// Windows, when not nil, has one entry per layer: 0 for a full-
	// attention layer, W > 0 for a sliding-window layer whose position p
	// sees positions p-W+1..p. A sliding layer keeps only what later
	// positions can still see (at least the last W-1, see KVCache).
	Windows []int
}

// Window is layer's window (0: full attention).
func (g CacheGeometry) Window(layer int) int {
	if g.Windows == nil {
		return 0
	}
	return g.Windows[layer]
}

// Sliding reports whether any layer is a sliding-window layer.
func (g CacheGeometry) Sliding() bool {
	for _, w := range g.Windows {
		if w > 0 {
			return true
		}
	}
	return false
}

// Same reports whether g and o describe the same storage.
func (g CacheGeometry) Same(o CacheGeometry) bool {
	if g.Layers != o.Layers || g.KVHeads != o.KVHeads || g.HeadDim != o.HeadDim {
		return false
	}
	for i := range g.Layers {
		if g.Window(i) != o.Window(i) {
			return false
		}
	}
	return true
}

// WindowStart is the first position a sliding layer of window w must hold
// for a sequence of n positions to continue (n itself sees n-w+1..n): 0
// for a full layer (w == 0).
func WindowStart(w, n int) int {
	if w <= 0 {
		return 0
	}
	return max(0, n-w+1)
}

// KVCache holds K and V per layer as [Hkv, T, Dh] in the cache dtype, grown in
// steps. All layers hold the same number of tokens between steps.
//
// Sliding-window layers (Geometry().Windows) hold a suffix of the
// positions: always at least [WindowStart(W, Len()), Len()), and older
// positions only until the storage would grow past its bound (about the
// window plus a step's tokens), when they are dropped. For such a layer
// Append returns views of the held suffix only (T counts from its first
// held position), Export accepts only held positions, and Import may start
// past what the layer holds: the layer then restarts at that position when
// Commit makes the import visible (the positions before it are no longer
// needed), while the committed content stays intact until then, so a
// failed import still rolls back by Truncate. A cache can go back only as
// far as its sliding layers still hold the window: see CanTruncate.
type KVCache interface {
	// Len is the number of cached token positions.
	Len() int
	// Append adds k, v [Hkv, L, Dh] to layer at position Len() and returns
	// views of the whole layer's K and V [Hkv, Len()+L, Dh] for attention.
	// Len() advances only once every layer has been appended (the model
	// calls Append once per layer per step, in layer order).
	Append(layer int, k, v Array) (kAll, vAll Array)
	// Truncate drops positions ≥ n (n ≤ Len()); n must satisfy
	// CanTruncate.
	Truncate(n int)
	// CanTruncate reports whether Truncate(n) leaves a usable cache: n is
	// 0, or 0 < n ≤ Len() and every sliding layer still holds
	// [WindowStart(W, n), n). Always true for 0 ≤ n ≤ Len() without
	// sliding layers.
	CanTruncate(n int) bool
	// Export returns positions [start, start+n) of one layer as host bytes:
	// K then V, each [Hkv, n, Dh] row-major in the cache dtype.
	Export(layer, start, n int) (k, v []byte, err error)
	// Import writes positions [start, start+n) of one layer from bytes in
	// Export's layout. It may not leave a gap: start must be ≤ what that
	// layer already holds (Len(), or the end of its earlier imports), so a
	// stream of chunks imports in order. Import does not move Len(): once
	// every layer holds [0, n) the caller calls Commit(n). On failure the
	// caller Truncates back to where it began, so a partial import never
	// becomes visible.
	Import(layer, start, n int, k, v []byte) error
	// Commit sets Len() to n after imports (n ≤ the imported extent).
	Commit(n int) error
	// DType and Geometry describe the storage.
	DType() DType
	Geometry() CacheGeometry
	// Free releases the cache storage.
	Free()
}
