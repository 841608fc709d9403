package engine

import (
	"context"
	"errors"
	"fmt"
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
// Backend: its embedding, its blocks (one per layer, each of a LayerKind)
// and its output head. Forward and Prefill are serialized by a mutex.
type Model struct {
	mu      *sync.Mutex // shared with the models loaded Beside it
	b       Backend
	cfg     Config
	arch    *Architecture
	embed   *embedding
	head    *outputHead
	blocks  []Block
	kinds   []LayerKind // the loaded layers' (the stage's), which its caches hold
	windows []int       // the loaded layers' windows; nil when none slides
	all     []LayerKind // every layer's (Info, the fingerprint)
	stage   LayerRange  // the loaded layers
	cacheDT DType
	fp      Fingerprint
	eps     float32
	weights []Array // every array Load kept, released by Close
	// hostRouting: MoE layers route on the host (LoadOptions.HostMoERouting).
	hostRouting bool
	routeObs    func(layer int, experts [][]int32) // LoadOptions.RouteObserver
	// tp is the tensor-parallel group (LoadOptions.Tensor; nil: whole
	// model); rc is cfg with this rank's counts of heads and widths
	// (cfg itself when not split), which its blocks and caches have.
	tp  Collective
	rc  Config
	scr stepScratch
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
	cfg, err := ParseConfig(src.Config())
	if err != nil {
		return nil, err
	}
	arch, err := lookupArch(cfg.Arch)
	if err != nil {
		return nil, err
	}
	if arch.Source != nil {
		src = arch.Source(src)
	}
	kinds, err := arch.Layers(cfg)
	if err != nil {
		return nil, err
	}
	if len(kinds) != cfg.Layers {
		return nil, fmt.Errorf("engine: %d layer kinds for %d layers", len(kinds), cfg.Layers)
	}
	stage, err := stageRange(opts.Layers, cfg.Layers)
	if err != nil {
		return nil, err
	}
	vocab, err := src.Vocab()
	if err != nil {
		return nil, fmt.Errorf("engine: vocabulary: %w", err)
	}
	sk := kinds[stage.Start:stage.End]
	if opts.Beside != nil && opts.Beside.b != b {
		return nil, errors.New("engine: LoadOptions.Beside names a model on another backend")
	}
	m = &Model{mu: new(sync.Mutex), b: b, cfg: *cfg, arch: arch, kinds: sk, windows: windows(sk), all: kinds, stage: stage, eps: float32(cfg.RMSNormEps), hostRouting: opts.HostMoERouting, routeObs: opts.RouteObserver}
	if opts.Beside != nil {
		m.mu = opts.Beside.mu
	}
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
	m.fp = fingerprint(cfg, arch, vocab, kinds)
	m.rc = *cfg
	if t := opts.Tensor; t != nil {
		if t.Rank() < 0 || t.Rank() >= t.Size() {
			return nil, fmt.Errorf("%w: rank %d of %d", ErrTensorSplit, t.Rank(), t.Size())
		}
		if err := CheckTensorSplit(cfg, t.Size()); err != nil {
			return nil, err
		}
		m.rc = rankConfig(cfg, t.Size())
		if t.Size() > 1 {
			m.tp = t
		}
	}

	l := &loader{src: src, b: b, ctx: ctx, progress: opts.Progress, tp: m.tp}
	defer func() {
		// A failed load must not leave weights pinned on the backend
		// (the mlx backend holds them outside Go's heap).
		if err != nil && len(l.kept) > 0 {
			b.Free(l.kept...)
		}
	}()
	l.total = sizeOf(cfg, cfg.TieEmbeddings && !l.has("lm_head.weight"))
	if arch.Open != nil {
		if err := arch.Open(l, cfg); err != nil {
			return nil, err
		}
	}
	embed, head := arch.Embed, arch.Head
	if embed == nil {
		embed = standardEmbed
	}
	if head == nil {
		head = standardHead
	}
	// A stage loads the embedding only when it holds the first layer and
	// the head only when it holds the last (a tied head then loads the
	// embedding's table as its own).
	var e *embedding
	if stage.Start == 0 || stage.End == cfg.Layers && cfg.TieEmbeddings && !l.has("lm_head.weight") {
		if e, err = embed(l, cfg); err != nil {
			return nil, err
		}
	}
	if stage.Start == 0 {
		m.embed = e
	}
	if stage.End == cfg.Layers {
		if m.head, err = head(l, cfg, e); err != nil {
			return nil, err
		}
	}
	m.blocks = make([]Block, 0, stage.End-stage.Start)
	for i := stage.Start; i < stage.End; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		blk, err := arch.Block(l, &m.rc, i, kinds[i])
		if err != nil {
			return nil, fmt.Errorf("engine: load layer %d: %w", i, err)
		}
		if k := blk.Kind(); k != kinds[i] {
			return nil, fmt.Errorf("engine: layer %d loaded as %+v, configured %+v", i, k, kinds[i])
		}
		m.blocks = append(m.blocks, blk)
	}
	if l.progress != nil {
		l.progress(l.total, l.total)
	}
	m.weights = l.kept
	return m, nil
}

