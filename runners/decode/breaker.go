package decode

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// BreakerState is a prefill endpoint's circuit state.
type BreakerState string

// Breaker states.
const (
	// Closed: requests go to the endpoint.
	Closed BreakerState = "closed"
	// Open: the endpoint timed out or could not be reached; requests skip
	// it (no request pays its timeout again) until a probe gets an answer.
	Open BreakerState = "open"
)

// EndpointHealth is the breaker's view of one prefill endpoint.
type EndpointHealth struct {
	Addr  string       `json:"addr"`
	State BreakerState `json:"state"`
	// Since is when the state last changed.
	Since time.Time `json:"since"`
	// Trips counts closed → open transitions.
	Trips     int    `json:"trips"`
	LastError string `json:"last_error,omitempty"`
	// Gap is the moving average of the longest silence of healthy fetches
	// (kvwire.Stats.MaxGap): the chunk compute time, or the server's
	// keepalive period when a chunk takes longer.
	Gap time.Duration `json:"gap_ns,omitempty"`
	// Idle is the idle deadline the next fetch from it gets.
	Idle time.Duration `json:"idle_ns"`
}

// BreakerOptions tune a Breaker; zero fields take the defaults shown.
type BreakerOptions struct {
	// IdleFloor is the shortest idle deadline between frames (3 s: a
	// healthy server sends a Keepalive every second at most).
	IdleFloor time.Duration
	// IdleCeil is the longest (30 s).
	IdleCeil time.Duration
	// IdleFactor multiplies the measured gap (4).
	IdleFactor int
	Now        func() time.Time
	// OnChange is called after each state change, outside the lock.
	OnChange func(addr string, s BreakerState)
}

// Breaker is a circuit breaker per prefill endpoint. It is a small value
// with an injected clock and no goroutines or sockets of its own: callers
// report each fetch (Report) and each probe (Probed); a timeout or a
// connection failure opens the endpoint's circuit, a probe that gets an
// answer closes it. A busy answer, a mismatch, a corrupt stream or the
// caller's own cancellation say the endpoint is alive and never open it.
// It also sizes each fetch's idle deadline from the endpoint's measured
// frame gaps. Safe for concurrent use.
type Breaker struct {
	o   BreakerOptions
	mu  sync.Mutex
	eps map[string]*EndpointHealth
	ord []string
}

// NewBreaker returns a breaker with every endpoint closed.
func NewBreaker(addrs []string, o BreakerOptions) *Breaker {
	if o.IdleFloor <= 0 {
		o.IdleFloor = 3 * time.Second
	}
	if o.IdleCeil <= 0 {
		o.IdleCeil = 30 * time.Second
	}
	o.IdleCeil = max(o.IdleCeil, o.IdleFloor)
	if o.IdleFactor <= 0 {
		o.IdleFactor = 4
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	b := &Breaker{o: o, eps: map[string]*EndpointHealth{}}
	now := o.Now()
	for _, a := range addrs {
		if _, dup := b.eps[a]; dup {
			continue
		}
		b.eps[a] = &EndpointHealth{Addr: a, State: Closed, Since: now}
		b.ord = append(b.ord, a)
	}
	return b
}

// Trips reports whether err says the endpoint is not answering: a timeout
// or a connection that could not be made or broke. Not the caller's
// cancellation, and not a busy, mismatch, auth or corrupt answer.
func Trips(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return errors.Is(err, kvwire.ErrTimeout) || errors.Is(err, kvwire.ErrClosed)
}

// Allow reports whether requests may go to addr (its circuit is closed).
// Unknown endpoints are allowed.
func (b *Breaker) Allow(addr string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.eps[addr]
	return e == nil || e.State == Closed
}

// Idle is the idle deadline for the next fetch from addr: IdleFactor times
// the measured gap, within [IdleFloor, IdleCeil]; IdleFloor before any
// measurement.
func (b *Breaker) Idle(addr string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.idleLocked(b.eps[addr])
}

func (b *Breaker) idleLocked(e *EndpointHealth) time.Duration {
	if e == nil || e.Gap == 0 {
		return b.o.IdleFloor
	}
	return min(max(time.Duration(b.o.IdleFactor)*e.Gap, b.o.IdleFloor), b.o.IdleCeil)
}

// Report records the outcome of one fetch from addr. A success measures
// the gap; a tripping error opens the circuit.
func (b *Breaker) Report(addr string, st kvwire.Stats, err error) {
	b.mu.Lock()
	e := b.eps[addr]
	if e == nil {
		b.mu.Unlock()
		return
	}
	changed := false
	switch {
	case err == nil:
		if st.MaxGap > 0 {
			if e.Gap == 0 {
				e.Gap = st.MaxGap
			} else {
				e.Gap = (3*e.Gap + st.MaxGap) / 4
			}
		}
		e.LastError = ""
		changed = b.setLocked(e, Closed)
	case Trips(err):
		e.LastError = err.Error()
		changed = b.setLocked(e, Open)
	}
	state := e.State
	b.mu.Unlock()
	if changed && b.o.OnChange != nil {
		b.o.OnChange(addr, state)
	}
}

// Probed records a probe of addr: an answer closes the circuit. A failed
// probe keeps it open (and records the error).
func (b *Breaker) Probed(addr string, err error) {
	b.mu.Lock()
	e := b.eps[addr]
	if e == nil {
		b.mu.Unlock()
		return
	}
	changed := false
	if err == nil {
		changed = b.setLocked(e, Closed)
	} else {
		e.LastError = err.Error()
	}
	b.mu.Unlock()
	if changed && b.o.OnChange != nil {
		b.o.OnChange(addr, Closed)
	}
}

func (b *Breaker) setLocked(e *EndpointHealth, s BreakerState) bool {
	if e.State == s {
		return false
	}
	if s == Open {
		e.Trips++
	}
	e.State, e.Since = s, b.o.Now()
	return true
}

// OpenEndpoints lists the endpoints whose circuit is open, in the order
// given to NewBreaker.
func (b *Breaker) OpenEndpoints() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, a := range b.ord {
		if b.eps[a].State == Open {
			out = append(out, a)
		}
	}
	return out
}

// Status returns every endpoint's health, in the order given.
func (b *Breaker) Status() []EndpointHealth {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]EndpointHealth, 0, len(b.ord))
	for _, a := range b.ord {
		e := *b.eps[a]
		e.Idle = b.idleLocked(&e)
		out = append(out, e)
	}
	return out
}

// Endpoints returns the addresses, in the order given.
func (b *Breaker) Endpoints() []string {
	return slices.Clone(b.ord)
}
