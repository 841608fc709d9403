package prefill

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// job is a prompt being computed by one request, its leader. Requests for
// the same prompt (same tokens, start_pos and wire dtype) and other
// layers — the other stages of a pipelined decode group, which ask at about
// the same time (PROTOCOL.md §19) — follow it instead of waiting behind it
// for admission and then reading the prefix cache: the leader ships each
// follower, from its cache and on its own goroutine, what it has computed
// so far, then every chunk as it computes it, then the states, so every
// stage's transfer overlaps the one computation.
type job struct {
	tokens []int32
	start  int
	wire   kvwire.DType
	from   int         // the first position it computes (its cached prefix)
	closed bool        // p.mu: no more followers
	joined []*follower // p.mu: registered, not yet served by the leader
	live   []*follower // the leader's goroutine only
}

// follower is one request following a job.
type follower struct {
	pl   *plan
	ch   chan fmsg
	done chan struct{} // closed when the follower's Produce returns
	// The leader's goroutine only:
	next int   // positions shipped so far end here
	gone bool  // the follower stopped reading
	d    *dest // how the leader ships to it
}

// fmsg is what a leader hands a follower: a chunk, a state (arrays set;
// start is its token_end), the end, or the leader's failure.
type fmsg struct {
	i, start, n int
	k, v        []byte
	arrays      [][]byte
	end         bool
	err         error
}

// Follow implements kvwire.Follower: req follows the job computing its
// prompt now, if there is one still taking followers. It is then
// registered, and the Produce the server calls for it next claims it.
func (p *Producer) Follow(req *kvwire.Request) bool {
	pl, err := p.plan(req)
	if err != nil || pl.hdr.TokenStart >= pl.hdr.TokenEnd {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A pipeline stage's jobs hold the prompt from position 0 (the
	// prefix cache's part and the computed one) whatever start and dtype
	// they ship: any request for the prompt can follow them.
	relaxed := p.pipe != nil
	for _, j := range p.jobs {
		if j.closed || !slices.Equal(j.tokens, req.Tokens) || !relaxed && (j.start != req.StartPos || j.wire != pl.wire) {
			continue
		}
		if p.claims == nil {
			p.claims = map[*kvwire.Request]*follower{}
		}
		p.claims[req] = p.joinLocked(j, pl, req.StartPos)
		return true
	}
	return false
}

// joinLocked registers a follower of j shipping pl from start (p.mu held).
func (p *Producer) joinLocked(j *job, pl *plan, start int) *follower {
	f := &follower{pl: pl, ch: make(chan fmsg, 8), done: make(chan struct{}), next: start}
	j.joined = append(j.joined, f)
	return f
}

// notifyLocked wakes the requests waiting for a job (p.mu held).
func (p *Producer) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// claim returns the follower Follow registered for req (nil: none).
func (p *Producer) claim(req *kvwire.Request) *follower {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.claims[req]
	delete(p.claims, req)
	return f
}

// openLocked starts a job for the leader's prompt (p.mu held): it will
// compute from at most what the prefix cache holds now (of at most limit
// positions), and the requests waiting for a computation of the prompt
// (await) follow it from the start.
func (p *Producer) openLocked(tokens []int32, start int, wire kvwire.DType, limit int) *job {
	from := p.cache.peek(tokens, min(limit, len(tokens)-1), p.info.Recurrent != nil)
	j := &job{tokens: tokens, start: start, wire: wire, from: from}
	p.jobs = append(p.jobs, j)
	p.waiters = slices.DeleteFunc(p.waiters, func(w *waiter) bool {
		if !slices.Equal(w.tokens, tokens) {
			return false
		}
		w.got <- p.joinLocked(j, w.pl, w.start) // buffered: never blocks
		return true
	})
	p.notifyLocked()
	return j
}

// leadOrFollow is how a request on stage 0 of a prefill pipeline starts:
// it follows a computation of its prompt running now, whoever started it
// (f set), or opens the job it leads (j set), in one step, so that a Want
// and a request for the same prompt never both compute it.
func (p *Producer) leadOrFollow(tokens []int32, start int, pl *plan, limit int) (*job, *follower) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, j := range p.jobs {
		if !j.closed && slices.Equal(j.tokens, tokens) {
			return nil, p.joinLocked(j, pl, start)
		}
	}
	return p.openLocked(tokens, start, pl.wire, limit), nil
}

