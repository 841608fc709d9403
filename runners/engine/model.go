package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
)

// SourceOpener opens a model directory or GGUF file as a Source.
type SourceOpener func(path string) (Source, error)

// sourceOpener is set once by RegisterSourceOpener, from the init of the
// package that implements the formats (engine/weights cannot be imported
// here: it imports this package). It is read-only afterwards.
var sourceOpener struct {
	sync.RWMutex
	open SourceOpener
}

// RegisterSourceOpener installs the function Load uses to open paths.
// runners/engine/backend registers weights.Open; programs that call Load
// import that package (they need a Backend from it anyway).
func RegisterSourceOpener(open SourceOpener) {
	sourceOpener.Lock()
	defer sourceOpener.Unlock()
	sourceOpener.open = open
}

// DefaultPrefillChunk is Prefill's chunk size when the caller passes 0.
const DefaultPrefillChunk = 512

// Model is a loaded decoder-only transformer, written once against
// Backend. Forward and Prefill are serialized by a mutex.
type Model struct {
	mu      sync.Mutex
	b       Backend
	cfg     Config
	arch    Arch
	embed   *Linear // [V, D]
	lmHead  *Linear // [V, D]; embed when tied
	norm    Array   // [D]
	layers  []block
	cacheDT DType
	fp      Fingerprint
	eps     float32
	weights []Array // every array Load kept, released by Close
	// hostRouting: MoE layers route on the host (LoadOptions.HostMoERouting).
	hostRouting bool
	routeObs    func(layer int, experts [][]int32) // LoadOptions.RouteObserver
	windows     []int                              // per layer: 0 full attention, W sliding; nil when all full
	// Gemma 3 (gemma3.go): embeddings times embedScale [D], attention
	// scale attnScale (0: 1/√Dh).
	embedScale Array
	attnScale  float32
	scr        stepScratch
}

// block is one decoder layer's weights.
type block struct {
	inNorm, postNorm Array // [D]
	q, k, v, o       Linear
	gate, up, down   Linear
	qNorm, kNorm     Array       // [Dh], Qwen3 only
	moe              *moeBlock   // sparse layers of MoE models; gate/up/down unused then
	delta            *deltaBlock // Gated DeltaNet layers; q/k/v/o and qNorm/kNorm unused then
	sinks            Array       // [H] attention sinks (nil: none)
	// Gemma 3: norms around the MLP (nil otherwise; postNorm then norms
	// the attention output) and the layer's RoPE when not the model's.
	preFFNorm, postFFNorm Array
	rope                  *RoPE
}

// Load opens path (a model directory or .gguf file) with the registered
// SourceOpener and loads it onto b.
func Load(ctx context.Context, path string, b Backend, opts LoadOptions) (*Model, error) {
	sourceOpener.RLock()
	open := sourceOpener.open
	sourceOpener.RUnlock()
	if open == nil {
		return nil, errors.New("engine: no weight loader registered (import runners/engine/backend)")
	}
	src, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("engine: open %s: %w", path, err)
	}
	defer src.Close()
	if opts.CacheDType == 0 && strings.HasSuffix(strings.ToLower(path), ".gguf") {
		opts.CacheDType = F32
		if b.Name() != "cpu" {
			opts.CacheDType = F16
		}
	}
	m, err := LoadSource(ctx, src, b, opts)
	if err != nil {
		return nil, fmt.Errorf("engine: load %s: %w", path, err)
	}
	return m, nil
}

