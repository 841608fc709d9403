package decode

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func TestAdmissionFIFOAndBound(t *testing.T) {
	a := newAdmission(1, 2, nil)
	ctx := context.Background()
	rel0, err := a.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	started := make(chan struct{})
	for i := 1; i <= 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := a.acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			rel()
		}()
		// Wait until waiter i is queued before starting the next.
		for {
			if w, _ := a.counts(); w == i {
				break
			}
		}
	}
	close(started)
	if _, err := a.acquire(ctx); !errors.Is(err, errQueueFull) {
		t.Fatalf("third waiter: %v, want errQueueFull", err)
	}
	rel0()
	rel0() // idempotent
	wg.Wait()
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Fatalf("order %v, want [1 2]", order)
	}
	if w, r := a.counts(); w != 0 || r != 0 {
		t.Fatalf("counts %d %d after all released", w, r)
	}
}

func TestAdmissionCancelWhileWaiting(t *testing.T) {
	a := newAdmission(1, 4, nil)
	rel, _ := a.acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := a.acquire(ctx)
		done <- err
	}()
	for {
		if w, _ := a.counts(); w == 1 {
			break
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if w, r := a.counts(); w != 0 || r != 1 {
		t.Fatalf("counts %d %d", w, r)
	}
	rel()
	if w, r := a.counts(); w != 0 || r != 0 {
		t.Fatalf("counts %d %d", w, r)
	}
}