// standardEmbed loads model.embed_tokens [V, D].
func standardEmbed(l *loader, c *Config) (*embedding, error) {
	t, err := l.linear("model.embed_tokens", c.Vocab, c.Hidden, false)
	if err != nil {
		return nil, err
	}
	return &embedding{table: t}, nil
}

// standardHead loads model.norm and lm_head (the embedding's table when
// tie_word_embeddings is set and the checkpoint has no lm_head).
func standardHead(l *loader, c *Config, e *embedding) (*outputHead, error) {
	return l.head("model.norm.weight", "lm_head", c, e, l.norm)
}

// head loads the final norm (with norm) and the LM head prefix (or the
// embedding's table when tied and absent).
func (l *loader) head(normName, headName string, c *Config, e *embedding, norm func(string, int) (Array, error)) (*outputHead, error) {
	h := &outputHead{}
	var err error
	if h.norm, err = norm(normName, c.Hidden); err != nil {
		return nil, err
	}
	switch {
	case l.has(headName + ".weight"):
		if h.out, err = l.linear(headName, c.Vocab, c.Hidden, false); err != nil {
			return nil, err
		}
	case c.TieEmbeddings && e != nil:
		h.out = e.table
	default:
		return nil, fmt.Errorf("engine: %s.weight: %w (and tie_word_embeddings is false)", headName, ErrNotFound)
	}
	return h, nil
}