// feed brings every follower of j up to position to (cache holds it): the
// live ones from where they are, the newly joined from start. With final,
// the job takes no more followers and each gets its states and the end.
func (p *Producer) feed(ctx context.Context, cache engine.KVCache, j *job, to int, final bool) error {
	for _, f := range j.live {
		if err := p.ship(cache, f.d, f.next, to); err != nil {
			return err
		}
		f.next = max(f.next, to)
	}
	p.mu.Lock()
	joined := j.joined
	j.joined = nil
	j.closed = j.closed || final
	p.mu.Unlock()
	for _, f := range joined {
		f.d = &dest{pl: f.pl,
			chunk: func(i, s, n int, k, v []byte) error { return p.send(ctx, f, fmsg{i: i, start: s, n: n, k: k, v: v}) },
			state: func(i, end int, a [][]byte) error { return p.send(ctx, f, fmsg{i: i, start: end, arrays: a}) }}
		if err := p.ship(cache, f.d, f.next, to); err != nil {
			return err
		}
		f.next = max(f.next, to)
		j.live = append(j.live, f)
	}
	if !final {
		return nil
	}
	for _, f := range j.live {
		if err := p.states(cache, f.d, to); err != nil {
			return err
		}
		if err := p.send(ctx, f, fmsg{end: true}); err != nil {
			return err
		}
	}
	return nil
}

// send hands f one message, waiting while its queue is full (a follower's
// slow link slows the computation, as the leader's own does); a follower
// that stopped reading is skipped from then on.
func (p *Producer) send(ctx context.Context, f *follower, m fmsg) error {
	if f.gone {
		return nil
	}
	select {
	case f.ch <- m:
		return nil
	case <-f.done:
		f.gone = true
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// end retires j when its leader's Produce returns; after a failure every
// follower still reading gets it.
func (p *Producer) end(j *job, err error) {
	p.mu.Lock()
	p.jobs = slices.DeleteFunc(p.jobs, func(x *job) bool { return x == j })
	p.notifyLocked()
	j.closed = true
	joined := j.joined
	j.joined = nil
	p.mu.Unlock()
	if err == nil && len(joined) == 0 {
		return
	}
	if err == nil { // cannot happen: the final feed closed the job
		err = fmt.Errorf("the computation ended before serving this request")
	}
	for _, f := range append(j.live, joined...) {
		if f.gone {
			continue
		}
		select {
		case f.ch <- fmsg{err: err}:
		case <-f.done:
		}
	}
}

// follow serves a request that follows a job: the header (unless sent
// already), then what the leader hands it.
func (p *Producer) follow(ctx context.Context, req *kvwire.Request, e *kvwire.Emitter, f *follower, t0 time.Time, hdrSent bool) error {
	defer close(f.done)
	if !hdrSent {
		if err := e.Header(f.pl.hdr); err != nil {
			return err
		}
	}
	var sent int64
	for {
		select {
		case m := <-f.ch:
			switch {
			case m.err != nil:
				return fmt.Errorf("%w: the computation this request followed failed: %v", kvwire.ErrRemoteInternal, m.err)
			case m.end:
				d := time.Since(t0)
				p.m.KVBytes.WithLabelValues("prefill").Add(float64(sent))
				p.m.KVDuration.WithLabelValues("prefill").Observe(d.Seconds())
				p.log.Info("prefill served (followed a request computing the same prompt)", "req", req.ID, "tokens", len(req.Tokens),
					"start_pos", req.StartPos, "layers", fmt.Sprintf("%d:%d", f.pl.first, f.pl.last), "kv_heads", fmt.Sprintf("%d:%d", f.pl.h0, f.pl.h1), "bytes", sent,
					"wire_dtype", f.pl.wire.String(), "duration", d)
				return nil
			case m.arrays != nil:
				if err := e.State(m.i, m.start, m.arrays...); err != nil {
					return err
				}
				for _, a := range m.arrays {
					sent += int64(len(a))
				}
			default:
				if err := e.Chunk(m.i, m.start, m.n, m.k, m.v); err != nil {
					return err
				}
				sent += int64(len(m.k) + len(m.v))
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