// LoadSource loads a model from an open Source (which the caller closes;
// the backend holds its own copies of the weights afterwards).
func LoadSource(ctx context.Context, src Source, b Backend, opts LoadOptions) (m *Model, err error) {
	defer recoverInto(&err, "load")
	src = wrapLanguageModel(src)
	cfg, err := ParseConfig(src.Config())
	if err != nil {
		return nil, err
	}
	arch, err := lookupArch(cfg.Arch)
	if err != nil {
		return nil, err
	}
	if cfg.SlidingWindowUse && arch.Windows == nil {
		return nil, cfgErr("use_sliding_window", "sliding-window attention is not supported for %s", cfg.Arch)
	}
	windows, err := layerWindows(cfg, arch)
	if err != nil {
		return nil, err
	}
	if arch.MoE != (cfg.Experts > 0) {
		return nil, cfgErr("num_experts", "%d experts for architecture %s", cfg.Experts, cfg.Arch)
	}
	vocab, err := src.Vocab()
	if err != nil {
		return nil, fmt.Errorf("engine: vocabulary: %w", err)
	}
	m = &Model{b: b, cfg: *cfg, arch: arch, eps: float32(cfg.RMSNormEps), hostRouting: opts.HostMoERouting, routeObs: opts.RouteObserver, windows: windows}
	m.cacheDT = opts.CacheDType
	if m.cacheDT == 0 {
		m.cacheDT = cfg.DType
		if cfg.Quant.Bits > 0 && !cfg.DTypeSet {
			m.cacheDT = BF16 // MLX-quantized checkpoints compute in bf16
		}
	}
	switch m.cacheDT {
	case F32, F16, BF16:
	default:
		return nil, fmt.Errorf("engine: cache dtype %v (want float32, float16 or bfloat16)", m.cacheDT)
	}
	m.fp = fingerprint(cfg, arch, vocab, windows)

	l := &loader{src: src, b: b, ctx: ctx, progress: opts.Progress}
	defer func() {
		// A failed load must not leave weights pinned on the backend
		// (the mlx backend holds them outside Go's heap).
		if err != nil && len(l.kept) > 0 {
			b.Free(l.kept...)
		}
	}()
	l.total = sizeOf(cfg, arch, cfg.TieEmbeddings && !l.has("lm_head.weight"))
	if cfg.Gemma3 != nil {
		if err := l.gemma3(m, cfg); err != nil {
			return nil, err
		}
		if l.progress != nil {
			l.progress(l.total, l.total)
		}
		m.weights = l.kept
		return m, nil
	}
	D, H, Hkv, Dh, F, V := cfg.Hidden, cfg.Heads, cfg.KVHeads, cfg.HeadDim, cfg.Intermediate, cfg.Vocab
	if m.embed, err = l.linear("model.embed_tokens", V, D, false); err != nil {
		return nil, err
	}
	m.lmHead = m.embed
	if !cfg.TieEmbeddings || l.has("lm_head.weight") {
		if l.has("lm_head.weight") {
			if m.lmHead, err = l.linear("lm_head", V, D, false); err != nil {
				return nil, err
			}
		} else if !cfg.TieEmbeddings {
			return nil, fmt.Errorf("engine: lm_head.weight: %w (and tie_word_embeddings is false)", ErrNotFound)
		}
	}
	if arch.GatedDeltaNet {
		// HF Qwen3-Next checkpoints store these norms' weights minus one
		// (zero-centred); mlx-lm adds 1 when it sees HF's per-expert
		// layout, and so do we.
		// Qwen3.5: mlx-lm adds it when conv1d is in PyTorch's [C, 1, K].
		for _, n := range src.Names() {
			if strings.HasSuffix(n, ".mlp.experts.0.up_proj.weight") && cfg.Arch == "Qwen3NextForCausalLM" {
				l.normOffset = true
				break
			}
			if strings.HasSuffix(n, ".linear_attn.conv1d.weight") && cfg.Arch != "Qwen3NextForCausalLM" {
				if t, err := src.Tensor(n); err == nil && len(t.Shape) == 3 && t.Shape[2] != 1 {
					l.normOffset = true
					break
				}
			}
		}
	}
	if m.norm, err = l.norm("model.norm.weight", D); err != nil {
		return nil, err
	}
	m.layers = make([]block, cfg.Layers)
	for i := range m.layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := l.block(&m.layers[i], i, cfg, arch, D, H, Hkv, Dh, F); err != nil {
			return nil, fmt.Errorf("engine: load layer %d: %w", i, err)
		}
	}
	if l.progress != nil {
		l.progress(l.total, l.total)
	}
	m.weights = l.kept
	return m, nil
}

type loader struct {
	src         Source
	b           Backend
	ctx         context.Context
	progress    func(done, total int64)
	done, total int64
	names       map[string]bool
	kept        []Array
	normOffset  bool // RMSNorm weights are stored minus one (HF Qwen3-Next)
}

func (l *loader) has(name string) bool {
	if l.names == nil {
		l.names = map[string]bool{}
		for _, n := range l.src.Names() {
			l.names[n] = true
		}
	}
	return l.names[name]
}

