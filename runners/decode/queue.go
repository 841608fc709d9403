package decode

import (
	"container/list"
	"context"
	"errors"
	"sync"
)

// errQueueFull is returned by admission.acquire when the queue is full.
var errQueueFull = errors.New("decode: queue full")

// admission is a FIFO semaphore: at most active requests run at once, at
// most maxWait wait, in arrival order; a request arriving at a full queue is
// refused at once. A waiter whose context ends leaves the queue.
type admission struct {
	mu       sync.Mutex
	active   int // slots
	running  int
	maxWait  int
	waiters  list.List // of chan struct{}
	onChange func(waiting, running int)
}

func newAdmission(active, maxWait int, onChange func(waiting, running int)) *admission {
	if active < 1 {
		active = 1
	}
	return &admission{active: active, maxWait: maxWait, onChange: onChange}
}

func (a *admission) changed() {
	if a.onChange != nil {
		a.onChange(a.waiters.Len(), a.running)
	}
}

// counts returns the numbers waiting and running.
func (a *admission) counts() (waiting, running int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiters.Len(), a.running
}

// acquire waits for a slot. The returned release must be called once.
func (a *admission) acquire(ctx context.Context) (release func(), err error) {
	a.mu.Lock()
	if a.running < a.active && a.waiters.Len() == 0 {
		a.running++
		a.changed()
		a.mu.Unlock()
		return a.releaseOnce(), nil
	}
	if a.waiters.Len() >= a.maxWait {
		a.mu.Unlock()
		return nil, errQueueFull
	}
	ch := make(chan struct{})
	el := a.waiters.PushBack(ch)
	a.changed()
	a.mu.Unlock()
	select {
	case <-ch:
		return a.releaseOnce(), nil
	case <-ctx.Done():
		a.mu.Lock()
		select {
		case <-ch:
			// Granted while we gave up: pass the slot on.
			a.mu.Unlock()
			a.release()
		default:
			a.waiters.Remove(el)
			a.changed()
			a.mu.Unlock()
		}
		return nil, ctx.Err()
	}
}

func (a *admission) releaseOnce() func() {
	var once sync.Once
	return func() { once.Do(a.release) }
}

// release frees a slot, handing it to the first waiter if any.
func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if front := a.waiters.Front(); front != nil {
		a.waiters.Remove(front)
		close(front.Value.(chan struct{}))
		// running stays the same: the slot moves to the waiter.
	} else {
		a.running--
	}
	a.changed()
}
