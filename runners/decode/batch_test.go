package decode

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// batchModel is a Model whose ForwardBatch records the batch sizes and
// answers each cache with logits naming its token; other methods are not
// used by the batcher.
type batchModel struct {
	Model
	mu    sync.Mutex
	sizes []int
	fail  error
}

func (m *batchModel) ForwardBatch(_ context.Context, caches []engine.KVCache, toks []int32) ([][]float32, error) {
	m.mu.Lock()
	m.sizes = append(m.sizes, len(caches))
	fail := m.fail
	m.mu.Unlock()
	time.Sleep(time.Millisecond) // a step takes time, as a real one does
	if fail != nil {
		return nil, fail
	}
	out := make([][]float32, len(caches))
	for i := range out {
		out[i] = []float32{float32(toks[i])}
	}
	return out, nil
}

func TestBatcherBatchesJoinedGenerations(t *testing.T) {
	m := &batchModel{}
	// An hour's gather: a batch runs only once all four have stepped.
	b := newBatcher(m, 4, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	go b.run(ctx)
	var wg sync.WaitGroup
	const gens, steps = 4, 20
	// Every generation joins before any steps (else the first to step
	// could run alone while the others are still joining).
	leaves := make([]func(), gens)
	for g := range leaves {
		leaves[g] = b.join()
	}
	for g, leave := range leaves {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer leave()
			for s := range steps {
				tok := int32(g*1000 + s)
				lg, err := b.step(nil, tok)
				if err != nil || len(lg) != 1 || lg[0] != float32(tok) {
					t.Errorf("generation %d step %d: %v %v", g, s, lg, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	m.mu.Lock()
	total, full := 0, 0
	for _, n := range m.sizes {
		total += n
		if n == gens {
			full++
		}
	}
	m.mu.Unlock()
	if total != gens*steps {
		t.Fatalf("%d steps run, want %d", total, gens*steps)
	}
	// Every generation was joined before any stepped, so every batch
	// holds all four.
	if full != steps {
		t.Errorf("batch sizes %v: want %d full batches", m.sizes, steps)
	}
	if b.members() != 0 {
		t.Errorf("%d members after every generation left", b.members())
	}
	cancel()
	<-b.stopped
	if _, err := b.step(nil, 1); !errors.Is(err, errBatcherStopped) {
		t.Errorf("step after stop: %v", err)
	}
}

// A lone generation never waits for a batch (the gather time here is an
// hour: the steps finish only if it is not used), and a member that never
// steps holds the others back only for the gather time.
func TestBatcherDoesNotWaitForIdleMembers(t *testing.T) {
	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not finish", what)
		}
	}
	m := &batchModel{}
	b := newBatcher(m, 4, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.run(ctx)
	leave := b.join()
	within("five lone steps", func() {
		for range 5 {
			if _, err := b.step(nil, 7); err != nil {
				t.Error(err)
			}
		}
	})
	leave()

	b2 := newBatcher(m, 4, 20*time.Millisecond)
	go b2.run(ctx)
	l, idle := b2.join(), b2.join() // idle never steps
	within("a step beside an idle member", func() {
		if _, err := b2.step(nil, 8); err != nil {
			t.Error(err)
		}
	})
	idle()
	l()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.sizes {
		if n != 1 {
			t.Errorf("batch sizes %v, want all 1", m.sizes)
			break
		}
	}
}

func TestBatcherReportsErrorsToEveryMember(t *testing.T) {
	boom := errors.New("boom")
	m := &batchModel{fail: boom}
	b := newBatcher(m, 2, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.run(ctx)
	l1, l2 := b.join(), b.join()
	defer l1()
	defer l2()
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := b.step(nil, 1); errs <- err }()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, boom) {
			t.Errorf("got %v, want boom", err)
		}
	}
}