// sizeOf estimates the bytes the model's weights take once loaded, from the
// config alone (asking the Source for every tensor twice would convert GGUF
// tensors twice): dense weights at the config dtype's size, quantized ones
// at bits/8 plus two 16-bit values per group. Progress reports bytes loaded
// against this estimate; the final call reports done == total.
func sizeOf(c *Config, a Arch, tied bool) int64 {
	es := int64(c.DType.Size())
	lin := func(out, in int) int64 {
		if c.Quant.Bits == 0 {
			return int64(out) * int64(in) * es
		}
		return int64(out)*int64(in)*int64(c.Quant.Bits)/8 + 2*2*int64(out)*int64(in/c.Quant.GroupSize)
	}
	D, F, V := c.Hidden, c.Intermediate, c.Vocab
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	layer := lin(qd, D) + 2*lin(kvd, D) + lin(D, qd) + 2*int64(D)*es
	if a.QKNorm {
		layer += 2 * int64(c.HeadDim) * es
	}
	total := lin(V, D) + int64(D)*es + int64(c.Layers)*layer
	for i := range c.Layers {
		if c.IsMoELayer(i) {
			total += lin(c.Experts, D) + int64(c.Experts)*3*lin(c.MoEIntermediate, D)
			if c.SharedExpertIntermediate > 0 {
				total += 3*lin(c.SharedExpertIntermediate, D) + lin(1, D)
			}
		} else {
			total += 3 * lin(F, D)
		}
	}
	if !tied {
		total += lin(V, D)
	}
	return total
}

// tensor loads a tensor, checking its shape when want is given.
func (l *loader) tensor(name string, want ...int) (Array, DType, error) {
	t, err := l.src.Tensor(name)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	if want != nil && !slices.Equal(t.Shape, want) {
		return nil, 0, fmt.Errorf("%s: shape %v, want %v", name, t.Shape, want)
	}
	a := l.b.FromBytes(t.Data, t.Shape, t.DType)
	l.b.Keep(a)
	l.kept = append(l.kept, a)
	l.done += int64(len(t.Data))
	if l.progress != nil {
		l.progress(min(l.done, l.total-1), l.total)
	}
	return a, t.DType, nil
}

