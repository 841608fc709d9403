package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// Tensor parallelism (DESIGN.md §13): a model split over the ranks of a
// group, each rank holding a slice of every block and running every step
// in lockstep with the others, as MLX's shard_linear splits a model.
//
// Each Block says how its weights split (Weights, Shard). A rank loads its
// share of each tensor as the blocks' loaders read it (LoadOptions.Tensor):
// q/k/v, gate/up and the experts' gate/up by output rows (a contiguous
// range of heads or of the intermediate width per rank); o_proj, down and
// the experts' down by input columns, their outputs summed over the ranks
// (Collective.AllSum) once per mixer and once per feed-forward part (a MoE
// sums its routed and shared experts in one all_sum after the layer); a
// bias added after such a sum only on rank 0; per-head vectors (attention
// sinks, DeltaNet's A_log and dt_bias) with their heads. Quantized weights
// split with their scales and biases: by rows freely, by input columns only
// on whole quantization groups (MLX affine 4/8-bit, GGUF blocks, which the
// reader has converted to groups of 32, MXFP4 in groups of 32). Gated
// DeltaNet layers split by key heads (each key head's value heads with it);
// their fused projections are grouped per key head or cut per part (q, k,
// v). The residual stream stays whole and identical on every rank (every
// all_sum hands each rank the same bytes), so the norms and the MoE router
// are replicated and every rank routes alike.
//
// The embedding and the LM head are replicated: every rank computes the
// same logits, and only rank 0's are used to sample. A vocabulary split
// would read 1/N of the head per rank but needs an all_gather of the logits
// every step (V floats, 0.6 MB for Llama 3's vocabulary) or a distributed
// argmax that sampling with penalties and logprobs cannot use; replicated,
// a decode step has exactly two all_sums per layer and no other
// collective.
//
// Each rank's cache holds its share of the KV heads (KVHeadRange): its
// geometry has KVHeads/N heads.

// Collective is a group of tensor-parallel ranks: the MLX runner's
// mlx_distributed group, or LocalGroup's in-process ranks.
type Collective interface {
	// Rank is this rank's index in [0, Size()).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllSum returns the elementwise sum of x over the ranks (x on this
	// rank, made by b; every rank calls AllSum in the same order with
	// the same shape and dtype). Every rank gets the same values. Like
	// the Backend's ops it does not return an error: a failure panics
	// with an error value (the engine's entry points recover it).
	AllSum(b Backend, x Array) Array
}

// ErrTensorSplit is wrapped by the refusals of a rank count that does not
// divide a model's heads or widths (CheckTensorSplit).
var ErrTensorSplit = errors.New("engine: tensor split")

// ErrCollectiveAborted is wrapped by the panics of a LocalGroup's AllSum
// once the group was aborted (a rank failed; the others must not wait for
// it forever).
var ErrCollectiveAborted = errors.New("engine: collective aborted")

// CheckTensorSplit reports whether a model with config c splits over n
// tensor-parallel ranks: n must divide num_attention_heads,
// num_key_value_heads, intermediate_size (when some layer is dense),
// moe_intermediate_size (when it has experts),
// shared_expert_intermediate_size, linear_num_key_heads and
// linear_num_value_heads (Gated DeltaNet), and a quantized checkpoint's
// split inputs (o_proj, down_proj) must stay whole groups. The error
// (wrapping ErrTensorSplit) names every count that does not divide and
// lists the rank counts that would, in this form:
//
//	engine: tensor split: 2 ranks: num_attention_heads 9 is not divisible by 2; num_key_value_heads 3 is not divisible by 2 (rank counts that divide: 1, 3)
//
// A family whose layers cannot split at all is refused by name
// ("engine: tensor split: 2 ranks: Olmo2ForCausalLM: ...").
func CheckTensorSplit(c *Config, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: %d ranks (want at least 1)", ErrTensorSplit, n)
	}
	if n == 1 {
		return nil
	}
	if a := registered(c.Arch); a != nil && a.NoTensorSplit != "" {
		return fmt.Errorf("%w: %d ranks: %s: %s", ErrTensorSplit, n, c.Arch, a.NoTensorSplit)
	}
	sizes := splitSizes(c)
	var bad []string
	for _, s := range sizes {
		if !s.divides(n) {
			bad = append(bad, s.why(n))
		}
	}
	if bad == nil {
		return nil
	}
	var ok []string
	for k := 1; k <= maxSplit(sizes); k++ {
		good := true
		for _, s := range sizes {
			good = good && s.divides(k)
		}
		if good {
			ok = append(ok, fmt.Sprint(k))
		}
	}
	return fmt.Errorf("%w: %d ranks: %s (rank counts that divide: %s)", ErrTensorSplit, n, strings.Join(bad, "; "), strings.Join(ok, ", "))
}