type loader struct {
	src         Source
	b           Backend
	ctx         context.Context
	progress    func(done, total int64)
	done, total int64
	names       map[string]bool
	kept        []Array
	normOffset  bool       // RMSNorm weights are stored minus one (HF Qwen3-Next)
	tp          Collective // the tensor-parallel group (nil: whole tensors)
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
func sizeOf(c *Config, tied bool) int64 {
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
	t, err := l.rawTensor(name, want...)
	if err != nil {
		return nil, 0, err
	}
	a := l.keep(l.b.FromBytes(t.Data, t.Shape, t.DType))
	if l.progress != nil {
		l.progress(min(l.done, l.total-1), l.total)
	}
	return a, t.DType, nil
}

// rawTensor reads a tensor's bytes (to convert on the host), checking its
// shape when one is given, and counts them as loaded.
func (l *loader) rawTensor(name string, shape ...int) (Tensor, error) {
	t, err := l.src.Tensor(name)
	if err != nil {
		return t, fmt.Errorf("%s: %w", name, err)
	}
	if shape != nil && !slices.Equal(t.Shape, shape) {
		return t, fmt.Errorf("%s: shape %v, want %v", name, t.Shape, shape)
	}
	l.done += int64(len(t.Data))
	return t, nil
}

// norm loads an RMSNorm weight [n], adding 1 when normOffset says the
// checkpoint stores it zero-centred.
func (l *loader) norm(name string, n int) (Array, error) {
	if !l.normOffset {
		return l.vector(name, n)
	}
	t, err := l.rawTensor(name, n)
	if err != nil {
		return nil, err
	}
	v, err := floats32(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for i := range v {
		v[i]++
	}
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

// Info describes the model (all of its layers, also on a pipeline stage).
func (m *Model) Info() ModelInfo {
	c := m.cfg
	info := ModelInfo{Arch: c.Arch, Layers: c.Layers, Hidden: c.Hidden, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, Vocab: c.Vocab, MaxPositions: c.MaxPositions, CacheDType: m.cacheDT,
		Windows: windows(m.all)}
	if recurrent(m.all) {
		info.Recurrent = make([]bool, len(m.all))
		for i, k := range m.all {
			info.Recurrent[i] = k.Recurrent
		}
	}
	return info
}

// Blocks returns the model's layers in order (for inspection: their kinds
// and weights).
func (m *Model) Blocks() []Block { return slices.Clone(m.blocks) }

// Config returns the parsed config.json.
func (m *Model) Config() Config { return m.cfg }

// Fingerprint identifies the KV this model computes (see Fingerprint).
func (m *Model) Fingerprint() Fingerprint { return m.fp }

// Backend returns the backend the model runs on.
func (m *Model) Backend() Backend { return m.b }

// NewCache makes an empty KV cache for this model in its cache dtype.
func (m *Model) NewCache() KVCache {
	if recurrent(m.kinds) {
		m.mu.Lock() // its fresh states are made on the backend, beside other callers' steps
		defer m.mu.Unlock()
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
	m.blocks, m.weights = nil, nil
	m.embed, m.head = nil, nil
	return nil
}

var errModelClosed = errors.New("engine: model is closed")

// checkWhole refuses whole-model steps on a pipeline stage.
func (m *Model) checkWhole() error {
	if m.blocks != nil && (m.embed == nil || m.head == nil) {
		return fmt.Errorf("%w (layers [%d, %d) of %d): use StageForward", ErrStage, m.stage.Start, m.stage.End, m.cfg.Layers)
	}
	return nil
}

func (m *Model) checkCache(c KVCache, tokens []int32) error {
	if m.blocks == nil {
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
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	if err := m.checkCache(c, tokens); err != nil {
		return nil, err
	}
	err = m.guarded(c, len(tokens), "forward", func() error {
		for len(tokens) > DefaultPrefillChunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := m.step(c, tokens[:DefaultPrefillChunk], false, nil); err != nil {
				return err
			}
			m.b.Free() // this chunk's temporaries; its KV is in the cache
			tokens = tokens[DefaultPrefillChunk:]
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		m.scr.flat = dst
		return m.step(c, tokens, true, &dst)
	})
	if err != nil {
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
	if err := m.checkWhole(); err != nil {
		return nil, err
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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.scr.flat = dst
	return m.guardedSeqs(caches, starts, toks, lastRows, "forward batch")
}

// ForwardAllInto runs tokens at positions c.Len()… in one step, appends
// their KV and returns the logits after every one of them: row i is what
// Forward would return after tokens[:i+1]. It is how a speculative
// decoder verifies k drafted tokens in one forward (the last token fed
// and the k drafts: k+1 rows); the caller truncates the cache past the
// drafts it rejects. The rows are views of dst's storage (len(tokens)·V
// floats, grown when its capacity is less); the slice of rows belongs to
// m and is valid until the next call. At most DefaultPrefillChunk
// tokens. On error the cache is truncated to where it was.
func (m *Model) ForwardAllInto(ctx context.Context, c KVCache, tokens []int32, dst []float32) (logits [][]float32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(tokens) == 0 || len(tokens) > DefaultPrefillChunk {
		return nil, fmt.Errorf("engine: ForwardAll with %d tokens (want 1 to %d)", len(tokens), DefaultPrefillChunk)
	}
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	if err := m.checkCache(c, tokens); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	err = m.guarded(c, len(tokens), "forward all", func() error {
		cs := &m.scr.oneCache
		cs[0] = c
		defer func() { cs[0] = nil }()
		ts := [1][]int32{tokens}
		m.scr.flat = dst
		var err error
		logits, err = m.stepSeqs(cs[:], ts[:], everyRow)
		return err
	})
	if err != nil {
		return nil, err
	}
	return logits, nil
}

// ForwardBatchAllInto is one step of several sequences of any lengths
// with every position's logits: tokens[i] (1 to DefaultPrefillChunk
// tokens) continues caches[i] at caches[i].Len(). It is how a decode
// batch verifies several generations' drafts in one forward beside
// generations that feed one token (a speculating generation's chunk is
// its last token and its k drafts, k+1 positions; the others' one).
// Embedding, projections and MLPs run once over all the rows; attention
// runs per sequence; every row is what it would be with its sequence
// alone (the backends' ops are row-independent), so sequence i's rows
// equal ForwardAllInto(caches[i], tokens[i])'s. The rows come in order:
// sequence 0's len(tokens[0]) rows, then sequence 1's, and so on; they are
// views of dst's storage (Σ len(tokens[i])·V floats, grown when its
// capacity is less) and the slice of rows belongs to m, valid until the
// next call. The caches must be distinct; the caller truncates each past
// the drafts it rejects. On error every cache is truncated to where it
// was. A warm step with a reused dst allocates nothing on the cpu backend.
func (m *Model) ForwardBatchAllInto(ctx context.Context, caches []KVCache, tokens [][]int32, dst []float32) (logits [][]float32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(caches) == 0 || len(caches) != len(tokens) {
		return nil, fmt.Errorf("engine: ForwardBatchAll with %d caches and %d chunks", len(caches), len(tokens))
	}
	if err := m.checkWhole(); err != nil {
		return nil, err
	}
	starts := grow(&m.scr.starts, len(caches))
	for i, c := range caches {
		if n := len(tokens[i]); n == 0 || n > DefaultPrefillChunk {
			return nil, fmt.Errorf("engine: ForwardBatchAll: chunk %d has %d tokens (want 1 to %d)", i, n, DefaultPrefillChunk)
		}
		if slices.Contains(caches[:i], c) {
			return nil, fmt.Errorf("engine: ForwardBatchAll: cache %d appears twice", i)
		}
		if err := m.checkCache(c, tokens[i]); err != nil {
			return nil, err
		}
		starts[i] = c.Len()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.scr.flat = dst
	return m.guardedSeqs(caches, starts, tokens, everyRow, "forward batch all")
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
	if err = m.checkWhole(); err == nil {
		err = m.checkCache(c, tokens)
	}
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
		if m.blocks != nil { // Close may have run between chunks
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

// guardedSeqs is guarded for one step of several sequences: toks[i] on
// caches[i], which holds starts[i] positions; on an error or a panic every
// cache is truncated to where it was.
func (m *Model) guardedSeqs(caches []KVCache, starts []int, toks [][]int32, want logitRows, op string) (logits [][]float32, err error) {
	beginSeqs(caches, starts, toks)
	defer func() { m.endSeqs(caches, starts, err) }()
	defer recoverInto(&err, op)
	return m.stepSeqs(caches, toks, want)
}

// beginSeqs begins a step of toks[i] on each caches[i], noting in starts[i]
// where it was.
func beginSeqs(caches []KVCache, starts []int, toks [][]int32) {
	for i, c := range caches {
		starts[i] = c.Len()
		beginStep(c, len(toks[i]))
	}
}

// endSeqs ends a step begun by beginSeqs (m.mu held): when it failed (err)
// every cache goes back to where it was; the step's temporaries are freed
// either way.
func (m *Model) endSeqs(caches []KVCache, starts []int, err error) {
	if err != nil {
		for i, c := range caches {
			truncateHeld(c, starts[i])
		}
	}
	m.b.Free()
}

func (m *Model) guardedStep(c KVCache, tokens []int32) error {
	return m.guarded(c, len(tokens), "prefill", func() error { return m.step(c, tokens, false, nil) })
}

// guarded runs f as one step of n tokens on c (m.mu held): on an error,
// or a panic (an error naming op), c is truncated to where it was; the
// step's temporaries are freed either way.
func (m *Model) guarded(c KVCache, n int, op string, f func() error) (err error) {
	start := c.Len()
	beginStep(c, n)
	defer func() {
		if err != nil {
			truncateHeld(c, start)
		}
		m.b.Free()
	}()
	defer recoverInto(&err, op)
	return f()
}

// step runs one chunk through every layer. With logits set it writes the
// last position's logits [V] to *logits; otherwise it only fills the cache.
func (m *Model) step(c KVCache, tokens []int32, wantLogits bool, logits *[]float32) error {
	cs := &m.scr.oneCache
	cs[0] = c
	defer func() { cs[0] = nil }()
	ts := [1][]int32{tokens} // stepSeqs does not keep toks: stays on the stack
	want := noRows
	if wantLogits {
		want = lastRows
	}
	out, err := m.stepSeqs(cs[:], ts[:], want)
	if err == nil && wantLogits {
		*logits = out[0]
	}
	return err
}

// truncateHeld truncates c to n from a step (m.mu held): a hybrid cache's
// Truncate would take the lock again.
func truncateHeld(c KVCache, n int) {
	if hc, ok := c.(*hybridCache); ok {
		hc.truncate(n)
		return
	}
	c.Truncate(n)
}

// beginStep marks where a hybrid cache's step of n tokens begins (see
// hybridCache).
func beginStep(c KVCache, n int) {
	if hc, ok := c.(*hybridCache); ok {
		hc.begin(n)
	}
}
