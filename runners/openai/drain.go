package openai

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// ErrStopping: the runner is shutting down and will not finish this
// request (503 with Retry-After). Nothing of the answer was sent when a
// client sees it as a status, so the gateway sends the request to another
// runner of the model; a stream already under way ends with it as its
// error event.
var ErrStopping = &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "stopping",
	Message: "the runner is shutting down; retry the request (another runner of the model serves it)"}

// MaxHeaderBytes bounds a request's line and headers at a runner's
// http.Server; past it (plus net/http's 4 KiB of read slack) Go answers
// 431 Request Header Fields Too Large before any handler runs. The same
// bound as the supervisor's gateway (64 KiB): far above real clients'
// headers, far under Go's 1 MiB default, with which a 1 MB header got
// through.
const MaxHeaderBytes = 64 << 10

// DefaultDrainGrace is how long a stopping runner lets the requests it
// has in hand finish before it cuts them: under the supervisor's default
// stop grace (10 s), so a cut request is answered before SIGKILL.
const DefaultDrainGrace = 5 * time.Second

// drainMargin is what a stopping runner keeps of its stop grace after
// draining: a second for the cut handlers to answer, the HTTP server's
// shutdown, the process's exit.
const drainMargin = 3 * time.Second

// DrainGraceFor is the drain of a runner that has stop between SIGTERM
// and SIGKILL (the supervisor's --grace, passed as --stop-grace): all of
// it but drainMargin, so a long generation gets what the operator gave,
// and half of it when that is less than twice the margin. 0 (a runner
// started by hand) is DefaultDrainGrace.
func DrainGraceFor(stop time.Duration) time.Duration {
	switch {
	case stop <= 0:
		return DefaultDrainGrace
	case stop < 2*drainMargin:
		return stop / 2
	}
	return stop - drainMargin
}

// Drain is a runner's shutdown state. Requests served through Handler run
// under Context, not under the process's signal context, so a SIGTERM
// does not cancel them: Stop refuses new work at once (503 ErrStopping;
// /health reports "stopping" through Stopping), lets the requests in hand
// finish for a grace period, and only then cancels the rest with
// ErrStopping as the cause, which the handlers answer as a 503 or, for a
// stream already started, as its error event — never a 500.
type Drain struct {
	ctx context.Context
	cut context.CancelCauseFunc

	mu       sync.Mutex
	stopping bool
	active   int
	idle     chan struct{} // closed when stopping and active reaches 0
	begun    chan struct{} // closed when Stop begins
	stopped  chan struct{} // closed when Stop has finished
	once     sync.Once
}

// NewDrain returns a Drain that is serving.
func NewDrain() *Drain {
	ctx, cut := context.WithCancelCause(context.Background())
	return &Drain{ctx: ctx, cut: cut, idle: make(chan struct{}), begun: make(chan struct{}), stopped: make(chan struct{})}
}

// Context is the base context of every request (http.Server.BaseContext):
// it ends, with cause ErrStopping, only when Stop cuts what is left.
func (d *Drain) Context() context.Context { return d.ctx }

// Stopping reports whether Stop has begun (never, for a nil Drain).
func (d *Drain) Stopping() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopping
}

// Begun is closed when Stop begins: a generator hands it to what waits
// on its behalf (a request still queued for admission has not started
// and is answered ErrStopping at once, for the gateway to send elsewhere).
func (d *Drain) Begun() <-chan struct{} { return d.begun }

// Active is the number of requests in hand.
func (d *Drain) Active() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.active
}

// Handler serves h, counting each POST (generation, tokenize) as a
// request in hand and refusing new ones with ErrStopping once Stop has
// begun. Other methods (GET /v1/models, /metrics) pass through: they end
// at once and a scrape during shutdown is still answered.
func (d *Drain) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		d.mu.Lock()
		if d.stopping {
			d.mu.Unlock()
			WriteError(w, ErrStopping)
			return
		}
		d.active++
		d.mu.Unlock()
		defer d.done()
		h.ServeHTTP(w, r)
	})
}

func (d *Drain) done() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.active--
	if d.stopping && d.active == 0 {
		close(d.idle)
	}
}

// Stop begins stopping, waits up to grace for the requests in hand to
// end, then cuts the rest (their contexts end with cause ErrStopping) and
// waits up to another second for their handlers to answer. It returns
// when that is done; calls after the first wait for the first one.
func (d *Drain) Stop(grace time.Duration) {
	d.once.Do(func() {
		defer close(d.stopped)
		d.mu.Lock()
		d.stopping = true
		if d.active == 0 {
			close(d.idle)
		}
		d.mu.Unlock()
		close(d.begun)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-d.idle:
			d.cut(ErrStopping)
			return
		case <-t.C:
		}
		d.cut(ErrStopping)
		t.Reset(time.Second)
		select {
		case <-d.idle:
		case <-t.C:
		}
	})
	<-d.stopped
}

// Stopped reports whether ctx ended because its runner is stopping (Drain
// cut it), as opposed to its client going away.
func Stopped(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrStopping)
}

// ClientGone reports whether ctx ended because the client went away.
func ClientGone(ctx context.Context) bool { return ctx.Err() != nil && !Stopped(ctx) }

// ErrClientGone is the answer to a request whose client went away: 499
// (nginx's "client closed request"), so that exo_requests_total counts it
// apart from the runner's own failures. Nobody reads its body.
var ErrClientGone = &Error{Status: 499, Type: "invalid_request_error", Code: "client_closed_request",
	Message: "the client closed the request"}

// AsRequestError is asError for a request under ctx: a failure caused by
// the runner stopping is ErrStopping (503), one caused by the client going
// away ErrClientGone (499), not a 500.
func AsRequestError(ctx context.Context, err error) *Error {
	if Stopped(ctx) {
		return ErrStopping
	}
	if ClientGone(ctx) {
		return ErrClientGone
	}
	return asError(err)
}