// norm loads an RMSNorm weight [n], adding 1 when normOffset says the
// checkpoint stores it zero-centred.
func (l *loader) norm(name string, n int) (Array, error) {
	if !l.normOffset {
		return l.vector(name, n)
	}
	t, err := l.src.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !slices.Equal(t.Shape, []int{n}) {
		return nil, fmt.Errorf("%s: shape %v, want [%d]", name, t.Shape, n)
	}
	v, err := floats32(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for i := range v {
		v[i]++
	}
	l.done += int64(len(t.Data))
	return l.keep(l.b.AsType(l.b.FromFloat32(v, n), t.DType)), nil
}

func (l *loader) vector(name string, n int) (Array, error) {
	a, _, err := l.tensor(name, n)
	return a, err
}

// linear loads prefix.weight [out, in] (dense or MLX-quantized) and, when
// bias is set, prefix.bias [out].
func (l *loader) linear(prefix string, out, in int, bias bool) (*Linear, error) {
	q := l.src.Quant(prefix)
	lin := &Linear{Bits: q.Bits, GroupSize: q.GroupSize, Mode: q.Mode}
	if q.Mode == "mxfp4" && (q.Bits != 4 || q.GroupSize != 32) {
		return nil, fmt.Errorf("%s: mxfp4 with %d bits in groups of %d (want 4 and 32)", prefix, q.Bits, q.GroupSize)
	}
	var err error
	if q.Bits == 0 {
		if lin.W, _, err = l.tensor(prefix+".weight", out, in); err != nil {
			return nil, err
		}
	} else {
		if q.GroupSize <= 0 || in%q.GroupSize != 0 || (in*q.Bits)%32 != 0 {
			return nil, fmt.Errorf("%s: %d-bit group %d does not fit %d inputs", prefix, q.Bits, q.GroupSize, in)
		}
		if lin.W, _, err = l.tensor(prefix+".weight", out, in*q.Bits/32); err != nil {
			return nil, err
		}
		if lin.Scales, _, err = l.tensor(prefix+".scales", out, in/q.GroupSize); err != nil {
			return nil, err
		}
		if q.Mode == "" {
			if lin.Biases, _, err = l.tensor(prefix+".biases", out, in/q.GroupSize); err != nil {
				return nil, err
			}
		}
	}
	if bias {
		if lin.Bias, _, err = l.tensor(prefix+".bias", out); err != nil {
			return nil, err
		}
	}
	return lin, nil
}

func (l *loader) block(b *block, i int, cfg *Config, arch Arch, D, H, Hkv, Dh, F int) error {
	p := fmt.Sprintf("model.layers.%d.", i)
	var err error
	if b.inNorm, err = l.norm(p+"input_layernorm.weight", D); err != nil {
		return err
	}
	if b.postNorm, err = l.norm(p+"post_attention_layernorm.weight", D); err != nil {
		return err
	}
	qkvBias := arch.QKVBias || cfg.AttentionBias
	lin := func(dst *Linear, name string, out, in int, bias bool) error {
		x, err := l.linear(p+name, out, in, bias)
		if err != nil {
			return err
		}
		*dst = *x
		return nil
	}
	qOut := H * Dh
	if arch.GatedDeltaNet {
		qOut *= 2 // queries and the output gate
	}
	if cfg.IsLinearLayer(i) {
		if b.delta, err = l.delta(p+"linear_attn.", cfg); err != nil {
			return err
		}
	} else if err := lin(&b.q, "self_attn.q_proj", qOut, D, qkvBias); err != nil {
		return err
	}
	if err := l.attention(b, p, cfg, arch, lin, D, Hkv, Dh, H, qkvBias); err != nil {
		return err
	}
	if cfg.IsMoELayer(i) {
		load := (*loader).moe
		if arch.LoadMoE != nil {
			load = arch.LoadMoE
		}
		if b.moe, err = load(l, p+"mlp.", cfg); err != nil {
			return err
		}
	} else {
		if err := lin(&b.gate, "mlp.gate_proj", F, D, false); err != nil {
			return err
		}
		if err := lin(&b.up, "mlp.up_proj", F, D, false); err != nil {
			return err
		}
		if err := lin(&b.down, "mlp.down_proj", D, F, false); err != nil {
			return err
		}
	}
	return nil
}

// attention loads the k, v, o projections, the sinks and the q/k norms of
// an attention layer (nothing for a Gated DeltaNet layer).
func (l *loader) attention(b *block, p string, cfg *Config, arch Arch, lin func(*Linear, string, int, int, bool) error, D, Hkv, Dh, H int, qkvBias bool) error {
	if b.delta != nil {
		return nil
	}
	if err := lin(&b.k, "self_attn.k_proj", Hkv*Dh, D, qkvBias); err != nil {
		return err
	}
	if err := lin(&b.v, "self_attn.v_proj", Hkv*Dh, D, qkvBias); err != nil {
		return err
	}
	if err := lin(&b.o, "self_attn.o_proj", D, H*Dh, cfg.AttentionBias); err != nil {
		return err
	}
	if arch.Sinks {
		var err error
		if b.sinks, err = l.vector(p+"self_attn.sinks", H); err != nil {
			return err
		}
	}
	if arch.QKNorm {
		var err error
		if b.qNorm, err = l.norm(p+"self_attn.q_norm.weight", Dh); err != nil {
			return err
		}
		if b.kNorm, err = l.norm(p+"self_attn.k_norm.weight", Dh); err != nil {
			return err
		}
	}
	return nil
}

// fingerprint hashes what makes KV transferable between two models.
func fingerprint(c *Config, a Arch, vocab []string, windows []int) Fingerprint {
	h := sha256.New()
	w := func(v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	ws := func(s string) {
		w(uint64(len(s)))
		h.Write([]byte(s))
	}
	ws("exo-pd kv fingerprint v1")
	ws(a.Family)
	w(uint64(c.Layers))
	w(uint64(c.KVHeads))
	w(uint64(c.HeadDim))
	r := c.RoPE
	w(uint64(r.Dims))
	w(math.Float64bits(r.Base))
	ws(r.Scale.Type)
	for _, f := range []float64{r.Scale.Factor, r.Scale.LowFreqFactor, r.Scale.HighFreqFactor, r.Scale.BetaFast, r.Scale.BetaSlow, r.Scale.MScale, r.Scale.MScaleAllDim} {
		w(math.Float64bits(f))
	}
	w(uint64(r.Scale.OriginalMaxPositions))
	if c.FullAttentionInterval > 0 {
		// Which layers are recurrent and the shapes of their states.
		ws("gated deltanet")
		for _, v := range []int{c.FullAttentionInterval, c.LinearKeyHeads, c.LinearValueHeads, c.LinearKeyDim, c.LinearValueDim, c.LinearConvKernel} {
			w(uint64(v))
		}
	}
	w(uint64(len(vocab)))
	for _, t := range vocab {
		ws(t)
	}
	if c.Gemma3 != nil {
		ws("gemma3 local rope base")
		w(math.Float64bits(c.Gemma3.LocalBase))
	}
	if windows != nil {
		// Only models with sliding layers hash their window pattern, so
		// full-attention models keep the fingerprints they had.
		ws("windows")
		for _, x := range windows {
			w(uint64(x))
		}
	}
	var fp Fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}

// recoverInto turns a panic from the backend or the model code into *err.
func recoverInto(err *error, op string) {
	r := recover()
	if r == nil {
		return
	}
	if e, ok := r.(error); ok {
		*err = fmt.Errorf("engine: %s: %w", op, e)
	} else {
		*err = fmt.Errorf("engine: %s: %v", op, r)
	}
	if _, isRuntime := r.(interface{ RuntimeError() }); isRuntime {
		*err = fmt.Errorf("%w\n%s", *err, debug.Stack())
	}
}

// Info describes the model.
func (m *Model) Info() ModelInfo {
	c := m.cfg
	info := ModelInfo{Arch: c.Arch, Layers: c.Layers, Hidden: c.Hidden, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, Vocab: c.Vocab, MaxPositions: c.MaxPositions, CacheDType: m.cacheDT,
		Windows: slices.Clone(m.windows)}
	if c.FullAttentionInterval > 0 {
		info.Recurrent = make([]bool, c.Layers)
		for i := range info.Recurrent {
			info.Recurrent[i] = c.IsLinearLayer(i)
		}
	}
	return info
}

// Config returns the parsed config.json.
func (m *Model) Config() Config { return m.cfg }

// Fingerprint identifies the KV this model computes (see Fingerprint).
func (m *Model) Fingerprint() Fingerprint { return m.fp }

// Backend returns the backend the model runs on.
func (m *Model) Backend() Backend { return m.b }

// NewCache makes an empty KV cache for this model in its cache dtype.
func (m *Model) NewCache() KVCache {
	if m.arch.GatedDeltaNet {
		return m.newHybridCache()
	}
	return m.b.NewKVCache(m.geometry(), m.cacheDT)
}

// Close releases the weights.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.weights != nil {
		m.b.Free(m.weights...)
	}
	m.layers, m.weights = nil, nil
	m.embed, m.lmHead, m.norm = nil, nil, nil
	return nil
}