// splitSize is one count a rank count must divide: value under its
// config.json key, and when group > 0 the split part (value/n·unit
// inputs) must also be a multiple of group (a quantized split input).
type splitSize struct {
	key         string
	value       int
	unit, group int
	groupOf     string // the split input's name (for the message)
}

func (s splitSize) divides(n int) bool {
	if s.value%n != 0 {
		return false
	}
	// A whole input that is not a multiple of the group is not quantized
	// with it (a per-layer override): only whole groups constrain.
	return s.group == 0 || (s.value*s.unit)%s.group != 0 || (s.value/n*s.unit)%s.group == 0
}

func (s splitSize) why(n int) string {
	if s.value%n != 0 {
		return fmt.Sprintf("%s %d is not divisible by %d", s.key, s.value, n)
	}
	return fmt.Sprintf("%s %d over %d ranks leaves %s %d inputs per rank, not a multiple of the quantization group %d",
		s.key, s.value, n, s.groupOf, s.value/n*s.unit, s.group)
}

// maxSplit bounds the rank counts worth listing: the largest count of heads.
func maxSplit(sizes []splitSize) int {
	m := 1
	for _, s := range sizes {
		m = max(m, s.value)
	}
	return min(m, 1024)
}

// splitSizes lists the counts c's split must divide.
func splitSizes(c *Config) []splitSize {
	g := 0
	if c.Quant.Bits > 0 {
		g = c.Quant.GroupSize
	}
	s := []splitSize{
		{key: "num_attention_heads", value: c.Heads, unit: c.HeadDim, group: g, groupOf: "o_proj"},
		{key: "num_key_value_heads", value: c.KVHeads},
	}
	dense, sparse := c.Experts == 0, false
	for i := range c.Layers {
		if c.IsMoELayer(i) {
			sparse = true
		} else {
			dense = true
		}
	}
	if dense {
		s = append(s, splitSize{key: "intermediate_size", value: c.Intermediate, unit: 1, group: g, groupOf: "down_proj"})
	}
	if sparse {
		eg := g
		if c.ExpertGroup > 0 {
			eg = c.ExpertGroup
		}
		s = append(s, splitSize{key: "moe_intermediate_size", value: c.MoEIntermediate, unit: 1, group: eg, groupOf: "the experts' down_proj"})
		if c.SharedExpertIntermediate > 0 {
			s = append(s, splitSize{key: "shared_expert_intermediate_size", value: c.SharedExpertIntermediate, unit: 1, group: g, groupOf: "shared_expert.down_proj"})
		}
	}
	if c.FullAttentionInterval > 0 {
		s = append(s, splitSize{key: "linear_num_key_heads", value: c.LinearKeyHeads},
			splitSize{key: "linear_num_value_heads", value: c.LinearValueHeads, unit: c.LinearValueDim, group: g, groupOf: "out_proj"})
	}
	return s
}

// rankConfig is c with the counts one of n ranks holds: its heads, KV
// heads, widths and DeltaNet heads (CheckTensorSplit passed).
func rankConfig(c *Config, n int) Config {
	r := *c
	if n <= 1 {
		return r
	}
	r.Heads /= n
	r.KVHeads /= n
	r.Intermediate /= n // used by dense layers only, which CheckTensorSplit checked
	r.MoEIntermediate /= n
	r.SharedExpertIntermediate /= n
	r.LinearKeyHeads /= n
	r.LinearValueHeads /= n
	return r
}

// TensorRank is the model's tensor-parallel rank and rank count (0 and 1
// when it is not split).
func (m *Model) TensorRank() (rank, ranks int) {
	if m.tp == nil {
		return 0, 1
	}
	return m.tp.Rank(), m.tp.Size()
}

// KVHeadRange is the model's KV heads [start, end) of the whole model's
// (its caches hold these; all of them when the model is not split).
func (m *Model) KVHeadRange() (start, end int) {
	r, _ := m.TensorRank()
	return r * m.rc.KVHeads, (r + 1) * m.rc.KVHeads
}

