package kvwire

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// stalledListener accepts TCP connections in the kernel (the backlog) but
// never answers: what a SIGSTOPped or hung prefill runner looks like.
func stalledListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// TestStalledServerFailsAtTheHello: a server that accepts but never
// answers costs one ConnectTimeout, reported as ErrTimeout naming the hello,
// not the idle timeout (which is set far longer here).
func TestStalledServerFailsAtTheHello(t *testing.T) {
	m := smallModel()
	addr := stalledListener(t)
	c := NewClient(ClientConfig{ConnectTimeout: 150 * time.Millisecond, IdleTimeout: time.Hour})
	sink := &recordSink{}
	t0 := time.Now()
	_, err := c.Fetch(context.Background(), addr, &Request{ID: "r", Model: "m", Fingerprint: m.fp, Tokens: tokens(40)}, m.expect(), sink)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "hello") {
		t.Fatalf("err = %v, want ErrTimeout at the hello", err)
	}
	if sink.begins != 0 || sink.rollbacks != 1 {
		t.Fatalf("sink begins %d rollbacks %d", sink.begins, sink.rollbacks)
	}
	t.Logf("stalled server refused after %v: %v", time.Since(t0), err)
}

// TestPing: a live server answers the ping (and logs nothing about a
// failed handshake); a stalled one times out; a closed port is ErrClosed;
// a server that requires a secret refuses a client without one.
func TestPing(t *testing.T) {
	m := smallModel()
	live, srv := startServer(t, ServerConfig{Producer: m.producer()})
	authed, _ := startServer(t, ServerConfig{Producer: m.producer(), Secret: []byte("s")})
	refused := func() string {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		a := l.Addr().String()
		l.Close()
		return a
	}()
	c := NewClient(ClientConfig{ConnectTimeout: 150 * time.Millisecond})
	for _, tc := range []struct {
		name, addr string
		client     *Client
		want       error
	}{
		{"live", live, c, nil},
		{"live with secret", authed, NewClient(ClientConfig{Secret: []byte("s")}), nil},
		{"stalled", stalledListener(t), c, ErrTimeout},
		{"refused", refused, c, ErrClosed},
		{"secret required", authed, c, ErrAuth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.client.Ping(context.Background(), tc.addr)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Ping = %v, want %v", err, tc.want)
			}
		})
	}
	// The pings left the server serving: a real fetch still works.
	sink := &recordSink{}
	if _, err := c.Fetch(context.Background(), live, &Request{ID: "r", Model: "m", Fingerprint: m.fp, Tokens: tokens(40)}, m.expect(), sink); err != nil {
		t.Fatalf("fetch after pings: %v", err)
	}
	// The server releases the fetch's slot just after the client has its
	// Done; nothing the pings did may stay admitted.
	waitIdle(t, srv)
}