var errModelClosed = errors.New("engine: model is closed")

func (m *Model) checkCache(c KVCache, tokens []int32) error {
	if m.layers == nil {
		return errModelClosed
	}
	g := c.Geometry()
	if !g.Same(m.geometry()) {
		return fmt.Errorf("engine: cache geometry %+v does not match the model's", g)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= m.cfg.Vocab {
			return fmt.Errorf("engine: token id %d outside vocabulary of %d", t, m.cfg.Vocab)
		}
	}
	return nil
}

// Forward runs tokens at positions c.Len()… (in chunks of
// DefaultPrefillChunk), appends their KV and returns the float32 logits of
// the last position [V]. On error the cache is truncated to where it was.
func (m *Model) Forward(ctx context.Context, c KVCache, tokens []int32) (logits []float32, err error) {
	return m.ForwardInto(ctx, c, tokens, nil)
}

// ForwardInto is Forward writing the logits into dst's storage when its
// capacity suffices (growing it otherwise) and returning dst[:V]: a decode
// loop that passes the same buffer every step allocates nothing on the
// cpu backend.
func (m *Model) ForwardInto(ctx context.Context, c KVCache, tokens []int32, dst []float32) (logits []float32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(tokens) == 0 {
		return nil, errors.New("engine: Forward with no tokens")
	}
	if err := m.checkCache(c, tokens); err != nil {
		return nil, err
	}
	start := c.Len()
	beginStep(c, len(tokens))
	defer func() {
		if err != nil {
			c.Truncate(start)
		}
		m.b.Free()
	}()
	defer recoverInto(&err, "forward")
	for len(tokens) > DefaultPrefillChunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := m.step(c, tokens[:DefaultPrefillChunk], false, nil); err != nil {
			return nil, err
		}
		m.b.Free() // this chunk's temporaries; its KV is in the cache
		tokens = tokens[DefaultPrefillChunk:]
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.scr.flat = dst
	if err := m.step(c, tokens, true, &dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// ForwardBatch runs one decode step for several sequences at once:
// tokens[i] goes to caches[i] at position caches[i].Len(). Embedding,
// projections and MLPs run once over all the rows (on bandwidth-bound
// hardware a step of B sequences costs little more than one); attention
// runs per sequence. It returns each sequence's logits [V], the same as
// Forward(caches[i], tokens[i:i+1]) would give. The caches must be
// distinct. On error every cache is truncated to where it was.
func (m *Model) ForwardBatch(ctx context.Context, caches []KVCache, tokens []int32) (logits [][]float32, err error) {
	// The row headers live in m's scratch: clone them before the lock goes,
	// or a concurrent step rewrites them under the caller.
	m.mu.Lock()
	defer m.mu.Unlock()
	out, err := m.forwardBatchLocked(ctx, caches, tokens, nil)
	if err != nil {
		return nil, err
	}
	return slices.Clone(out), nil
}

// ForwardBatchInto is ForwardBatch writing every sequence's logits into
// dst's storage (B·V floats, grown when its capacity is less). The slice
// of rows it returns belongs to m and is valid until the next call; the
// rows are views of dst. A decode loop passing the same buffer every step
// allocates nothing on the cpu backend.
func (m *Model) ForwardBatchInto(ctx context.Context, caches []KVCache, tokens []int32, dst []float32) (logits [][]float32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forwardBatchLocked(ctx, caches, tokens, dst)
}

// forwardBatchLocked is ForwardBatchInto with m.mu held by the caller.
func (m *Model) forwardBatchLocked(ctx context.Context, caches []KVCache, tokens []int32, dst []float32) (logits [][]float32, err error) {
	if len(caches) == 0 || len(caches) != len(tokens) {
		return nil, fmt.Errorf("engine: ForwardBatch with %d caches and %d tokens", len(caches), len(tokens))
	}
	starts := grow(&m.scr.starts, len(caches))
	toks := grow(&m.scr.toks, len(caches))
	for i, c := range caches {
		if slices.Contains(caches[:i], c) {
			return nil, fmt.Errorf("engine: ForwardBatch: cache %d appears twice", i)
		}
		if err := m.checkCache(c, tokens[i:i+1]); err != nil {
			return nil, err
		}
		starts[i], toks[i] = c.Len(), tokens[i:i+1]
	}
	for _, c := range caches {
		beginStep(c, 1)
	}
	m.scr.flat = dst
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			for i, c := range caches {
				c.Truncate(starts[i])
			}
		}
		m.b.Free()
	}()
	defer recoverInto(&err, "forward batch")
	return m.stepSeqs(caches, toks, true)
}

