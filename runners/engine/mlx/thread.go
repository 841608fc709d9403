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
	work   chan threadCall
	reply  chan any
	failed any // owned by the thread: first panic of posted work since the last do
}

// threadCall is one queued function; wait marks do's (the caller waits on
// reply). A value, not a wrapping closure: posting an op allocates
// nothing beyond the op's own closure.
type threadCall struct {
	f    func()
	wait bool
	op   opRunner // an op (postOp) instead of f
}

// opRunner is a queued op: the backend's placeholder array, which runs its
// op and takes over the result (backend.go).
type opRunner interface{ runOp() }

func startThread() *osThread {
	t := &osThread{work: make(chan threadCall, queueLen), reply: make(chan any)}
	go t.loop()
	return t
}

// loop never unlocks the OS thread: when it returns (stop), the thread
// exits with whatever per-thread state MLX kept.
func (t *osThread) loop() {
	runtime.LockOSThread()
	for c := range t.work {
		switch {
		case c.wait && t.failed != nil:
			p := t.failed
			t.failed = nil
			t.reply <- p
		case c.wait:
			t.reply <- runRecover(c.f)
		case t.failed == nil && c.op != nil:
			if p := t.runOp(c); p != nil {
				t.failed = p
			}
		case t.failed == nil:
			if p := runRecover(c.f); p != nil {
				t.failed = p
			}
		}
	}
}

func (t *osThread) runOp(c threadCall) (p any) {
	defer func() { p = recover() }()
	c.op.runOp()
	return nil
}

func runRecover(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// post queues f to run on the thread after everything queued before it.
func (t *osThread) post(f func()) { t.send(threadCall{f: f}) }

// postOp queues op like post.
func (t *osThread) postOp(op opRunner) { t.send(threadCall{op: op}) }

func (t *osThread) send(c threadCall) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		panic(errThreadStopped)
	}
	t.work <- c
}

// do runs f on the thread after everything queued before it and waits. It
// must not be called from work running on the thread.
func (t *osThread) do(f func()) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		panic(errThreadStopped)
	}
	t.work <- threadCall{f: f, wait: true}
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
