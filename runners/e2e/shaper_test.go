package e2e

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// shaper is a rate-limiting TCP proxy: a link of rate bytes/s from the
// target (a prefill runner) back to the client (a decode runner), shared by
// every connection through it as one physical link is. Client → target
// bytes (hellos, requests) pass unshaped. rate 0: unlimited.
type shaper struct {
	l      net.Listener
	target string
	rate   float64
	mu     sync.Mutex
	next   time.Time // when the link is free again
	wg     sync.WaitGroup
}

// shapeSlice is the most bytes sent back at once: the link's burst.
const shapeSlice = 4 << 10

func newShaper(t *testing.T, target string, rate float64) *shaper {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &shaper{l: l, target: target, rate: rate}
	go s.accept()
	t.Cleanup(func() { l.Close(); s.wg.Wait() })
	return s
}

func (s *shaper) addr() string { return s.l.Addr().String() }

func (s *shaper) accept() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
		}()
	}
}

// reserve books n bytes on the link and returns when they have gone.
func (s *shaper) reserve(n int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	// An idle link starts afresh; a sleeper's oversleep (the timer's
	// slack) is made up by the next slices.
	if now.Sub(s.next) > 20*time.Millisecond {
		s.next = now
	}
	s.next = s.next.Add(time.Duration(float64(n) / s.rate * float64(time.Second)))
	return s.next
}

func (s *shaper) handle(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", s.target)
	if err != nil {
		return
	}
	defer u.Close()
	go func() {
		_, _ = io.Copy(u, c)
		u.(*net.TCPConn).CloseWrite()
	}()
	buf := make([]byte, shapeSlice)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			if s.rate > 0 {
				time.Sleep(time.Until(s.reserve(n)))
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestShaper: the shaper delivers at its rate (within a loose bound: the
// machine is shared) and passes every byte.
func TestShaper(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const size = 256 << 10
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write(make([]byte, size))
	}()
	s := newShaper(t, l.Addr().String(), 1<<20) // 1 MiB/s: 256 KiB in 250 ms
	c, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	n, err := io.Copy(io.Discard, c)
	d := time.Since(t0)
	if err != nil || n != size {
		t.Fatalf("copied %d bytes, %v; want %d", n, err, size)
	}
	if d < 200*time.Millisecond {
		t.Fatalf("256 KiB through a 1 MiB/s shaper in %v: not shaped", d)
	}
	t.Logf("256 KiB at 1 MiB/s in %v", d)
}