// TestKeepaliveKeepsAQueuedShortIdleClient: a client with a short idle
// deadline waits in a server's queue behind a long request for longer than
// that deadline and is kept alive by Keepalives (every KeepaliveEvery), so a
// busy server is not mistaken for a stalled one; MaxGap reports the longest
// silence seen.
//
// The idle deadline is what the test is about, so time must pass: the long
// request is held until the queued one has been waiting (as the server's
// Load says) for twice the idle deadline, which without Keepalives would
// have ended it. The deadline is 20 Keepalive intervals, so a process that a
// loaded machine (-race, busy CPUs) leaves unscheduled for a few hundred ms
// still sees a Keepalive in time.
func TestKeepaliveKeepsAQueuedShortIdleClient(t *testing.T) {
	const keepEvery, idle = 50 * time.Millisecond, time.Second
	m := smallModel()
	release := make(chan struct{})
	first := make(chan struct{}, 1)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		if r.ID == "long" {
			first <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return m.producer().Produce(ctx, r, e)
	})
	addr, srv := startServer(t, ServerConfig{Producer: p, MaxActive: 1, KeepaliveEvery: keepEvery})
	c := NewClient(ClientConfig{})
	longDone := make(chan error, 1)
	go func() {
		_, err := c.Fetch(context.Background(), addr, &Request{ID: "long", Model: "m", Fingerprint: m.fp, Tokens: tokens(40)}, m.expect(), &recordSink{})
		longDone <- err
	}()
	<-first
	queuedDone := make(chan struct{})
	defer close(queuedDone)
	go func() { // no t.Fatal here: the queued fetch's result says what went wrong
		defer close(release)
		for srv.Load().Waiting == 0 {
			select {
			case <-queuedDone:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		select {
		case <-queuedDone:
		case <-time.After(2 * idle):
		}
	}()
	st, err := c.FetchIdle(context.Background(), addr, idle,
		&Request{ID: "queued", Model: "m", Fingerprint: m.fp, Tokens: tokens(40)}, m.expect(), &recordSink{})
	if err != nil {
		t.Fatalf("queued fetch with a %v idle deadline: %v", idle, err)
	}
	if err := <-longDone; err != nil {
		t.Fatalf("long fetch: %v", err)
	}
	if st.FirstHeader < 2*idle {
		t.Fatalf("the queued fetch had its header after %v, want at least %v (queued past its idle deadline)", st.FirstHeader, 2*idle)
	}
	if st.MaxGap <= 0 || st.MaxGap >= idle {
		t.Fatalf("MaxGap = %v, want in (0, %v)", st.MaxGap, idle)
	}
	t.Logf("max gap while queued: %v", st.MaxGap)
}

// TestDoAllowed: endpoints allow refuses are not tried; none allowed is
// ErrNoEndpoint without any try.
func TestDoAllowed(t *testing.T) {
	s := NewSelector([]Endpoint{{Addr: "a:1", Link: LinkEthernet}, {Addr: "b:1", Link: LinkEthernet}})
	var tried []string
	try := func(ctx context.Context, addr string) error { tried = append(tried, addr); return ErrClosed }
	s.DoAllowed(context.Background(), func(a string) bool { return a != "a:1" }, try)
	if len(tried) != 1 || tried[0] != "b:1" {
		t.Fatalf("tried %v, want [b:1]", tried)
	}
	tried = nil
	if err := s.DoAllowed(context.Background(), func(string) bool { return false }, try); !errors.Is(err, ErrNoEndpoint) || len(tried) != 0 {
		t.Fatalf("none allowed: err %v, tried %v", err, tried)
	}
}

// TestStuckComputeAfterHeader: the server's process answers (Keepalives
// keep coming) but its producer hangs after the header, as on a GPU hang:
// the client gives up after ProgressTimeout with ErrTimeout.
func TestStuckComputeAfterHeader(t *testing.T) {
	m := smallModel()
	release := make(chan struct{})
	defer close(release)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		if err := e.Header(m.header(r)); err != nil {
			return err
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	addr, _ := startServer(t, ServerConfig{Producer: p, KeepaliveEvery: 20 * time.Millisecond})
	c := NewClient(ClientConfig{ProgressTimeout: 200 * time.Millisecond})
	sink := &recordSink{}
	_, err := c.Fetch(context.Background(), addr, &Request{ID: "r", Model: "m", Fingerprint: m.fp, Tokens: tokens(40)}, m.expect(), sink)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "only keepalives") {
		t.Fatalf("err = %v, want ErrTimeout for stuck compute", err)
	}
	if sink.rollbacks != 1 {
		t.Fatalf("rollbacks %d", sink.rollbacks)
	}
}

// TestClientSendsContextDeadline: the deadline a server is sent is the
// request's own, or what is left of the client's context plus a second
// when that is sooner or the request names none; with neither the server's
// default applies (0 on the wire).
func TestClientSendsContextDeadline(t *testing.T) {
	got := make(chan time.Duration, 1)
	p := ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		got <- r.Deadline
		return errors.New("recorded")
	})
	addr, _ := startServer(t, ServerConfig{Producer: p})
	c := NewClient(ClientConfig{})
	for _, tc := range []struct {
		name     string
		req, ctx time.Duration // 0: none
		lo, hi   time.Duration // what the server must see
	}{
		{"neither", 0, 0, 0, 0},
		{"context only", 0, time.Minute, 50 * time.Second, time.Minute + time.Second},
		{"request sooner", 2 * time.Second, time.Hour, 2 * time.Second, 2 * time.Second},
		{"context sooner", time.Hour, time.Minute, 50 * time.Second, time.Minute + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			req := &Request{Tokens: tokens(40), Deadline: tc.req}
			if _, err := c.Fetch(ctx, addr, req, nil, &recordSink{}); !errors.Is(err, ErrRemoteInternal) {
				t.Fatalf("fetch: %v, want the producer's error", err)
			}
			if d := <-got; d < tc.lo || d > tc.hi {
				t.Fatalf("the server was sent a deadline of %v, want [%v, %v]", d, tc.lo, tc.hi)
			}
			if req.Deadline != tc.req {
				t.Fatalf("Fetch changed the caller's request: deadline %v", req.Deadline)
			}
		})
	}
}
