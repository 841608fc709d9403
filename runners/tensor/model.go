package tensor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Model is rank 0's model as the decode server drives it
// (decode.Model, with ForwardBatchInto for the batcher and ForwardAllInto
// for speculation): every call goes to the followers first, then runs on
// rank 0's share. Every rank computes the same logits (the embedding and
// LM head are replicated); rank 0's are returned, and only rank 0
// samples.
type Model struct {
	g *Leader
	m *engine.Model
	// scratch for a batch's local caches and ids (under g.callMu)
	locals []engine.KVCache
	ids    []uint64
}

// Model binds rank 0's loaded share (loaded with Collective, or with
// MLX's group) and returns the adapter the decode server drives.
func (g *Leader) Model(m *engine.Model) *Model { return &Model{g: g, m: m} }

// Info is the whole model's.
func (t *Model) Info() engine.ModelInfo { return t.m.Info() }

// Fingerprint is the whole model's.
func (t *Model) Fingerprint() engine.Fingerprint { return t.m.Fingerprint() }

// Backend is rank 0's backend.
func (t *Model) Backend() engine.Backend { return t.m.Backend() }

// KVHeadRange is rank 0's KV heads.
func (t *Model) KVHeadRange() (start, end int) { return t.m.KVHeadRange() }

// NewCache returns a composite cache: rank 0's share here, the
// followers' made on their first call naming it.
func (t *Model) NewCache() engine.KVCache {
	c := &cache{g: t.g, id: t.g.nextID.Add(1), local: t.m.NewCache()}
	t.g.callMu.Lock()
	t.g.caches[c.id] = c
	t.g.callMu.Unlock()
	return c
}

// local returns c's share on rank 0 (callMu held).
func local(c engine.KVCache) (*cache, error) {
	cc, ok := c.(*cache)
	if !ok {
		return nil, fmt.Errorf("tensor: a cache of type %T is not the group's", c)
	}
	if cc.stale {
		return nil, ErrCacheLost
	}
	return cc, nil
}

// Forward runs tokens on every rank and returns the last position's
// logits.
func (t *Model) Forward(ctx context.Context, c engine.KVCache, tokens []int32) (logits []float32, err error) {
	t.g.callMu.Lock()
	defer t.g.callMu.Unlock()
	cc, err := local(c)
	if err != nil {
		return nil, err
	}
	err = t.g.call(ctx, &call{op: opForward, ids: []uint64{cc.id}, tokens: tokens}, false, func(ctx context.Context) error {
		var err error
		logits, err = t.m.Forward(ctx, cc.local, tokens)
		return err
	})
	return logits, err
}

// ForwardBatch is ForwardBatchInto with fresh rows.
func (t *Model) ForwardBatch(ctx context.Context, caches []engine.KVCache, tokens []int32) ([][]float32, error) {
	rows, err := t.ForwardBatchInto(ctx, caches, tokens, nil)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = append([]float32(nil), r...)
	}
	return out, nil
}

// ForwardBatchInto runs one decode step of several sequences on every
// rank (engine.Model.ForwardBatchInto's contract).
func (t *Model) ForwardBatchInto(ctx context.Context, caches []engine.KVCache, tokens []int32, dst []float32) (logits [][]float32, err error) {
	t.g.callMu.Lock()
	defer t.g.callMu.Unlock()
	if len(caches) != len(tokens) {
		return nil, fmt.Errorf("tensor: ForwardBatch with %d caches and %d tokens", len(caches), len(tokens))
	}
	t.locals, t.ids = t.locals[:0], t.ids[:0]
	for _, c := range caches {
		cc, err := local(c)
		if err != nil {
			return nil, err
		}
		t.locals, t.ids = append(t.locals, cc.local), append(t.ids, cc.id)
	}
	err = t.g.call(ctx, &call{op: opBatch, ids: t.ids, tokens: tokens}, false, func(ctx context.Context) error {
		var err error
		logits, err = t.m.ForwardBatchInto(ctx, t.locals, tokens, dst)
		return err
	})
	clear(t.locals)
	return logits, err
}

// ForwardAllInto verifies several tokens in one forward on every rank
// (engine.Model.ForwardAllInto's contract).
func (t *Model) ForwardAllInto(ctx context.Context, c engine.KVCache, tokens []int32, dst []float32) (logits [][]float32, err error) {
	t.g.callMu.Lock()
	defer t.g.callMu.Unlock()
	cc, err := local(c)
	if err != nil {
		return nil, err
	}
	err = t.g.call(ctx, &call{op: opAll, ids: []uint64{cc.id}, tokens: tokens}, false, func(ctx context.Context) error {
		var err error
		logits, err = t.m.ForwardAllInto(ctx, cc.local, tokens, dst)
		return err
	})
	return logits, err
}