// allSum sums a block's partial output over the tensor-parallel ranks (x
// itself when the model is not split).
func (s *step) allSum(x Array) Array {
	if s.m.tp == nil {
		return x
	}
	return s.m.tp.AllSum(s.b, x)
}

// share says which part of a tensor a rank loads: the whole (axis < 0),
// its share of axis (split into equal parts per segment), or all of it on
// rank 0 and nothing elsewhere (first: a bias added after an all_sum).
type share struct {
	axis  int
	segs  []int // the axis' segments in the whole tensor (nil: one)
	first bool
}

// whole is the share of a replicated tensor.
var whole = share{axis: -1}

// ranks is the loader's rank count (1 when the model is not split).
func (l *loader) ranks() int {
	if l.tp == nil {
		return 1
	}
	return l.tp.Size()
}

// cut returns axis's ranges [lo, hi) this rank holds of a tensor whose
// axis has length n·local (or the segments segs, each split evenly).
func (l *loader) cut(length int, segs []int) ([][2]int, error) {
	n, r := l.ranks(), l.tp.Rank()
	if segs == nil {
		segs = []int{length}
	}
	var out [][2]int
	off := 0
	for _, s := range segs {
		if s%n != 0 {
			return nil, fmt.Errorf("%w: a part of %d does not split over %d ranks", ErrTensorSplit, s, n)
		}
		out = append(out, [2]int{off + r*s/n, off + (r+1)*s/n})
		off += s
	}
	if off != length {
		return nil, fmt.Errorf("%w: parts %v of an axis of %d", ErrTensorSplit, segs, length)
	}
	return out, nil
}

// cutIf is cut of one segment, nil when the model is not split.
func (l *loader) cutIf(length int) ([][2]int, error) {
	if l.ranks() == 1 {
		return nil, nil
	}
	return l.cut(length, nil)
}

// take copies ranges of axis out of a row-major tensor (elements esz
// bytes) and returns them with their shape.
func take(data []byte, shape []int, esz, axis int, ranges [][2]int) ([]byte, []int) {
	outer, inner := 1, esz
	for _, d := range shape[:axis] {
		outer *= d
	}
	for _, d := range shape[axis+1:] {
		inner *= d
	}
	kept := 0
	for _, r := range ranges {
		kept += r[1] - r[0]
	}
	out := make([]byte, 0, outer*kept*inner)
	row := shape[axis] * inner
	for o := range outer {
		base := o * row
		for _, r := range ranges {
			out = append(out, data[base+r[0]*inner:base+r[1]*inner]...)
		}
	}
	ns := slices.Clone(shape)
	ns[axis] = kept
	return out, ns
}

