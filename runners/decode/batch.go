package decode

import (
	"context"
	"errors"
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
}

type stepReq struct {
	cache  engine.KVCache
	tok    int32
	logits []float32
	err    error
	done   chan struct{}
}

func newBatcher(m Model, maxBatch int, gather time.Duration) *batcher {
	return &batcher{model: m, gather: gather, reqs: make(chan *stepReq, maxBatch), stopped: make(chan struct{})}
}

// join registers a generation; the returned leave must be called once when
// it stops stepping.
func (b *batcher) join() (leave func()) {
	b.mu.Lock()
	b.joined++
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.joined--
			b.mu.Unlock()
		})
	}
}

func (b *batcher) members() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.joined
}

// step appends tok to cache as part of the next batch and returns the
// logits after it. It always waits for the batch it joined: the cache is
// in use until then.
func (b *batcher) step(cache engine.KVCache, tok int32) ([]float32, error) {
	r := &stepReq{cache: cache, tok: tok, done: make(chan struct{})}
	select {
	case b.reqs <- r:
	case <-b.stopped:
		return nil, errBatcherStopped
	}
	select {
	case <-r.done:
		return r.logits, r.err
	case <-b.stopped:
		// run has returned; it finishes every batch it starts, so r was
		// never taken.
		return nil, errBatcherStopped
	}
}

var errBatcherStopped = errors.New("decode: server closed")

// run serves steps until ctx ends.
func (b *batcher) run(ctx context.Context) {
	defer close(b.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*stepReq, 0, cap(b.reqs))
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
		caches := make([]engine.KVCache, len(batch))
		toks := make([]int32, len(batch))
		for i, r := range batch {
			caches[i], toks[i] = r.cache, r.tok
		}
		if b.sizes != nil {
			b.sizes(len(batch))
		}
		logits, err := b.model.ForwardBatch(context.Background(), caches, toks)
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else {
				r.logits = logits[i]
			}
			close(r.done)
		}
	}
}
