package decode

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
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

// TestBatcherStepAllocatesNothing: once warm, a decode step through the
// batcher (the runner's continuous batching: request handoff, one
// ForwardBatchInto on the cpu backend, each generation's row copied into
// the logits it owns) allocates nothing, alone and for three generations
// stepping together; and each generation gets the logits a plain Forward
// gives, bit for bit.
func TestBatcherStepAllocatesNothing(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen3", Seed: 9}); err != nil {
		t.Fatal(err)
	}
	be, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, be, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := newBatcher(m, 4, time.Second)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go b.run(bctx)

	const gens = 3
	prompt := []int32{5, 6, 7, 8, 9, 10}
	mems := make([]*member, gens)
	caches := make([]engine.KVCache, gens)
	for g := range mems {
		caches[g] = m.NewCache()
		if err := m.Prefill(ctx, caches[g], prompt[:len(prompt)-g], 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	// One generation alone: equal to Forward, then no allocation.
	ref := m.NewCache()
	if err := m.Prefill(ctx, ref, prompt, 0, nil); err != nil {
		t.Fatal(err)
	}
	want, err := m.Forward(ctx, ref, []int32{3})
	if err != nil {
		t.Fatal(err)
	}
	mems[0] = b.joinMember()
	got, err := mems[0].step(caches[0], 3)
	if err != nil || !slices.Equal(got.logits, want) {
		t.Fatalf("batched step: %v, logits equal to Forward's: %v", err, slices.Equal(got.logits, want))
	}
	n0 := caches[0].Len()
	one := func() {
		if caches[0].Len() > n0+40 {
			caches[0].Truncate(n0)
		}
		if _, err := mems[0].step(caches[0], 4); err != nil {
			t.Fatal(err)
		}
	}
	one()
	if a := testing.AllocsPerRun(20, one); a != 0 {
		t.Errorf("one generation: %v allocations per step, want 0", a)
	}

	// Three at once, each on its own goroutine, released together.
	for g := 1; g < gens; g++ {
		mems[g] = b.joinMember()
	}
	start, done := make(chan struct{}), make(chan error, gens)
	for g := range gens {
		go func() {
			n := caches[g].Len()
			for range start {
				if caches[g].Len() > n+40 {
					caches[g].Truncate(n)
				}
				_, err := mems[g].step(caches[g], int32(4+g))
				done <- err
			}
		}()
	}
	defer close(start)
	three := func() {
		for range gens {
			start <- struct{}{}
		}
		for range gens {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 50 { // every batch composition the gather makes, once
		three()
	}
	if a := testing.AllocsPerRun(20, three); a != 0 {
		t.Errorf("three generations: %v allocations per step, want 0", a)
	}
	for _, mb := range mems {
		mb.leave()
	}
}
