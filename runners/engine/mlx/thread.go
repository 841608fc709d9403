package mlx

import (
	"errors"
	"runtime"
	"sync"
)

// errThreadStopped is the panic value of work sent to a stopped thread.
var errThreadStopped = errors.New("mlx: backend is closed")

// queueLen is how many posted calls may wait for the thread.
const queueLen = 4096

// osThread runs functions on one goroutine locked to one OS thread for its
// whole life: MLX streams (and mlx-c's error state) belong to a thread, so
// every MLX call of a backend goes through its osThread, in the order the
// calls were made.
//
// post queues f and returns at once: building MLX's lazy graph needs no
// answer, so a forward pass costs a few round trips (eval, read back), not
// one per op. do runs f and waits. A panic in posted work is kept; later
// posted work is skipped until the next do, which re-raises that first
// panic instead of running its own f (so an error surfaces at the next
// synchronous call, such as Eval). A panic in do's own f is re-raised too.
type osThread struct {
	mu     sync.Mutex // guards closed and serializes do
	closed bool
	work   chan func()
	reply  chan any
	failed any // owned by the thread: first panic of posted work since the last do
}

func startThread() *osThread {
	t := &osThread{work: make(chan func(), queueLen), reply: make(chan any)}
	go t.loop()
	return t
}

// loop never unlocks the OS thread: when it returns (stop), the thread
// exits with whatever per-thread state MLX kept.
func (t *osThread) loop() {
	runtime.LockOSThread()
	for f := range t.work {
		f()
	}
}

func runRecover(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// post queues f to run on the thread after everything queued before it.
func (t *osThread) post(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		panic(errThreadStopped)
	}
	t.work <- func() {
		if t.failed != nil {
			return
		}
		if p := runRecover(f); p != nil {
			t.failed = p
		}
	}
}

// do runs f on the thread after everything queued before it and waits. It
// must not be called from work running on the thread.
func (t *osThread) do(f func()) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		panic(errThreadStopped)
	}
	t.work <- func() {
		if p := t.failed; p != nil {
			t.failed = nil
			t.reply <- p
			return
		}
		t.reply <- runRecover(f)
	}
	p := <-t.reply
	t.mu.Unlock()
	if p != nil {
		panic(p)
	}
}

// stop ends the thread after the queued work; later calls panic with
// errThreadStopped.
func (t *osThread) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.work)
	}
}
