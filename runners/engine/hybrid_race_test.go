package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
)

// TestHybridCacheTruncateBesideSteps: a decode runner's request goroutines
// truncate and free Gated DeltaNet (qwen3_next) caches — prefix reuse,
// speculation's rollback, a finished request — while the batcher steps
// other caches of the same model. The hybrid cache's truncation makes and
// frees backend arrays (a fresh recurrent state, a snapshot restored), so
// it must hold the model's lock as a step does: under -race this test
// fails without it. Each goroutine's logits equal a serial run's.
func TestHybridCacheTruncateBesideSteps(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("testdata", "reference", "qwen3_next"), b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := []int32{1, 5, 9, 14, 3, 7, 22, 8, 4, 11, 6, 2}
	next := []int32{17, 12, 19}
	// run is one request's life: a prompt, a few decode steps, a rollback
	// to the prompt's end (a reused prefix), the steps again, a reset.
	run := func(c engine.KVCache) ([]float32, error) {
		if _, err := m.Forward(ctx, c, prompt); err != nil {
			return nil, err
		}
		var last []float32
		for range 2 {
			for _, tok := range next {
				l, err := m.Forward(ctx, c, []int32{tok})
				if err != nil {
					return nil, err
				}
				last = slices.Clone(l)
			}
			c.Truncate(len(prompt))
			if c.Len() != len(prompt) {
				return nil, fmt.Errorf("truncated to %d, Len %d", len(prompt), c.Len())
			}
		}
		c.Truncate(0)
		return last, nil
	}
	c := m.NewCache()
	want, err := run(c)
	c.Free()
	if err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 3, 4
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := m.NewCache()
			defer c.Free()
			for r := range rounds {
				got, err := run(c)
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
					return
				}
				if !slices.Equal(got, want) {
					errs <- fmt.Errorf("worker %d round %d: logits differ from a serial run's", w, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
