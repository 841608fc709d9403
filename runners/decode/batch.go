package decode

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// batcher runs the decode steps of the generations in progress together,
// one Model.ForwardBatch per step (continuous batching: a generation joins
// at its next step and leaves when it ends; prompts are still prefilled
// one at a time, under the model's lock, between steps).
//
// A generation registers with join, then for every token calls step, which
// queues its (cache, token) and waits for the logits. The batcher's loop
// takes the first queued step, waits until every joined generation has
// queued one (or gather has passed: a generation busy elsewhere, e.g.
// writing to a slow client, does not hold the others back for longer),
// then runs them as one batch.
type batcher struct {
	model  Model
	gather time.Duration
	sizes  func(n int) // observes each batch's size; may be nil
	reqs   chan *stepReq

	mu     sync.Mutex
	joined int

	stopped chan struct{} // closed when run returns
	// ov overlaps the steps of batches whose tokens the device can pick
	// (overlap.go); nil:
	// every step is serial.
	ov *overlapRun
}

type stepReq struct {
	cache  engine.KVCache
	tok    int32
	logits []float32
	picked Picked // a PickingModel's pick, when the batcher steps one
	err    error
	done   chan struct{} // buffered (1): the batcher signals, never closes
	buf    []float32     // the generation's own logits row, reused step after step
	// dev is the generation's Picker when its tokens may be picked on the
	// device (overlappable): the batcher may overlap its steps.
	dev *Picker
}

// stepBatch is the model method the batcher prefers: every row written
// into dst's storage (engine.Model.ForwardBatchInto), so that a step
// allocates nothing; ForwardBatch is the fallback.
type stepBatch interface {
	ForwardBatchInto(ctx context.Context, caches []engine.KVCache, tokens []int32, dst []float32) ([][]float32, error)
}

func newBatcher(m Model, maxBatch int, gather time.Duration) *batcher {
	return &batcher{model: m, gather: gather, reqs: make(chan *stepReq, maxBatch), stopped: make(chan struct{})}
}

// overlap makes b overlap the batches it can (before run starts).
func (b *batcher) overlap(log *slog.Logger) {
	if gs, ok := b.model.(overlapStarter); ok {
		b.ov = &overlapRun{m: gs, log: log}
	}
}

// member is one joined generation: its step request (and logits row) is
// reused for every step, so stepping allocates nothing.
type member struct {
	b    *batcher
	req  stepReq
	once sync.Once
	// dev: the generation's Picker when its tokens may be picked on the
	// device (overlappable), so that its steps may be overlapped and
	// return the picked token, not logits; nil otherwise.
	dev *Picker
}

// joinMember registers a generation; leave must be called once when it
// stops stepping.
func (b *batcher) joinMember() *member {
	b.mu.Lock()
	b.joined++
	b.mu.Unlock()
	return &member{b: b, req: stepReq{done: make(chan struct{}, 1)}}
}

func (m *member) leave() {
	m.once.Do(func() {
		if m.b.ov != nil && m.req.cache != nil {
			m.b.ov.release(m.req.cache) // the cache without the step in flight
		}
		m.b.mu.Lock()
		m.b.joined--
		m.b.mu.Unlock()
	})
}

// aside takes the member out of the batch's count until back: it is
// running a step of its own (a speculative verification) and the batch
// must not wait for its next step.
func (m *member) aside() {
	m.b.mu.Lock()
	m.b.joined--
	m.b.mu.Unlock()
}

func (m *member) back() {
	m.b.mu.Lock()
	m.b.joined++
	m.b.mu.Unlock()
}

// join is joinMember for callers that step through batcher.step.
func (b *batcher) join() (leave func()) { return b.joinMember().leave }

func (b *batcher) members() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.joined
}

// step appends tok to cache as part of the next batch and returns the
// logits after it (a PickingModel's pick instead). It always waits for
// the batch it joined: the cache is in use until then. The logits are the
// member's own row: valid until its next step.
func (m *member) step(cache engine.KVCache, tok int32) (stepOut, error) {
	b, r := m.b, &m.req
	r.cache, r.tok, r.logits, r.err, r.dev = cache, tok, nil, nil, m.dev
	select {
	case b.reqs <- r:
	case <-b.stopped:
		return stepOut{}, errBatcherStopped
	}
	select {
	case <-r.done:
		if r.err != nil {
			return stepOut{}, r.err
		}
		if r.logits == nil {
			return stepOut{picked: &r.picked}, nil
		}
		return stepOut{logits: r.logits}, nil
	case <-b.stopped:
		// run has returned; it finishes every batch it starts, so r was
		// never taken.
		return stepOut{}, errBatcherStopped
	}
}

// step is a one-off member's step (tests and callers without a member).
func (b *batcher) step(cache engine.KVCache, tok int32) ([]float32, error) {
	m := &member{b: b, req: stepReq{done: make(chan struct{}, 1)}}
	out, err := m.step(cache, tok)
	return out.logits, err
}

var errBatcherStopped = errors.New("decode: server closed")

// run serves steps until ctx ends.
func (b *batcher) run(ctx context.Context) {
	defer close(b.stopped)
	if b.ov != nil {
		defer b.ov.stop()
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*stepReq, 0, cap(b.reqs))
	// Reused step after step: the batch's caches and tokens, and the
	// model's logits storage (ForwardBatchInto).
	caches := make([]engine.KVCache, 0, cap(b.reqs))
	toks := make([]int32, 0, cap(b.reqs))
	// The model's logits for a whole batch land in flat (room for the
	// largest batch, made once), rows views of it.
	sb, into := b.model.(stepBatch)
	pm, picking := b.model.(PickingModel)
	vocab := 0
	if into {
		vocab = max(b.model.Info().Vocab, 0)
	}
	flat := make([]float32, cap(b.reqs)*vocab)
	rows := make([][]float32, 0, cap(b.reqs))
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-b.reqs:
			batch = append(batch, r)
		}
		timer.Reset(b.gather)
	gather:
		for len(batch) < cap(b.reqs) && len(batch) < b.members() {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			case <-timer.C:
				break gather
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		caches, toks = caches[:0], toks[:0]
		for _, r := range batch {
			caches, toks = append(caches, r.cache), append(toks, r.tok)
		}
		if b.sizes != nil {
			b.sizes(len(batch))
		}
		if b.ov != nil && b.ov.step(batch) {
			clear(caches)
			continue
		}
		var logits [][]float32
		var picked []Picked
		var err error
		if picking {
			picked, err = pm.ForwardBatchPick(context.Background(), caches, toks)
		} else if into && vocab > 0 {
			// The model writes every row into flat's storage (it has room
			// for the largest batch). The row slices it returns are its
			// own scratch, which another generation's prefill may reuse
			// as soon as it returns, so the rows are read from flat.
			if _, err = sb.ForwardBatchInto(context.Background(), caches, toks, flat[:0]); err == nil {
				logits = rows[:0]
				for i := range batch {
					logits = append(logits, flat[i*vocab:(i+1)*vocab:(i+1)*vocab])
				}
				rows = logits
			}
		} else {
			logits, err = b.model.ForwardBatch(context.Background(), caches, toks)
		}
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else if picking {
				r.picked, r.logits = picked[i], nil
			} else {
				// Each generation reads its row after the batcher has
				// moved on: a copy into the row it owns.
				r.buf = append(r.buf[:0], logits[i]...)
				r.logits = r.buf
			}
			r.done <- struct{}{}
		}
		clear(caches) // hold no cache past its step
	}
}