// Prefill runs tokens in chunks of at most chunk tokens (0: 512), calling
// onChunk(start, n) after each chunk's KV is in the cache. An error from
// onChunk or ctx stops it after the current chunk; the chunks already done
// stay in the cache.
//
// The model is locked per chunk, not for the whole prompt: other callers'
// steps (a decode runner's batched generations) run between chunks, and
// onChunk runs unlocked (it may send KV over the network or step the model
// itself). The caller must not use c concurrently.
func (m *Model) Prefill(ctx context.Context, c KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) (err error) {
	if chunk <= 0 {
		chunk = DefaultPrefillChunk
	}
	m.mu.Lock()
	err = m.checkCache(c, tokens)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	for len(tokens) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(chunk, len(tokens))
		start := c.Len()
		m.mu.Lock()
		err := errModelClosed
		if m.layers != nil { // Close may have run between chunks
			err = m.guardedStep(c, tokens[:n])
		}
		m.mu.Unlock()
		if err != nil {
			return err
		}
		tokens = tokens[n:]
		if onChunk != nil {
			if err := onChunk(start, n); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Model) guardedStep(c KVCache, tokens []int32) (err error) {
	start := c.Len()
	beginStep(c, len(tokens))
	defer func() {
		if err != nil {
			c.Truncate(start)
		}
		m.b.Free()
	}()
	defer recoverInto(&err, "prefill")
	return m.step(c, tokens, false, nil)
}

// step runs one chunk through every layer. With logits set it writes the
// last position's logits [V] to *logits; otherwise it only fills the cache.
func (m *Model) step(c KVCache, tokens []int32, wantLogits bool, logits *[]float32) error {
	cs := &m.scr.oneCache
	cs[0] = c
	defer func() { cs[0] = nil }()
	ts := [1][]int32{tokens} // stepSeqs does not keep toks: stays on the stack
	out, err := m.stepSeqs(cs[:], ts[:], wantLogits)
	if err == nil && wantLogits {
		*logits = out[0]
	}
	return err
}

// stepSeqs runs several sequences' chunks through every layer at once:
// toks[s] continues cs[s] at its current length. Embedding, projections
// and MLPs run once over all rows; RoPE, the cache append and attention
// run per sequence. With wantLogits it returns each sequence's last-
// position logits [V]. With one sequence the graph is the plain one (no
// slicing or concatenation). Every row's result is the same as when its
// sequence runs alone: the backends' ops are row-independent.
func (m *Model) stepSeqs(cs []KVCache, toks [][]int32, wantLogits bool) ([][]float32, error) {
	b := m.b
	cfg := &m.cfg
	H, Hkv, Dh := cfg.Heads, cfg.KVHeads, cfg.HeadDim
	scale := float32(1 / math.Sqrt(float64(Dh)))
	if m.attnScale != 0 {
		scale = m.attnScale
	}
	batched := len(cs) > 1
	n := 0
	scr := &m.scr
	starts, offsets := grow(&scr.rowStarts, len(cs)), grow(&scr.offsets, len(cs))
	all := scr.ids[:0]
	for s, t := range toks {
		starts[s], offsets[s] = n, cs[s].Len()
		n += len(t)
		all = append(all, t...)
	}
	scr.ids = all
	// Shapes and permutations passed to the backend's variadic ops come
	// from the scratch: a literal argument list would be a heap
	// allocation per call (the backend is an interface).
	sh := grow(&scr.shapes, 8)
	nShape := append(sh[0:0:1], n)
	qShape := append(sh[1:1:4], n, H, Dh)
	kvShape := append(sh[4:4:7], n, Hkv, Dh)
	rows := func(a Array, s int) Array {
		if !batched {
			return a
		}
		return b.Slice(a, 0, starts[s], starts[s]+len(toks[s]))
	}
	ids := b.FromInt32(all, nShape...)
	x := b.Embedding(m.embed, ids) // [n, D]
	if m.embedScale != nil {
		x = b.Mul(x, m.embedScale)
	}
	outs := grow(&scr.outs, len(cs))
	defer clear(outs)
	oShape := grow(&scr.oShapes, 2*len(cs))
	states := scr.states[:0] // new recurrent states (hybrid models), evaluated with the step
	defer func() { clear(states); scr.states = states[:0] }()
	// Without logits nothing reads the last layer's output, only what it
	// puts in the cache: its attention and MLP are not built, and the step
	// evaluates that layer's cache arrays (and the recurrent states), as
	// mlx-lm's prefill evaluates only the cache.
	var tailKV []Array
	for i := range m.layers {
		ly := &m.layers[i]
		tail := !wantLogits && i == len(m.layers)-1
		h := b.RMSNorm(x, ly.inNorm, m.eps)
		if ly.delta != nil {
			for s, c := range cs {
				hc := c.(*hybridCache)
				var st deltaState
				outs[s], st = m.deltaForward(ly.delta, rows(h, s), len(toks[s]), hc.states[i])
				hc.set(i, st)
				states = append(states, st.conv, st.rec)
			}
			if tail {
				break
			}
			a := outs[0]
			if batched {
				a = b.Concat(0, outs...)
			}
			var err error
			if x, err = m.mlpOrMoE(ly, b.Add(x, a), n); err != nil {
				return nil, err
			}
			continue
		}
		q := b.Linear(h, &ly.q)
		var gate Array // gated attention (Qwen3-Next): [n, H·Dh]
		if m.arch.GatedDeltaNet {
			qg := b.Reshape(q, scr.dims(n, H, 2*Dh)...)
			q, gate = b.Slice(qg, 2, 0, Dh), b.Reshape(b.Slice(qg, 2, Dh, 2*Dh), scr.dims(n, H*Dh)...)
		}
		q = b.Reshape(q, qShape...)                    // [n, H, Dh]
		k := b.Reshape(b.Linear(h, &ly.k), kvShape...) // [n, Hkv, Dh]
		v := b.Reshape(b.Linear(h, &ly.v), kvShape...)
		if m.arch.QKNorm {
			q = b.RMSNorm(q, ly.qNorm, m.eps)
			k = b.RMSNorm(k, ly.kNorm, m.eps)
		}
		rope := &cfg.RoPE
		if ly.rope != nil {
			rope = ly.rope
		}
		for s, c := range cs {
			L := len(toks[s])
			ks := b.RoPE(b.Transpose(rows(k, s), perm102...), offsets[s], rope) // [Hkv, L, Dh]
			vs := b.Transpose(rows(v, s), perm102...)
			kAll, vAll := c.Append(i, ks, vs) // [Hkv, T, Dh]
			if tail {
				tailKV = append(tailKV, kAll, vAll)
				continue
			}
			qs := b.RoPE(b.Transpose(rows(q, s), perm102...), offsets[s], rope) // [H, L, Dh]
			a := m.attention(i, qs, kAll, vAll, scale)                          // [H, L, Dh]
			os := append(oShape[2*s:2*s:2*s+2], L, H*Dh)
			outs[s] = b.Reshape(b.Transpose(a, perm102...), os...) // [L, H·Dh]
		}
		if tail {
			break
		}
		a := outs[0]
		if batched {
			a = b.Concat(0, outs...)
		}
		if gate != nil {
			a = b.Mul(a, b.Sigmoid(gate))
		}
		if ly.postFFNorm != nil {
			x = m.gemma3Residual(ly, x, a)
			continue
		}
		var err error
		if x, err = m.mlpOrMoE(ly, b.Add(x, b.Linear(a, &ly.o)), n); err != nil {
			return nil, err
		}
	}
	one := &scr.evalArg
	defer func() { one[0] = nil }()
	if !wantLogits {
		if tailKV != nil || len(states) > 0 {
			return nil, b.Eval(append(tailKV, states...)...)
		}
		one[0] = x
		return nil, b.Eval(one[:]...)
	}
	last := x // one row per sequence when every chunk is one token
	if n != len(cs) {
		for s := range cs {
			end := starts[s] + len(toks[s])
			outs[s] = b.Slice(x, 0, end-1, end) // [1, D]
		}
		last = outs[0]
		if batched {
			last = b.Concat(0, outs...)
		}
	}
	out := b.Linear(b.RMSNorm(last, m.norm, m.eps), m.lmHead) // [B, V]
	evalArgs := one[:]
	one[0] = out
	if len(states) > 0 {
		evalArgs = append(append(scr.evalArgs[:0], out), states...)
		defer func() { clear(evalArgs); scr.evalArgs = evalArgs[:0] }()
	}
	if err := b.Eval(evalArgs...); err != nil {
		return nil, err
	}
	var f []float32
	var err error
	if r, ok := b.(float32IntoReader); ok {
		f, err = r.Float32Into(scr.flat[:0], out)
	} else {
		var g []float32
		if g, err = b.Float32(out); err == nil {
			f = append(scr.flat[:0], g...)
		}
	}
	scr.flat = nil
	if err != nil {
		return nil, err
	}
	V := len(f) / len(cs)
	logits := grow(&scr.logits, len(cs))
	for s := range logits {
		logits[s] = f[s*V : (s+1)*V : (s+1)*V]
	}
	return logits, nil
}

// mlpOrMoE adds the layer's MLP (dense or sparse) to the residual x [n, D].
func (m *Model) mlpOrMoE(ly *block, x Array, n int) (Array, error) {
	b := m.b
	h := b.RMSNorm(x, ly.postNorm, m.eps)
	if ly.moe != nil {
		y, err := m.moeForward(ly.moe, x, h, n, m.hostRouting)
		if err != nil {
			return nil, err
		}
		return b.Add(x, y), nil
	}
	g := b.SwiGLU(b.Linear(h, &ly.gate), b.Linear(h, &ly.up))
	return b.Add(x, b.Linear(g, &ly.down)), nil
}

// beginStep marks where a hybrid cache's step of n tokens begins (see
// hybridCache).
func beginStep(c KVCache, n int) {
	if hc, ok := c.(*hybridCache); ok {
		hc.begin(n)
	}
}

// perm102 swaps the first two of three axes ([L, H, Dh] ↔ [H, L, Dh]).
// Read-only.
var perm102 = []int{1, 0, 2}

// float32IntoReader is implemented by backends that can copy an array's
// float32 values into a caller's buffer (the cpu backend), sparing the
// copy Float32 returns.
type float32IntoReader interface {
	Float32Into(dst []float32, a Array) ([]float32, error)
}

// stepScratch is what a step needs on the host besides arrays, kept on
// the Model (steps are serialized by its mutex) and reused, so that a
// decode step allocates nothing once warm.
type stepScratch struct {
	starts          []int     // ForwardBatchInto: each cache's length before the step
	toks            [][]int32 // ForwardBatchInto: each sequence's token
	rowStarts       []int     // stepSeqs: each sequence's first row
	offsets         []int     // stepSeqs: each sequence's position
	ids             []int32
	shapes, oShapes []int
	outs            []Array
	logits          [][]float32
	flat            []float32 // the caller's logits buffer for this step
	evalArg         [1]Array
	oneCache        [1]KVCache
	oneToks         [1][]int32
	pairs           []int32  // MoE: each (token, expert) pair's token
	dimBuf          [4]int   // dims: a shape handed to a variadic op
	arrBuf          [4]Array // arrays: arrays handed to a variadic op
	states          []Array  // a step's new recurrent states (hybrids)
	evalArgs        []Array  // what a hybrid step evaluates
}

// dims returns ds in the scratch's own storage: a shape passed to a
// Backend's variadic op (an interface call) is otherwise heap-allocated
// at every call. Backends copy shapes they keep, so one buffer serves
// every call of a step.
func (s *stepScratch) dims(ds ...int) []int {
	if len(ds) > len(s.dimBuf) {
		return slices.Clone(ds)
	}
	n := copy(s.dimBuf[:], ds)
	return s.dimBuf[:n]
}

// arrays is dims for the arrays of a variadic op (Concat).
func (s *stepScratch) arrays(xs ...Array) []Array {
	if len(xs) > len(s.arrBuf) {
		return slices.Clone(xs)
	}
	n := copy(s.arrBuf[:], xs)
	return s.arrBuf[:n]
}

// grow returns (*s)[:n], reallocating *s when its capacity is less.
func grow[T any](s *[]T, n int) []T {
	if cap(*s) < n {
		*s = make([]T, n)
	}
	*s = (*s)[:n]
	return *s
}