// Prefill runs tokens in chunks, each chunk one call (so other
// sequences' steps run between chunks, and ctx stops it between chunks on
// every rank alike).
func (t *Model) Prefill(ctx context.Context, c engine.KVCache, tokens []int32, chunk int, onChunk func(start, n int) error) error {
	if chunk <= 0 {
		chunk = engine.DefaultPrefillChunk
	}
	for len(tokens) > 0 {
		n := min(chunk, len(tokens))
		start := c.Len()
		err := func() error {
			t.g.callMu.Lock()
			defer t.g.callMu.Unlock()
			cc, err := local(c)
			if err != nil {
				return err
			}
			part := tokens[:n]
			return t.g.call(ctx, &call{op: opPrefill, ids: []uint64{cc.id}, tokens: part}, false, func(ctx context.Context) error {
				return t.m.Prefill(ctx, cc.local, part, n, nil)
			})
		}()
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

// cache is a sequence's cache over the group: rank 0's share, and an id
// the followers know their shares by.
type cache struct {
	g     *Leader
	id    uint64
	local engine.KVCache
	stale bool // emptied by a group restart; only Truncate(0) makes it usable
}

var errComposite = errors.New("tensor: a group cache's K/V are spread over the ranks")

func (c *cache) Len() int { return c.local.Len() }

func (c *cache) Append(layer int, k, v engine.Array) (engine.Array, engine.Array) {
	panic(errComposite) // the engine is given rank 0's share, never the composite
}

// Truncate truncates every rank's share (rank 0's alone while the group
// is broken: the followers' shares are gone then).
func (c *cache) Truncate(n int) {
	c.g.callMu.Lock()
	defer c.g.callMu.Unlock()
	if c.stale {
		if n == 0 {
			c.stale = false
		}
		return
	}
	if c.g.isLost() {
		return // the MLX thread may be stuck in the dead group's all_sum; the process is ending
	}
	_ = c.g.call(context.Background(), &call{op: opTruncate, ids: []uint64{c.id}, n: n}, false, func(context.Context) error {
		return nil
	})
	c.local.Truncate(n)
}

func (c *cache) CanTruncate(n int) bool {
	if c.stale {
		return n == 0
	}
	return c.local.CanTruncate(n)
}

func (c *cache) Export(layer, start, n int) (k, v []byte, err error) {
	return nil, nil, fmt.Errorf("%w: Export", errComposite)
}

func (c *cache) Import(layer, start, n int, k, v []byte) error {
	return fmt.Errorf("%w: Import (remote prefill goes through the group's Remote)", errComposite)
}

func (c *cache) Commit(n int) error {
	return fmt.Errorf("%w: Commit", errComposite)
}

func (c *cache) DType() engine.DType { return c.local.DType() }

// Geometry is rank 0's share's (its KV heads).
func (c *cache) Geometry() engine.CacheGeometry { return c.local.Geometry() }

// Free frees every rank's share.
func (c *cache) Free() {
	c.g.callMu.Lock()
	defer c.g.callMu.Unlock()
	delete(c.g.caches, c.id)
	if c.g.isLost() {
		return // as in Truncate
	}
	_ = c.g.call(context.Background(), &call{op: opFree, ids: []uint64{c.id}}, false, func(context.Context) error { return nil })
	c.local.Free()
}

// StageStep runs one step of a pipeline stage's layers on every rank of
// the stage's group (engine.Model.StageStep's contract; the group's
// shares were loaded with the stage's layer range): the followers get the
// sequences' tokens and the previous stage's output rows (hidden, nil on
// stage 0) and compute their shares alongside; every rank ends with the
// same output rows (or, on the last stage, logits), and rank 0's are
// returned. runners/stage drives it as a stage's layers (stage.Layers).
func (t *Model) StageStep(ctx context.Context, caches []engine.KVCache, toks [][]int32, hidden []float32) (out []float32, logits [][]float32, err error) {
	t.g.callMu.Lock()
	defer t.g.callMu.Unlock()
	if len(caches) != len(toks) || len(caches) == 0 {
		return nil, nil, fmt.Errorf("tensor: StageStep with %d caches and %d chunks", len(caches), len(toks))
	}
	locals := make([]engine.KVCache, len(caches))
	c := &call{op: opStage, ids: make([]uint64, len(caches)), counts: make([]int, len(caches))}
	for i, x := range caches {
		cc, err := local(x)
		if err != nil {
			return nil, nil, err
		}
		locals[i], c.ids[i], c.counts[i] = cc.local, cc.id, len(toks[i])
		c.tokens = append(c.tokens, toks[i]...)
	}
	if len(hidden) > 0 {
		c.hidden = make([]byte, 4*len(hidden))
		for i, v := range hidden {
			binary.LittleEndian.PutUint32(c.hidden[4*i:], math.Float32bits(v))
		}
	}
	err = t.g.call(ctx, c, false, func(ctx context.Context) error {
		var err error
		out, logits, err = t.m.StageStep(ctx, locals, toks, hidden)
		return err
	})
	return out, logits, err
}

// Stage is the layer range the group's shares hold.
func (t *Model) Stage() engine.LayerRange { return t.m.Stage() }