// shardTensor loads name, whose shape on this rank is local, as sp says:
// the whole tensor (local is its shape), this rank's share of sp.axis (the
// whole tensor has that axis n times as long, or the segments' sum), or
// on rank 0 only (nil elsewhere).
func (l *loader) shardTensor(name string, local []int, sp share) (Array, error) {
	n := l.ranks()
	switch {
	case n == 1 || sp.axis < 0 && !sp.first:
		a, _, err := l.tensor(name, local...)
		return a, err
	case sp.first:
		if l.tp.Rank() != 0 {
			return nil, nil
		}
		a, _, err := l.tensor(name, local...)
		return a, err
	}
	global := slices.Clone(local)
	global[sp.axis] *= n
	if sp.segs != nil {
		sum := 0
		for _, s := range sp.segs {
			sum += s
		}
		if sum != global[sp.axis] {
			return nil, fmt.Errorf("%s: parts %v for %d of %d ranks' %d", name, sp.segs, sum, n, local[sp.axis])
		}
	}
	t, err := l.rawTensor(name, global...)
	if err != nil {
		return nil, err
	}
	ranges, err := l.cut(global[sp.axis], sp.segs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	data, shape := take(t.Data, t.Shape, t.DType.Size(), sp.axis, ranges)
	return l.keep(l.b.FromBytes(data, shape, t.DType)), nil
}

// shardLinear loads prefix.weight (and .scales/.biases when quantized, and
// prefix.bias when bias) as this rank's share: out and in are this rank's
// sizes; SplitOutput cuts the rows (into segs, each split evenly, when
// given), SplitInput the input columns on whole quantization groups (the
// bias then only on rank 0), Replicated loads it whole.
func (l *loader) shardLinear(prefix string, out, in int, bias bool, sh Shard, segs ...int) (*Linear, error) {
	if l.ranks() == 1 || sh == Replicated {
		return l.linear(prefix, out, in, bias)
	}
	q := l.src.Quant(prefix)
	lin := &Linear{Bits: q.Bits, GroupSize: q.GroupSize, Mode: q.Mode}
	if q.Mode == "mxfp4" && (q.Bits != 4 || q.GroupSize != 32) {
		return nil, fmt.Errorf("%s: mxfp4 with %d bits in groups of %d (want 4 and 32)", prefix, q.Bits, q.GroupSize)
	}
	if q.Bits != 0 && (q.GroupSize <= 0 || in%q.GroupSize != 0 || (in*q.Bits)%32 != 0) {
		if sh == SplitInput {
			return nil, fmt.Errorf("%s: %w: %d ranks leave %d inputs each, not whole %d-bit groups of %d", prefix, ErrTensorSplit, l.ranks(), in, q.Bits, q.GroupSize)
		}
		return nil, fmt.Errorf("%s: %d-bit group %d does not fit %d inputs", prefix, q.Bits, q.GroupSize, in)
	}
	w := share{axis: 0, segs: segs}
	b := share{axis: 0, segs: segs}
	if sh == SplitInput {
		w, b = share{axis: 1}, share{axis: -1, first: true}
	}
	cols := in
	if q.Bits != 0 {
		cols = in * q.Bits / 32
	}
	var err error
	if lin.W, err = l.shardTensor(prefix+".weight", []int{out, cols}, w); err != nil {
		return nil, err
	}
	if q.Bits != 0 {
		if lin.Scales, err = l.shardTensor(prefix+".scales", []int{out, in / q.GroupSize}, w); err != nil {
			return nil, err
		}
		if q.Mode == "" {
			if lin.Biases, err = l.shardTensor(prefix+".biases", []int{out, in / q.GroupSize}, w); err != nil {
				return nil, err
			}
		}
	}
	if bias {
		if lin.Bias, err = l.shardTensor(prefix+".bias", []int{out}, b); err != nil {
			return nil, err
		}
	}
	return lin, nil
}

// shardStacked cuts a stacked [E, out, cols] part's host data (the whole
// model's) to this rank's share for sh: rows for SplitOutput, columns for
// SplitInput. cols is the stored column count (packed when quantized).
func (l *loader) shardStacked(data []byte, shape []int, esz int, sh Shard) ([]byte, []int, error) {
	if l.ranks() == 1 || sh == Replicated {
		return data, shape, nil
	}
	axis := len(shape) - 2
	if sh == SplitInput {
		axis = len(shape) - 1
	}
	ranges, err := l.cut(shape[axis], nil)
	if err != nil {
		return nil, nil, err
	}
	d, s := take(data, shape, esz, axis, ranges)
	return d, s, nil
}

// LocalGroup is an in-process Collective of n ranks (goroutines, one
// Model and Backend each): its all_sum sums the ranks' arrays on the host
// in rank order, in float32, and hands every rank the same bytes, so the
// ranks stay identical and a run is deterministic. It carries tensor
// parallelism in tests and benchmarks on the cpu backend; across
// processes the MLX runner's group does the same over the network.
type LocalGroup struct {
	n     int
	mu    sync.Mutex
	cond  *sync.Cond
	in    [][]float32 // this round's contributions, by rank
	shape []int
	dt    DType
	got   int    // contributions so far this round
	out   []byte // the round's sum, while it is handed out
	left  int    // ranks that have not taken out yet
	err   error  // set by Abort: every call fails from then on
	ranks []*localRank
}

// NewLocalGroup makes a group of n in-process ranks.
func NewLocalGroup(n int) *LocalGroup {
	if n < 1 {
		panic(fmt.Sprintf("engine: a local group of %d ranks", n))
	}
	g := &LocalGroup{n: n, in: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	for r := range n {
		g.ranks = append(g.ranks, &localRank{g: g, rank: r})
	}
	return g
}

// Rank returns rank r's Collective (LoadOptions.Tensor of rank r's Model).
func (g *LocalGroup) Rank(r int) Collective { return g.ranks[r] }

// Abort makes every pending and later AllSum of the group fail with err
// (wrapped in ErrCollectiveAborted): a rank whose step failed calls it so
// that the others do not wait for it forever.
func (g *LocalGroup) Abort(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = fmt.Errorf("%w: %w", ErrCollectiveAborted, err)
	}
	g.cond.Broadcast()
}

// CollectiveStats counts a rank's all_sums and the bytes it contributed.
type CollectiveStats struct {
	Calls, Bytes int64
}

// Stats returns rank r's counts so far.
func (g *LocalGroup) Stats(r int) CollectiveStats {
	lr := g.ranks[r]
	return CollectiveStats{Calls: lr.calls.Load(), Bytes: lr.bytes.Load()}
}

type localRank struct {
	g            *LocalGroup
	rank         int
	calls, bytes atomic.Int64
}

func (r *localRank) Rank() int { return r.rank }
func (r *localRank) Size() int { return r.g.n }

func (r *localRank) AllSum(b Backend, x Array) Array {
	raw, err := b.Bytes(x)
	if err != nil {
		panic(fmt.Errorf("all_sum: %w", err))
	}
	r.calls.Add(1)
	r.bytes.Add(int64(len(raw)))
	if r.g.n == 1 {
		return x
	}
	shape := slices.Clone(x.Shape())
	sum, err := r.g.reduce(r.rank, raw, shape, x.DType())
	if err != nil {
		panic(err)
	}
	return b.FromBytes(sum, shape, x.DType())
}

// reduce adds rank's contribution to the current round, waits for the
// others and returns the round's sum (shared, read-only).
func (g *LocalGroup) reduce(rank int, raw []byte, shape []int, dt DType) ([]byte, error) {
	v, err := toFloat32(raw, dt)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.out != nil && g.err == nil { // the previous round is still being handed out
		g.cond.Wait()
	}
	if g.err != nil {
		return nil, g.err
	}
	if g.got == 0 {
		g.shape, g.dt = shape, dt
	} else if !slices.Equal(g.shape, shape) || g.dt != dt {
		g.err = fmt.Errorf("%w: rank %d sums %v %v, another rank %v %v", ErrCollectiveAborted, rank, shape, dt, g.shape, g.dt)
		g.cond.Broadcast()
		return nil, g.err
	}
	g.in[rank] = v
	g.got++
	if g.got == g.n {
		sum := slices.Clone(g.in[0])
		for _, o := range g.in[1:] {
			for i := range sum {
				sum[i] += o[i]
			}
		}
		g.out, g.left = fromFloat32(sum, dt), g.n
		g.cond.Broadcast()
	}
	for g.out == nil && g.err == nil {
		g.cond.Wait()
	}
	if g.err != nil {
		return nil, g.err
	}
	out := g.out
	if g.left--; g.left == 0 {
		g.out, g.got = nil, 0
		clear(g.in)
		g.cond.Broadcast()
	}
	return out, nil
}

func toFloat32(raw []byte, dt DType) ([]float32, error) {
	return floats32(Tensor{DType: dt, Data: raw})
}

func fromFloat32(v []float32, dt DType) []byte {
	out := make([]byte, len(v)*dt.Size())
	for i, f := range v {
		switch dt {
		case F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case BF16:
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToBF16(f))
		case F16:
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToF16(f))
		}
	}
	return out
}

// SumRanks is the all_sum of contributions made outside LocalGroup (one
// per rank, in rank order, each the host bytes of an array of dtype dt):
// the elementwise sum accumulated in float32 in rank order, as
// LocalGroup's, converted back to dt. A cross-process group (the runners'
// tensor link on the cpu backend) computes it on one rank and hands every
// rank these bytes, so the ranks stay identical.
func SumRanks(parts [][]byte, dt DType) ([]byte, error) {
	if len(parts) == 0 {
		return nil, errors.New("engine: SumRanks of no parts")
	}
	sum, err := toFloat32(parts[0], dt)
	if err != nil {
		return nil, err
	}
	for r, p := range parts[1:] {
		if len(p) != len(parts[0]) {
			return nil, fmt.Errorf("%w: rank %d sums %d bytes, rank 0 %d", ErrCollectiveAborted, r+1, len(p), len(parts[0]))
		}
		v, err := toFloat32(p, dt)
		if err != nil {
			return nil, err
		}
		for i := range sum {
			sum[i] += v[i]
		}
	}
	return fromFloat32(sum, dt), nil
}
