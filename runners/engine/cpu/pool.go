package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Worker pool.
//
// The heavy ops split their work over b.threads goroutines: the caller's
// plus threads-1 workers that live as long as the Backend (a cleanup
// attached to the Backend stops them once it is unreachable). A decode step
// of a small model runs a few hundred such ops, each a few microseconds to
// a millisecond long, so neither a goroutine per op nor a closure per op is
// affordable: work is a task, an interface over a value the Backend owns,
// and handing one to a worker allocates nothing. Nobody parks on the hot
// path either: a worker polls for its next job for spinFor after its last
// one, and the caller polls a counter for the workers to finish. Both
// yield between polls, so the cost is a busy core for about a millisecond
// after the last op (measured on 2 cores: two threads went from slower than
// one to 1.3–1.4× one for SmolLM2 decode, and a 128-token prompt from 470
// to 660 tokens/s; docs/BENCHMARKS.md).

// task is one op's work over [0, n): run(lo, hi) does [lo, hi).
type task interface{ run(lo, hi int) }

// funcTask adapts a closure (ops off the hot path; a capturing closure
// passed here is heap-allocated by its caller).
type funcTask func(lo, hi int)

func (f funcTask) run(lo, hi int) { f(lo, hi) }

type job struct {
	t      task
	lo, hi int
}

// pool is the workers' side, kept apart from Backend so that the workers
// do not keep the Backend reachable.
type pool struct {
	jobs []chan job // one per worker, buffered 1
	// pending counts the current run's jobs not yet finished; the caller
	// polls it (yielding) instead of parking on a WaitGroup: waking a
	// parked goroutine takes microseconds, about what a decode step's
	// products take.
	pending atomic.Int32
	mu      sync.Mutex
	// failed is the first panic a worker recovered during the current run.
	failed any
}

// spinFor is how long a worker polls its channel (yielding between polls)
// before it sleeps: consecutive ops of a step follow each other within
// microseconds, a prompt's ops have serial stretches between them of tens
// to hundreds (quantizing activations, allocating outputs), and a worker
// that sleeps answers tens of microseconds late at best — on two cores
// that made two threads slower than one for a 128-token prompt.
const spinFor = 1000 * time.Microsecond

// pollFirst and pollLast bound the sleeps between a worker's polls once
// spinning gave up (doubling: 20, 40, … 640 µs, about 1.3 ms in all).
const (
	pollFirst = 20 * time.Microsecond
	pollLast  = 640 * time.Microsecond
)

func newPool(workers int) *pool {
	p := &pool{jobs: make([]chan job, workers)}
	for i := range p.jobs {
		ch := make(chan job, 1)
		p.jobs[i] = ch
		go p.work(ch)
	}
	return p
}

func (p *pool) work(ch chan job) {
	// Declared once: select takes their address, which moves them to the
	// heap (once per worker here, not once per job).
	var j job
	var ok bool
	for {
		got := false
		for start, i := time.Now(), 0; ; i++ {
			select {
			case j, ok = <-ch:
				got = true
			default:
				runtime.Gosched()
				if i%32 != 31 || time.Since(start) < spinFor {
					continue
				}
			}
			break
		}
		// Then poll at growing intervals for about a millisecond, so the
		// short pauses between a step's ops and between steps do not park
		// the worker on the channel: parking takes a runtime waiter record
		// that is sometimes freshly allocated, and a decode step must not
		// allocate.
		for d := pollFirst; !got && d <= pollLast; d *= 2 {
			time.Sleep(d)
			select {
			case j, ok = <-ch:
				got = true
			default:
			}
		}
		if !got {
			j, ok = <-ch // idle: park
		}
		if !ok {
			return
		}
		p.runJob(j)
		j = job{}
	}
}

// runJob is not inlined: inside work's loop its defers would become
// heap-allocated loop defers.
//
//go:noinline
func (p *pool) runJob(j job) {
	defer p.pending.Add(-1)
	defer func() {
		if r := recover(); r != nil {
			p.mu.Lock()
			if p.failed == nil {
				p.failed = r
			}
			p.mu.Unlock()
		}
	}()
	j.t.run(j.lo, j.hi)
}

// wait returns once the current run's jobs are done.
func (p *pool) wait() {
	for p.pending.Load() != 0 {
		runtime.Gosched()
	}
}

func (p *pool) close() {
	for _, ch := range p.jobs {
		close(ch)
	}
}

// run splits [0, n) into at most b.threads contiguous ranges of at least
// minChunk, runs the first on the calling goroutine and the rest on the
// workers, and returns when all are done. A panic on a worker is re-raised
// here, on the caller's goroutine, where the engine recovers it into an
// error.
func (b *Backend) run(n, minChunk int, t task) {
	if n <= 0 {
		return
	}
	workers, per := b.split(n, minChunk)
	if workers <= 1 || b.pool == nil && !b.startPool() {
		t.run(0, n)
		return
	}
	p := b.pool
	p.pending.Store(int32((n - 1) / per))
	k := 0
	for lo := per; lo < n; lo += per {
		p.jobs[k] <- job{t: t, lo: lo, hi: min(lo+per, n)}
		k++
	}
	func() {
		// Wait for the workers even if the caller's share panics: they
		// use the task's buffers.
		defer p.wait()
		t.run(0, min(per, n))
	}()
	if p.failed != nil {
		r := p.failed
		p.failed = nil
		panic(r)
	}
}

// split is how run divides [0, n): into at most workers ranges
// [k·per, (k+1)·per), each at least minChunk long.
func (b *Backend) split(n, minChunk int) (workers, per int) {
	workers = max(b.threads, 1)
	minChunk = max(minChunk, 1)
	if w := (n + minChunk - 1) / minChunk; w < workers {
		workers = w
	}
	workers = max(workers, 1)
	return workers, (n + workers - 1) / workers
}

// startPool starts the workers on first use; false when there are none.
func (b *Backend) startPool() bool {
	if b.threads <= 1 {
		return false
	}
	b.pool = newPool(b.threads - 1)
	runtime.AddCleanup(b, func(p *pool) { p.close() }, b.pool)
	return true
}

// parallel runs fn over [0, n) as run does (see funcTask).
func (b *Backend) parallel(n, minChunk int, fn func(lo, hi int)) {
	b.run(n, minChunk, funcTask(fn))
}
